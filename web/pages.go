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
	stuckClaims     = 50
	expiredSessions = 20
)

// Overview is the data of the / page.
type Overview struct {
	// Now is the database's clock when the page was read.
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
	// stuckClaims of them).
	Stuck           []model.CurrentWork `json:"stuck"`
	Sessions        []model.LiveSession `json:"sessions"`
	ExpiredSessions []model.Session     `json:"expired_sessions"`
	// Events are the plotted events per minute over the last hour.
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

func (h *Handler) overview(ctx context.Context, _ *http.Request) (any, error) {
	var o Overview
	var err error
	if o.Now, err = h.dbNow(ctx); err != nil {
		return nil, err
	}
	if o.Machines, err = h.q.MachineCount(ctx); err != nil {
		return nil, err
	}
	views, err := ReadAppViews(ctx, h.db)
	if err != nil {
		return nil, err
	}
	if o.Stages, err = ReadStages(ctx, h.db); err != nil {
		return nil, err
	}
	if o.Sessions, err = h.q.LiveSessionsList(ctx); err != nil {
		return nil, err
	}
	if o.ExpiredSessions, err = h.q.SessionExpiredList(ctx, expiredSessions); err != nil {
		return nil, err
	}
	if o.Stuck, err = h.q.CurrentWorkExpiredList(ctx, stuckClaims); err != nil {
		return nil, err
	}
	if o.Events, err = h.readEventRates(ctx, o.Now); err != nil {
		return nil, err
	}
	var active []string
	for _, e := range o.Events {
		active = append(active, e.Process)
	}
	if o.Processes, err = h.readHealth(ctx, active, o.Sessions, views); err != nil {
		return nil, err
	}
	if o.ClaimAges, err = h.readClaimAges(ctx); err != nil {
		return nil, err
	}
	if o.Controls, err = ReadProcessControls(ctx, h.q); err != nil {
		return nil, err
	}
	o.Failures, err = h.q.ReadableHistoryRecentFailures(ctx, model.ReadableHistoryRecentFailuresParams{
		Since: o.Now.Add(-time.Hour), RowLimit: recentFailures,
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
	Stage string `json:"stage,omitempty"` // at this stage
	// Process selects machines with a claim of this process, live or held
	// by an expired session.
	Process string `json:"process,omitempty"`
	Backoff string `json:"backoff,omitempty"` // in backoff for this process
	// Sort is "" (by machine id) or SortAge: claimed machines only, by
	// their oldest claim (of Process, if set), oldest first.
	Sort string `json:"sort,omitempty"`
}

// SortAge is the MachineFilter.Sort that lists claimed machines by the age
// of their oldest claim.
const SortAge = "age"

// query returns the filter as URL query parameters.
func (f MachineFilter) query() string {
	var parts []string
	for _, kv := range [][2]string{{"stage", f.Stage}, {"process", f.Process}, {"backoff", f.Backoff}, {"sort", f.Sort}} {
		if kv[1] != "" {
			parts = append(parts, kv[0]+"="+urlQueryEscape(kv[1]))
		}
	}
	return strings.Join(parts, "&")
}

// MachineRow is one machine of a list: its claim and backoff counts, its
// stage if the application defines stages, and (ListMachines) who holds
// it since when and why it is in backoff.
type MachineRow struct {
	model.MachineOverview
	Stage string `json:"stage,omitempty"`
	// Claims are the machine's claims, alive or not, oldest first.
	Claims []model.CurrentWork `json:"claims,omitempty"`
	// Backoffs are its backoffs in force, soonest to end first.
	Backoffs []model.ActiveBackoff `json:"backoffs,omitempty"`
}

// Machines is the data of the /machines page.
type Machines struct {
	// Now is the database's clock when the page was read.
	Now    time.Time     `json:"now"`
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
	f := MachineFilter{Stage: q.Get("stage"), Process: q.Get("process"), Backoff: q.Get("backoff"), Sort: q.Get("sort")}
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
	now, err := h.dbNow(ctx)
	if err != nil {
		return nil, err
	}
	page := Machines{Now: now, Filter: f, Stages: names}
	switch f.Sort {
	case "":
		err = h.machinesByID(ctx, &page, q.Get("after"), stages != nil)
	case SortAge:
		if f.Stage != "" || f.Backoff != "" {
			return nil, badRequest("sort=%s lists claimed machines: combine it with process= only", SortAge)
		}
		err = h.machinesByAge(ctx, &page, q.Get("after"), stages != nil)
	default:
		return nil, badRequest("sort %q is not one of \"\", %s", f.Sort, SortAge)
	}
	return page, err
}

// machinesByID fills page with the machines after the machine id after.
func (h *Handler) machinesByID(ctx context.Context, page *Machines, after string, withStages bool) error {
	afterID := uuid.Nil
	if after != "" {
		var err error
		if afterID, err = parseID("after: machine", after); err != nil {
			return err
		}
	}
	rows, err := ListMachines(ctx, h.db, page.Filter, afterID, machinesPerPage+1, withStages)
	if err != nil {
		return err
	}
	page.Machines = rows
	if len(rows) > machinesPerPage {
		page.Machines = rows[:machinesPerPage]
		page.Next = page.Machines[machinesPerPage-1].MachineID.String()
	}
	return nil
}

// machinesByAge fills page with the claimed machines after the cursor
// after ("UNIXNANO_MACHINEID" of the last oldest claim), oldest first.
func (h *Handler) machinesByAge(ctx context.Context, page *Machines, after string, withStages bool) error {
	afterAt, afterID := time.Unix(0, 0), uuid.Nil
	if after != "" {
		ns, id, _ := strings.Cut(after, "_")
		nanos, err := strconv.ParseInt(ns, 10, 64)
		if err != nil {
			return badRequest("age cursor %q is malformed", after)
		}
		if afterID, err = parseID("after: machine", id); err != nil {
			return err
		}
		afterAt = time.Unix(0, nanos)
	}
	rows, err := model.New(h.db).CurrentWorkMachinesByAge(ctx, model.CurrentWorkMachinesByAgeParams{
		Process: optional(page.Filter.Process), AfterAt: afterAt, AfterID: afterID, RowLimit: machinesPerPage + 1,
	})
	if err != nil {
		return err
	}
	overviews := make([]model.MachineOverview, len(rows))
	for i, r := range rows {
		overviews[i] = model.MachineOverview{MachineID: r.MachineID, MachineCreatedAt: r.MachineCreatedAt,
			LiveClaims: r.LiveClaims, ExpiredClaims: r.ExpiredClaims, ActiveBackoffs: r.ActiveBackoffs}
	}
	if page.Machines, err = decorate(ctx, h.db, overviews, withStages); err != nil {
		return err
	}
	if len(rows) > machinesPerPage {
		page.Machines = page.Machines[:machinesPerPage]
		last := rows[machinesPerPage-1]
		page.Next = fmt.Sprintf("%d_%s", last.OldestClaim.UnixNano(), last.MachineID)
	}
	return nil
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
			IncludeExpired: true,
			BackoffProcess: optional(f.Backoff),
			RowLimit:       int32(limit),
		})
	}
	if err != nil {
		return nil, err
	}
	return decorate(ctx, db, rows, withStages)
}

// decorate returns rows as MachineRows with their claims, backoffs in
// force and (withStages) stages.
func decorate(ctx context.Context, db *sql.DB, rows []model.MachineOverview, withStages bool) ([]MachineRow, error) {
	out := make([]MachineRow, len(rows))
	ids := make([]uuid.UUID, len(rows))
	byID := make(map[uuid.UUID]*MachineRow, len(rows))
	for i, r := range rows {
		out[i].MachineOverview, ids[i] = r, r.MachineID
		byID[r.MachineID] = &out[i]
	}
	if len(rows) == 0 {
		return out, nil
	}
	q := model.New(db)
	claims, err := q.CurrentWorkForMachines(ctx, ids)
	if err != nil {
		return nil, err
	}
	for _, c := range claims {
		byID[c.MachineID].Claims = append(byID[c.MachineID].Claims, c)
	}
	backoffs, err := q.ActiveBackoffsForMachines(ctx, ids)
	if err != nil {
		return nil, err
	}
	for _, b := range backoffs {
		byID[b.MachineID].Backoffs = append(byID[b.MachineID].Backoffs, b)
	}
	if !withStages {
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
	rs, err := db.QueryContext(ctx, machinesAtStageSQL, f.Stage, after, optional(f.Process), true, optional(f.Backoff), limit)
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
	// Now is the database's clock when the page was read.
	Now    time.Time  `json:"now"`
	Status MachineRow `json:"status"`
	// Tags are the application's tags of the machine (see ViewMachineTags);
	// null when it defines none.
	Tags     []Tag                            `json:"tags"`
	Work     []model.CurrentWork              `json:"work"`
	Backoffs []model.WorkBackoffForMachineRow `json:"backoffs"`
	History  []model.ReadableHistory          `json:"history"`
	// AbandonedWhy says, by history id, why each Abandoned event of History
	// happened: the holder's session had expired, and another session took
	// the claim over or the expired session was collected.
	AbandonedWhy map[int64]string `json:"abandoned_why,omitempty"`
	// Older is the before= cursor of the next (older) history page, empty
	// on the last.
	Older string `json:"older,omitempty"`
}

// ActiveBackoffs are the backoffs in force: the machine's state.
func (m Machine) ActiveBackoffs() []model.WorkBackoffForMachineRow {
	var out []model.WorkBackoffForMachineRow
	for _, b := range m.Backoffs {
		if b.Active {
			out = append(out, b)
		}
	}
	return out
}

// PastBackoffs are the backoffs whose time is over, kept so that the next
// failure's interval grows from theirs: history, not state.
func (m Machine) PastBackoffs() []model.WorkBackoffForMachineRow {
	var out []model.WorkBackoffForMachineRow
	for _, b := range m.Backoffs {
		if !b.Active {
			out = append(out, b)
		}
	}
	return out
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
	if m.Now, err = h.dbNow(ctx); err != nil {
		return nil, err
	}
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
	if m.AbandonedWhy, err = abandonedWhy(ctx, h.db, m.History); err != nil {
		return nil, err
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
	// Now is the database's clock when the page was read.
	Now time.Time `json:"now"`
	ID  uuid.UUID `json:"session_id"`
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
	if s.Now, err = h.dbNow(ctx); err != nil {
		return nil, err
	}
	if s.Row != nil {
		s.Alive = s.Row.Deadline.After(s.Now)
	}
	return s, nil
}

func optional(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }
