package web

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/model"
)

// Page sizes.
const (
	machinesPerPage = 50
	historyPerPage  = 50
	recentFailures  = 20
)

type count struct {
	Name  string `json:"name"`
	Count int64  `json:"count"`
}

// Overview is the data of the / page.
type Overview struct {
	Machines int64 `json:"machines"`
	// Stages are the application's stages (see ViewStages); null when it
	// defines none.
	Stages   []Stage                 `json:"stages"`
	Sessions []model.LiveSession     `json:"sessions"`
	Work     []count                 `json:"work"`
	Backoffs []count                 `json:"backoffs"`
	Failures []model.ReadableHistory `json:"recent_failures"`
}

func (h *Handler) overview(ctx context.Context, _ *http.Request) (any, error) {
	var o Overview
	var err error
	if o.Machines, err = h.q.MachineCount(ctx); err != nil {
		return nil, err
	}
	if o.Stages, err = ReadStages(ctx, h.db); err != nil {
		return nil, err
	}
	if o.Sessions, err = h.q.LiveSessionsList(ctx); err != nil {
		return nil, err
	}
	work, err := h.q.CurrentWorkCountsByProcess(ctx)
	if err != nil {
		return nil, err
	}
	o.Work = []count{}
	for _, c := range work {
		o.Work = append(o.Work, count{c.Process, c.Claims})
	}
	backoffs, err := h.q.ActiveBackoffCountsByProcess(ctx)
	if err != nil {
		return nil, err
	}
	o.Backoffs = []count{}
	for _, c := range backoffs {
		o.Backoffs = append(o.Backoffs, count{c.Process, c.Backoffs})
	}
	since, err := h.dbNow(ctx)
	if err != nil {
		return nil, err
	}
	o.Failures, err = h.q.ReadableHistoryRecentFailures(ctx, model.ReadableHistoryRecentFailuresParams{
		Since: since.Add(-time.Hour), RowLimit: recentFailures,
	})
	return o, err
}

// dbNow returns the database's clock.
func (h *Handler) dbNow(ctx context.Context) (time.Time, error) {
	var now time.Time
	err := h.db.QueryRowContext(ctx, "SELECT now()").Scan(&now)
	return now, err
}

// MachineFilter selects machines on the /machines page.
type MachineFilter struct {
	Stage   string `json:"stage,omitempty"`   // at this stage
	Process string `json:"process,omitempty"` // with live work of this process
	Backoff string `json:"backoff,omitempty"` // in backoff for this process
}

// query returns the filter as URL query parameters.
func (f MachineFilter) query() string {
	var parts []string
	for _, kv := range [][2]string{{"stage", f.Stage}, {"process", f.Process}, {"backoff", f.Backoff}} {
		if kv[1] != "" {
			parts = append(parts, kv[0]+"="+urlQueryEscape(kv[1]))
		}
	}
	return strings.Join(parts, "&")
}

// MachineRow is one machine of a list: its claims and backoffs, and its
// stage if the application defines stages.
type MachineRow struct {
	model.MachineOverview
	Stage string `json:"stage,omitempty"`
}

// Machines is the data of the /machines page.
type Machines struct {
	Filter MachineFilter `json:"filter"`
	// Stages names the application's stages, for the filter links; empty
	// when it defines none.
	Stages   []string     `json:"stages"`
	Machines []MachineRow `json:"machines"`
	// Next is the after= cursor of the next page, empty on the last.
	Next string `json:"next,omitempty"`
}

func (h *Handler) machines(ctx context.Context, r *http.Request) (any, error) {
	q := r.URL.Query()
	f := MachineFilter{Stage: q.Get("stage"), Process: q.Get("process"), Backoff: q.Get("backoff")}
	stages, err := ReadStages(ctx, h.db)
	if err != nil {
		return nil, err
	}
	names := []string{}
	for _, s := range stages {
		names = append(names, s.Name)
	}
	switch {
	case f.Stage != "" && stages == nil:
		return nil, badRequest("stage %q: this database defines no stages (no %s view)", f.Stage, ViewStages)
	case f.Stage != "" && !slices.Contains(names, f.Stage):
		return nil, badRequest("stage %q is not one of %s", f.Stage, strings.Join(names, ", "))
	}
	for _, p := range []string{f.Process, f.Backoff} {
		if p == "" {
			continue
		}
		if err := bmdb.ValidateProcess(p); err != nil {
			return nil, badRequest("process %q: %v", p, err)
		}
	}
	after := uuid.Nil
	if a := q.Get("after"); a != "" {
		var err error
		if after, err = parseID("after: machine", a); err != nil {
			return nil, err
		}
	}
	rows, err := ListMachines(ctx, h.db, f, after, machinesPerPage+1, stages != nil)
	if err != nil {
		return nil, err
	}
	page := Machines{Filter: f, Stages: names, Machines: rows}
	if len(rows) > machinesPerPage {
		page.Machines = rows[:machinesPerPage]
		page.Next = page.Machines[machinesPerPage-1].MachineID.String()
	}
	return page, nil
}

// ListMachines returns up to limit machines after after (in machine_id
// order: keyset pagination) that match f, with their stages if withStages
// (the application defines stages: see ViewStages). f.Stage needs stages.
func ListMachines(ctx context.Context, db *sql.DB, f MachineFilter, after uuid.UUID, limit int, withStages bool) ([]MachineRow, error) {
	var rows []model.MachineOverview
	var err error
	if f.Stage != "" {
		rows, err = machinesAtStage(ctx, db, f, after, limit)
	} else {
		rows, err = model.New(db).MachineOverviewFilter(ctx, model.MachineOverviewFilterParams{
			AfterID:        after,
			WorkingProcess: optional(f.Process),
			BackoffProcess: optional(f.Backoff),
			RowLimit:       int32(limit),
		})
	}
	if err != nil {
		return nil, err
	}
	out := make([]MachineRow, len(rows))
	ids := make([]uuid.UUID, len(rows))
	for i, r := range rows {
		out[i].MachineOverview, ids[i] = r, r.MachineID
	}
	if !withStages || len(rows) == 0 {
		return out, nil
	}
	stages, err := ReadMachineStages(ctx, db, ids)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Stage = stages[out[i].MachineID]
	}
	return out, nil
}

// machinesAtStage is MachineOverviewFilter for machines at f.Stage.
func machinesAtStage(ctx context.Context, db *sql.DB, f MachineFilter, after uuid.UUID, limit int) ([]model.MachineOverview, error) {
	rs, err := db.QueryContext(ctx, machinesAtStageSQL, f.Stage, after, optional(f.Process), false, optional(f.Backoff), limit)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var rows []model.MachineOverview
	for rs.Next() {
		var r model.MachineOverview
		if err := rs.Scan(&r.MachineID, &r.MachineCreatedAt, &r.LiveClaims, &r.ExpiredClaims, &r.ActiveBackoffs); err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, rs.Err()
}

// Machine is the data of the /machine/{id} page.
type Machine struct {
	Status MachineRow `json:"status"`
	// Tags are the application's tags of the machine (see ViewMachineTags);
	// null when it defines none.
	Tags     []Tag                            `json:"tags"`
	Work     []model.CurrentWork              `json:"work"`
	Backoffs []model.WorkBackoffForMachineRow `json:"backoffs"`
	History  []model.ReadableHistory          `json:"history"`
	// Older is the before= cursor of the next (older) history page, empty
	// on the last.
	Older string `json:"older,omitempty"`
}

func (h *Handler) machine(ctx context.Context, r *http.Request) (any, error) {
	id, err := parseID("machine", r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	beforeAt, beforeID, err := parseCursor(r.URL.Query().Get("before"))
	if err != nil {
		return nil, err
	}
	var m Machine
	m.Status.MachineOverview, err = h.q.MachineOverviewGet(ctx, id)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, notFound("no machine %s", id)
	}
	if err != nil {
		return nil, err
	}
	views, err := ReadAppViews(ctx, h.db)
	if err != nil {
		return nil, err
	}
	if views.Stages {
		stages, err := ReadMachineStages(ctx, h.db, []uuid.UUID{id})
		if err != nil {
			return nil, err
		}
		m.Status.Stage = stages[id]
	}
	if views.Tags {
		if m.Tags, err = readTags(ctx, h.db, id); err != nil {
			return nil, err
		}
	}
	if m.Work, err = h.q.CurrentWorkForMachine(ctx, id); err != nil {
		return nil, err
	}
	if m.Backoffs, err = h.q.WorkBackoffForMachine(ctx, id); err != nil {
		return nil, err
	}
	m.History, err = h.q.ReadableHistoryForMachinePage(ctx, model.ReadableHistoryForMachinePageParams{
		MachineID: id, BeforeAt: beforeAt, BeforeID: beforeID, RowLimit: historyPerPage + 1,
	})
	if err != nil {
		return nil, err
	}
	if len(m.History) > historyPerPage {
		m.History = m.History[:historyPerPage]
		last := m.History[historyPerPage-1]
		m.Older = fmt.Sprintf("%d_%d", last.At.UnixNano(), last.ID)
	}
	return m, nil
}

// parseCursor parses a history cursor "UNIXNANO_ID"; "" is the start.
func parseCursor(s string) (time.Time, int64, error) {
	if s == "" {
		return time.Now().Add(100 * 365 * 24 * time.Hour), 0, nil
	}
	ns, id, ok := strings.Cut(s, "_")
	nanos, err1 := strconv.ParseInt(ns, 10, 64)
	rowID, err2 := strconv.ParseInt(id, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return time.Time{}, 0, badRequest("history cursor %q is malformed", s)
	}
	return time.Unix(0, nanos), rowID, nil
}

// Session is the data of the /session/{id} page.
type Session struct {
	ID uuid.UUID `json:"session_id"`
	// Row is nil once the session has expired and been collected; its
	// history remains.
	Row     *model.Session          `json:"session"`
	Alive   bool                    `json:"alive"`
	Work    []model.CurrentWork     `json:"work"`
	History []model.ReadableHistory `json:"history"`
}

func (h *Handler) session(ctx context.Context, r *http.Request) (any, error) {
	id, err := parseID("session", r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	s := Session{ID: id}
	row, err := h.q.SessionGet(ctx, id)
	switch {
	case err == nil:
		s.Row = &row
	case !errors.Is(err, sql.ErrNoRows):
		return nil, err
	}
	if s.Work, err = h.q.CurrentWorkForSession(ctx, id); err != nil {
		return nil, err
	}
	if s.History, err = h.q.ReadableHistoryForSession(ctx, model.ReadableHistoryForSessionParams{SessionID: id, RowLimit: historyPerPage}); err != nil {
		return nil, err
	}
	if s.Row == nil && len(s.History) == 0 {
		return nil, notFound("no session %s", id)
	}
	if s.Row != nil {
		now, err := h.dbNow(ctx)
		if err != nil {
			return nil, err
		}
		s.Alive = s.Row.Deadline.After(now)
	}
	return s, nil
}

func optional(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }
