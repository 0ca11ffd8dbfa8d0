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

// Stages are the example pipeline's stages, in order.
var Stages = []string{"new", "provided", "agent-started", "os-installed"}

type count struct {
	Name  string `json:"name"`
	Count int64  `json:"count"`
}

// Overview is the data of the / page.
type Overview struct {
	Machines int64                   `json:"machines"`
	Stages   []count                 `json:"stages"`
	Sessions []model.LiveSession     `json:"sessions"`
	Work     []count                 `json:"work"`
	Backoffs []count                 `json:"backoffs"`
	Failures []model.ReadableHistory `json:"recent_failures"`
}

func (h *Handler) overview(ctx context.Context, _ *http.Request) (any, error) {
	var o Overview
	stages, err := h.q.MachineStatusCounts(ctx)
	if err != nil {
		return nil, err
	}
	byStage := map[string]int64{}
	for _, s := range stages {
		byStage[s.Stage] = s.Machines
		o.Machines += s.Machines
	}
	for _, s := range Stages {
		o.Stages = append(o.Stages, count{s, byStage[s]})
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

// Machines is the data of the /machines page.
type Machines struct {
	Filter   MachineFilter         `json:"filter"`
	Machines []model.MachineStatus `json:"machines"`
	// Next is the after= cursor of the next page, empty on the last.
	Next string `json:"next,omitempty"`
}

func (h *Handler) machines(ctx context.Context, r *http.Request) (any, error) {
	q := r.URL.Query()
	f := MachineFilter{Stage: q.Get("stage"), Process: q.Get("process"), Backoff: q.Get("backoff")}
	if f.Stage != "" && !slices.Contains(Stages, f.Stage) {
		return nil, badRequest("stage %q is not one of %s", f.Stage, strings.Join(Stages, ", "))
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
	rows, err := h.q.MachineStatusFilter(ctx, model.MachineStatusFilterParams{
		AfterID:        after,
		Stage:          optional(f.Stage),
		WorkingProcess: optional(f.Process),
		BackoffProcess: optional(f.Backoff),
		RowLimit:       machinesPerPage + 1,
	})
	if err != nil {
		return nil, err
	}
	page := Machines{Filter: f, Machines: rows}
	if len(rows) > machinesPerPage {
		page.Machines = rows[:machinesPerPage]
		page.Next = page.Machines[machinesPerPage-1].MachineID.String()
	}
	return page, nil
}

// Tag is one of a machine's tags.
type Tag struct {
	Name  string    `json:"name"`
	Value string    `json:"value"`
	At    time.Time `json:"at"`
}

// Machine is the data of the /machine/{id} page.
type Machine struct {
	Status   model.MachineStatus              `json:"status"`
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
	m.Status, err = h.q.MachineStatusGet(ctx, id)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, notFound("no machine %s", id)
	}
	if err != nil {
		return nil, err
	}
	tags, err := h.q.MachineTagsGet(ctx, id)
	if err != nil {
		return nil, err
	}
	m.Tags = []Tag{}
	for _, t := range []struct {
		name  string
		value sql.NullString
		at    sql.NullTime
	}{
		{"provided", tags.Provider, tags.ProvidedAt},
		{"agent started", tags.AgentVersion, tags.AgentStartedAt},
		{"OS installed", tags.OsImage, tags.OsInstalledAt},
	} {
		if t.at.Valid {
			m.Tags = append(m.Tags, Tag{t.name, t.value.String, t.at.Time})
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
