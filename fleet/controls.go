package web

import (
	"context"
	"time"

	"github.com/bmdb-dev/bmdb/model"
)

// ProcessControl is a process's fleet controls (see "Fleet controls" in
// bmdb's package doc) and its live claims, as the overview and bmdbctl
// processes show them.
type ProcessControl struct {
	Process    string    `json:"process"`
	Paused     bool      `json:"paused"`
	ClaimCap   *int64    `json:"claim_cap"` // null: no cap
	LiveClaims int64     `json:"live_claims"`
	ChangedAt  time.Time `json:"changed_at"` // of the last pause, resume or cap change
	ChangedBy  string    `json:"changed_by"`
	Reason     string    `json:"reason"`
}

// ReadProcessControls returns every process with controls (every process
// that claimed, or that an operator paused or capped), by name.
func ReadProcessControls(ctx context.Context, q *model.Queries) ([]ProcessControl, error) {
	rows, err := q.ProcessStatusAll(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]ProcessControl, len(rows))
	for i, r := range rows {
		out[i] = ProcessControl{Process: r.Process, Paused: r.Paused, LiveClaims: r.LiveClaims,
			ChangedAt: r.ChangedAt, ChangedBy: r.ChangedBy, Reason: r.Reason}
		if r.ClaimCap.Valid {
			out[i].ClaimCap = &r.ClaimCap.Int64
		}
	}
	return out, nil
}
