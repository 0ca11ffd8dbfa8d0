package fleet

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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

// InForce reports whether c holds its process back: paused, or capped.
func (c ProcessControl) InForce() bool { return c.Paused || c.ClaimCap != nil }

// State says what c does to its process: "paused", "capped at 3 live
// claims", both, or "running without a cap".
func (c ProcessControl) State() string {
	switch {
	case c.Paused && c.ClaimCap != nil:
		return fmt.Sprintf("paused and capped at %d live claims", *c.ClaimCap)
	case c.Paused:
		return "paused"
	case c.ClaimCap != nil:
		return fmt.Sprintf("capped at %d live claims", *c.ClaimCap)
	}
	return "running without a cap"
}

// ReadProcessControls returns every process with controls (every process
// that claimed, or that an operator paused or capped, since its controls
// were last deleted), by name.
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

// ReadProcessControl returns the controls of process, and false if it has
// none.
func ReadProcessControl(ctx context.Context, db *sql.DB, process string) (ProcessControl, bool, error) {
	r, err := model.New(db).ProcessStatusGet(ctx, process)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return ProcessControl{}, false, nil
	case err != nil:
		return ProcessControl{}, false, err
	}
	return processControl(r), true, nil
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
	Process string `json:"process"`
	// Action is pause, resume, cap, uncap or delete (the controls row was
	// deleted: bmdb.Session.DeleteProcessControls).
	Action      string    `json:"action"`
	ClaimCap    *int64    `json:"claim_cap"` // the new cap (cap), or the deleted one (delete)
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
