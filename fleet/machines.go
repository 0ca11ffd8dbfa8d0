package fleet

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/model"
)

// machinesAtStageSQL is MachineOverviewFilter restricted to a stage.
const machinesAtStageSQL = `SELECT mo.machine_id, mo.machine_created_at, mo.live_claims, mo.expired_claims, mo.active_backoffs
FROM machine_overview mo JOIN app_machine_stages ms ON ms.machine_id = mo.machine_id
WHERE ms.stage = $1 AND mo.machine_id > $2
  AND ($3::TEXT IS NULL OR EXISTS (
        SELECT 1 FROM work w JOIN sessions s ON s.session_id = w.session_id
        WHERE w.machine_id = mo.machine_id AND w.process = $3::TEXT AND (s.deadline > now() OR $4::BOOL)))
  AND ($5::TEXT IS NULL OR EXISTS (
        SELECT 1 FROM work_backoff b
        WHERE b.machine_id = mo.machine_id AND b.process = $5::TEXT AND b.until > now()))
ORDER BY mo.machine_id
LIMIT $6`

// MachineFilter selects the machines of a list. Process names are not
// checked here: one bmdb would refuse (bmdb.ValidateProcess) matches
// nothing.
type MachineFilter struct {
	Stage string `json:"stage,omitempty"` // at this stage (see ViewStages)
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

// MachinePage is a page of a machine list.
type MachinePage struct {
	Machines []MachineRow `json:"machines"`
	// Next is the cursor of the next page (ListMachines' after), empty on
	// the last.
	Next string `json:"next,omitempty"`
}

// ListMachines returns the page of at most limit machines that match f
// after the cursor after ("" for the first page; a page's Next for the
// next), with their claims and backoffs in force, and their stages if
// withStages (the application defines stages: see ReadAppViews). Sorted
// by id, after is a machine id; by age (SortAge), an opaque cursor. A
// malformed cursor, an unknown Sort, SortAge with Stage or Backoff, and
// Stage without withStages are ErrInvalidArgument; whether f.Stage is one
// of the application's stages is the caller's to check (ReadStages).
func ListMachines(ctx context.Context, db *sql.DB, f MachineFilter, after string, limit int, withStages bool) (MachinePage, error) {
	if f.Stage != "" && !withStages {
		return MachinePage{}, invalidArgument("stage %q: this database defines no stages (no %s view)", f.Stage, ViewStages)
	}
	switch f.Sort {
	case "":
		return machinesByID(ctx, db, f, after, limit, withStages)
	case SortAge:
		if f.Stage != "" || f.Backoff != "" {
			return MachinePage{}, invalidArgument("sort=%s lists claimed machines: combine it with process= only", SortAge)
		}
		return machinesByAge(ctx, db, f.Process, after, limit, withStages)
	}
	return MachinePage{}, invalidArgument("sort %q is not one of \"\", %s", f.Sort, SortAge)
}

// machinesByID lists the machines that match f after the machine id after.
func machinesByID(ctx context.Context, db *sql.DB, f MachineFilter, after string, limit int, withStages bool) (MachinePage, error) {
	afterID := uuid.Nil
	if after != "" {
		var err error
		if afterID, err = uuid.Parse(after); err != nil {
			return MachinePage{}, invalidArgument("after: machine id %q is not a UUID", after)
		}
	}
	var rows []model.MachineOverview
	var err error
	// One more than a page: whether there is a next one.
	if f.Stage != "" {
		rows, err = machinesAtStage(ctx, db, f, afterID, limit+1)
	} else {
		rows, err = model.New(db).MachineOverviewFilter(ctx, model.MachineOverviewFilterParams{
			AfterID:        afterID,
			WorkingProcess: optional(f.Process),
			IncludeExpired: true,
			BackoffProcess: optional(f.Backoff),
			RowLimit:       int32(limit + 1),
		})
	}
	if err != nil {
		return MachinePage{}, err
	}
	var page MachinePage
	if len(rows) > limit {
		rows = rows[:limit]
		page.Next = rows[limit-1].MachineID.String()
	}
	page.Machines, err = decorate(ctx, db, rows, withStages)
	return page, err
}

// machinesByAge lists the claimed machines (of process, if set) after the
// cursor after ("UNIXNANO_MACHINEID" of the last oldest claim), oldest
// first.
func machinesByAge(ctx context.Context, db *sql.DB, process, after string, limit int, withStages bool) (MachinePage, error) {
	afterAt, afterID := time.Unix(0, 0), uuid.Nil
	if after != "" {
		ns, id, _ := strings.Cut(after, "_")
		nanos, err := strconv.ParseInt(ns, 10, 64)
		if err != nil {
			return MachinePage{}, invalidArgument("age cursor %q is malformed", after)
		}
		if afterID, err = uuid.Parse(id); err != nil {
			return MachinePage{}, invalidArgument("after: machine id %q is not a UUID", id)
		}
		afterAt = time.Unix(0, nanos)
	}
	rows, err := model.New(db).CurrentWorkMachinesByAge(ctx, model.CurrentWorkMachinesByAgeParams{
		Process: optional(process), AfterAt: afterAt, AfterID: afterID, RowLimit: int32(limit + 1),
	})
	if err != nil {
		return MachinePage{}, err
	}
	var page MachinePage
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[limit-1]
		page.Next = fmt.Sprintf("%d_%s", last.OldestClaim.UnixNano(), last.MachineID)
	}
	overviews := make([]model.MachineOverview, len(rows))
	for i, r := range rows {
		overviews[i] = model.MachineOverview{MachineID: r.MachineID, MachineCreatedAt: r.MachineCreatedAt,
			LiveClaims: r.LiveClaims, ExpiredClaims: r.ExpiredClaims, ActiveBackoffs: r.ActiveBackoffs}
	}
	page.Machines, err = decorate(ctx, db, overviews, withStages)
	return page, err
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

func optional(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }
