package fleet

import (
	"context"
	"database/sql"
	"time"

	"github.com/bmdb-dev/bmdb/model"
)

// The overview's bounds.
const (
	recentFailures  = 20 // the last hour's, newest first
	stuckClaims     = 50
	expiredSessions = 20
)

// Overview is the fleet at a glance: what is stuck, what waits, what each
// process does and may do.
type Overview struct {
	// Now is the database's clock when the overview was read.
	Now      time.Time `json:"now"`
	Machines int64     `json:"machines"`
	// Stages are the application's stages (see ViewStages); null when it
	// defines none.
	Stages []Stage `json:"stages"`
	// Processes say, per process, what is stuck or waiting and whether a
	// live session serves it.
	Processes []ProcessHealth `json:"processes"`
	// Controls are the processes' fleet controls: paused, cap.
	Controls []ProcessControl `json:"controls"`
	// Stuck are claims held by expired sessions, oldest first (at most
	// 50 of them).
	Stuck           []model.CurrentWork `json:"stuck"`
	Sessions        []model.LiveSession `json:"sessions"`
	ExpiredSessions []model.Session     `json:"expired_sessions"`
	// Events are the events per minute over the last hour, of the
	// processes that had any.
	Events    []EventRates            `json:"events_per_minute"`
	ClaimAges ClaimAges               `json:"claim_ages"`
	Failures  []model.ReadableHistory `json:"recent_failures"`
}

// Paused returns the controls of the paused processes.
func (o Overview) Paused() []ProcessControl {
	var p []ProcessControl
	for _, c := range o.Controls {
		if c.Paused {
			p = append(p, c)
		}
	}
	return p
}

// Warnings returns the processes' warnings.
func (o Overview) Warnings() []string {
	var w []string
	for _, p := range o.Processes {
		if p.Warning != "" {
			w = append(w, p.Warning)
		}
	}
	return w
}

// ReadOverview reads the overview.
func ReadOverview(ctx context.Context, db *sql.DB) (Overview, error) {
	q := model.New(db)
	var o Overview
	var err error
	if o.Now, err = Now(ctx, db); err != nil {
		return Overview{}, err
	}
	if o.Machines, err = q.MachineCount(ctx); err != nil {
		return Overview{}, err
	}
	views, err := ReadAppViews(ctx, db)
	if err != nil {
		return Overview{}, err
	}
	if views.Stages {
		if o.Stages, err = readStageCounts(ctx, db); err != nil {
			return Overview{}, err
		}
	}
	if o.Sessions, err = q.LiveSessionsList(ctx); err != nil {
		return Overview{}, err
	}
	if o.ExpiredSessions, err = q.SessionExpiredList(ctx, expiredSessions); err != nil {
		return Overview{}, err
	}
	if o.Stuck, err = q.CurrentWorkExpiredList(ctx, stuckClaims); err != nil {
		return Overview{}, err
	}
	if o.Events, err = readEventRates(ctx, db, o.Now); err != nil {
		return Overview{}, err
	}
	var active []string
	for _, e := range o.Events {
		active = append(active, e.Process)
	}
	if o.Processes, err = readHealth(ctx, db, active, o.Sessions, views); err != nil {
		return Overview{}, err
	}
	if o.ClaimAges, err = readClaimAges(ctx, db); err != nil {
		return Overview{}, err
	}
	if o.Controls, err = ReadProcessControls(ctx, db); err != nil {
		return Overview{}, err
	}
	o.Failures, err = q.ReadableHistoryRecentFailures(ctx, model.ReadableHistoryRecentFailuresParams{
		Since: o.Now.Add(-time.Hour), RowLimit: recentFailures,
	})
	if err != nil {
		return Overview{}, err
	}
	return o, nil
}

// Now returns the database's clock, which every time of the read model is
// read on.
func Now(ctx context.Context, db *sql.DB) (time.Time, error) {
	var now time.Time
	err := db.QueryRowContext(ctx, "SELECT now()").Scan(&now)
	return now, err
}
