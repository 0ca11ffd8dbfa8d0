package fleet

import (
	"context"
	"database/sql"
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
func ReadProcessControls(ctx context.Context, db *sql.DB) ([]ProcessControl, error) {
	rows, err := model.New(db).ProcessStatusAll(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]ProcessControl, len(rows))
	for i, r := range rows {
		out[i] = processControl(r)
	}
	return out, nil
}

// processControl is r as a ProcessControl.
func processControl(r model.ProcessStatus) ProcessControl {
	c := ProcessControl{Process: r.Process, Paused: r.Paused, LiveClaims: r.LiveClaims,
		ChangedAt: r.ChangedAt, ChangedBy: r.ChangedBy, Reason: r.Reason}
	if r.ClaimCap.Valid {
		c.ClaimCap = &r.ClaimCap.Int64
	}
	return c
}

// ControlRecord is one change of a process's controls, from
// process_control_history.
type ControlRecord struct {
	Process     string    `json:"process"`
	Action      string    `json:"action"` // pause, resume, cap or uncap
	ClaimCap    *int64    `json:"claim_cap"`
	At          time.Time `json:"at"`
	Actor       string    `json:"actor"`
	RuntimeInfo string    `json:"runtime_info"`
	Reason      string    `json:"reason"`
}

// ReadControlHistory returns the changes of the controls of process (""
// for every process), newest first, at most limit of them.
func ReadControlHistory(ctx context.Context, db *sql.DB, process string, limit int) ([]ControlRecord, error) {
	rows, err := model.New(db).ProcessControlHistory(ctx, model.ProcessControlHistoryParams{Process: process, MaxRows: int32(limit)})
	if err != nil {
		return nil, err
	}
	out := make([]ControlRecord, len(rows))
	for i, r := range rows {
		out[i] = ControlRecord{Process: r.Process, Action: r.Action, At: r.At, Actor: r.Actor, RuntimeInfo: r.RuntimeInfo, Reason: r.Reason}
		if r.ClaimCap.Valid {
			out[i].ClaimCap = &r.ClaimCap.Int64
		}
	}
	return out, nil
}
