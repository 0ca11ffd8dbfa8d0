package fleet

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/model"
)

// Machine is one machine as its page shows it: its state, what the
// application knows of it, and a page of its history, newest first.
type Machine struct {
	// Now is the database's clock when the machine was read.
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
	// Older is the cursor of the next (older) history page (ReadMachine's
	// before), empty on the last.
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

// ReadMachine returns machine id with its history page of at most
// historyLimit events before the cursor before ("" for the newest; a
// Machine's Older for the next). A malformed cursor is ErrInvalidArgument,
// an unknown machine ErrNotFound.
func ReadMachine(ctx context.Context, db *sql.DB, id uuid.UUID, before string, historyLimit int) (Machine, error) {
	cursor, err := parseHistoryCursor(before)
	if err != nil {
		return Machine{}, err
	}
	var m Machine
	if m.Now, err = Now(ctx, db); err != nil {
		return Machine{}, err
	}
	views, err := ReadAppViews(ctx, db)
	if err != nil {
		return Machine{}, err
	}
	if m.Status, err = readStatus(ctx, db, id, views); err != nil {
		return Machine{}, err
	}
	if views.Tags {
		if m.Tags, err = readTags(ctx, db, id); err != nil {
			return Machine{}, err
		}
	}
	q := model.New(db)
	if m.Work, err = q.CurrentWorkForMachine(ctx, id); err != nil {
		return Machine{}, err
	}
	if m.Backoffs, err = q.WorkBackoffForMachine(ctx, id); err != nil {
		return Machine{}, err
	}
	m.History, err = q.ReadableHistoryForMachinePage(ctx, model.ReadableHistoryForMachinePageParams{
		MachineID: id, AfterProcess: cursor.process, BeforeSeq: cursor.seq, BeforeAt: cursor.at, BeforeID: cursor.id,
		RowLimit: int32(historyLimit + 1),
	})
	if err != nil {
		return Machine{}, err
	}
	if len(m.History) > historyLimit {
		m.History = m.History[:historyLimit]
		last := m.History[historyLimit-1]
		m.Older = historyCursor{process: last.Process, seq: last.Seq.Int64, at: last.At, id: last.ID}.String()
	}
	if m.AbandonedWhy, err = abandonedWhy(ctx, db, m.History); err != nil {
		return Machine{}, err
	}
	return m, nil
}

// ReadMachineStatus returns machine id's claim and backoff counts and, if
// the application defines stages, its stage; an unknown machine is
// ErrNotFound.
func ReadMachineStatus(ctx context.Context, db *sql.DB, id uuid.UUID) (MachineRow, error) {
	views, err := ReadAppViews(ctx, db)
	if err != nil {
		return MachineRow{}, err
	}
	return readStatus(ctx, db, id, views)
}

func readStatus(ctx context.Context, db *sql.DB, id uuid.UUID, views AppViews) (MachineRow, error) {
	var row MachineRow
	var err error
	row.MachineOverview, err = model.New(db).MachineOverviewGet(ctx, id)
	if errors.Is(err, sql.ErrNoRows) {
		return MachineRow{}, notFound("no machine %s", id)
	}
	if err != nil || !views.Stages {
		return row, err
	}
	stages, err := ReadMachineStages(ctx, db, []uuid.UUID{id})
	row.Stage = stages[id]
	return row, err
}

// historyCursor is where a machine's history page starts: after the row
// of process, seq, at and id (see ReadableHistoryForMachinePage).
type historyCursor struct {
	process string
	seq     int64
	at      time.Time
	id      int64
}

// String returns the cursor as ReadMachine takes it: "SEQ_UNIXNANO_ID_PROCESS"
// (last, since a process name may hold underscores).
func (c historyCursor) String() string {
	return fmt.Sprintf("%d_%d_%d_%s", c.seq, c.at.UnixNano(), c.id, c.process)
}

// parseHistoryCursor parses a history cursor (historyCursor.String); ""
// is the start.
func parseHistoryCursor(s string) (historyCursor, error) {
	if s == "" {
		return historyCursor{}, nil
	}
	parts := strings.SplitN(s, "_", 4)
	if len(parts) == 4 && parts[3] != "" {
		seq, err1 := strconv.ParseInt(parts[0], 10, 64)
		nanos, err2 := strconv.ParseInt(parts[1], 10, 64)
		rowID, err3 := strconv.ParseInt(parts[2], 10, 64)
		if err1 == nil && err2 == nil && err3 == nil {
			return historyCursor{process: parts[3], seq: seq, at: time.Unix(0, nanos), id: rowID}, nil
		}
	}
	return historyCursor{}, invalidArgument("history cursor %q is malformed", s)
}
