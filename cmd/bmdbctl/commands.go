package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/model"
	"github.com/bmdb-dev/bmdb/web"
)

type runFunc = func(ctx context.Context, c *common, args []string) error

// withQueries opens a connection and runs fn with read queries on it.
func withQueries(ctx context.Context, c *common, fn func(q *model.Queries, conn *bmdb.Connection) error) error {
	conn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return fn(model.New(conn.DB()), conn)
}

func noArgs(name string, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", name, args)
	}
	return nil
}

func parseMachine(flagName, s string) (uuid.UUID, error) {
	if s == "" {
		return uuid.Nil, usagef("%s is required", flagName)
	}
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, usagef("%s %q is not a machine id (a UUID such as 3f2c7d9e-0c1b-4a5e-9a8f-1b2c3d4e5f60)", flagName, s)
	}
	return id, nil
}

func optional(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }

func checkLimit(limit int) error {
	if limit < 1 || limit > 100000 {
		return usagef("--limit is %d, must be in [1, 100000]", limit)
	}
	return nil
}

func migrateCommand(fs *flag.FlagSet) runFunc {
	steps := fs.Int("steps", 1, "migrate down: how many migrations to revert")
	return func(ctx context.Context, c *common, args []string) error {
		if len(args) != 1 {
			return usagef("migrate needs one of up, down, version, lock, unlock")
		}
		switch args[0] {
		case "lock":
			return showMigrationLock(ctx, c)
		case "unlock":
			return clearMigrationLock(ctx, c)
		case "up":
			if err := bmdb.MigrateUp(ctx, c.dsn); err != nil {
				return err
			}
		case "down":
			if *steps < 1 {
				return usagef("--steps is %d, must be positive", *steps)
			}
			if err := bmdb.MigrateDown(ctx, c.dsn, *steps); err != nil {
				return err
			}
		case "version":
		default:
			return usagef("migrate %q: want up, down, version, lock or unlock", args[0])
		}
		info, err := bmdb.ReadSchemaInfo(ctx, c.dsn)
		if err != nil {
			return err
		}
		t := &table{header: []string{"DATABASE", "BINARY", "DIRTY"}}
		t.add(struct {
			Database uint `json:"database_version"`
			Binary   uint `json:"binary_version"`
			Dirty    bool `json:"dirty"`
		}{info.Database, info.Binary, info.Dirty}, info.Database, info.Binary, info.Dirty)
		return t.print(c.out, c.json)
	}
}

// showMigrationLock prints the migration lock: who holds it, since when,
// and whether its lease is still live.
func showMigrationLock(ctx context.Context, c *common) error {
	lock, err := bmdb.ReadMigrationLock(ctx, c.dsn)
	if err != nil {
		return err
	}
	t := &table{header: []string{"HOLDER", "INFO", "ACQUIRED", "DEADLINE", "LIVE"}}
	if lock != nil {
		t.add(struct {
			Holder     uuid.UUID `json:"holder"`
			HolderInfo string    `json:"holder_info"`
			AcquiredAt time.Time `json:"acquired_at"`
			Deadline   time.Time `json:"deadline"`
			Live       bool      `json:"live"`
		}{lock.Holder, lock.HolderInfo, lock.AcquiredAt, lock.Deadline, lock.Live},
			lock.Holder, lock.HolderInfo, lock.AcquiredAt, lock.Deadline, lock.Live)
	}
	return t.print(c.out, c.json)
}

// clearMigrationLock deletes the migration lock (and golang-migrate's
// cockroachdb lock row), live or not.
func clearMigrationLock(ctx context.Context, c *common) error {
	cleared, err := bmdb.ClearMigrationLock(ctx, c.dsn)
	if err != nil {
		return err
	}
	t := &table{header: []string{"CLEARED"}}
	t.add(struct {
		Cleared bool `json:"cleared"`
	}{cleared}, cleared)
	return t.print(c.out, c.json)
}

type sessionRecord struct {
	SessionID   uuid.UUID `json:"session_id"`
	Component   string    `json:"component"`
	RuntimeInfo string    `json:"runtime_info"`
	CreatedAt   time.Time `json:"created_at"`
	Deadline    time.Time `json:"deadline"`
	SecondsLeft float64   `json:"seconds_left"`
}

func sessionsCommand(fs *flag.FlagSet) runFunc {
	return func(ctx context.Context, c *common, args []string) error {
		if err := noArgs("sessions", args); err != nil {
			return err
		}
		return withQueries(ctx, c, func(q *model.Queries, _ *bmdb.Connection) error {
			rows, err := q.LiveSessionsList(ctx)
			if err != nil {
				return err
			}
			t := &table{header: []string{"SESSION", "COMPONENT", "CREATED", "DEADLINE", "SECONDS_LEFT", "RUNTIME"}}
			for _, r := range rows {
				t.add(sessionRecord{r.SessionID, r.ComponentName, r.RuntimeInfo, r.CreatedAt, r.Deadline, r.SecondsLeft},
					r.SessionID, r.ComponentName, r.CreatedAt, r.Deadline, r.SecondsLeft, r.RuntimeInfo)
			}
			return t.print(c.out, c.json)
		})
	}
}

type workRecord struct {
	MachineID  uuid.UUID `json:"machine_id"`
	Process    string    `json:"process"`
	SessionID  uuid.UUID `json:"session_id"`
	Component  string    `json:"component"`
	StartedAt  time.Time `json:"started_at"`
	AgeSeconds float64   `json:"age_seconds"`
	Alive      bool      `json:"alive"`
}

func workTable(rows []model.CurrentWork) *table {
	t := &table{header: []string{"MACHINE", "PROCESS", "COMPONENT", "SESSION", "STARTED", "AGE_S", "ALIVE"}}
	for _, r := range rows {
		t.add(workRecord{r.MachineID, r.Process, r.SessionID, r.ComponentName, r.StartedAt, r.AgeSeconds, r.Alive},
			r.MachineID, r.Process, r.ComponentName, r.SessionID, r.StartedAt, r.AgeSeconds, r.Alive)
	}
	return t
}

func workCommand(fs *flag.FlagSet) runFunc {
	process := fs.String("process", "", "only claims of this process")
	limit := fs.Int("limit", 1000, "at most this many claims")
	return func(ctx context.Context, c *common, args []string) error {
		if err := noArgs("work", args); err != nil {
			return err
		}
		if err := checkLimit(*limit); err != nil {
			return err
		}
		return withQueries(ctx, c, func(q *model.Queries, _ *bmdb.Connection) error {
			rows, err := q.CurrentWorkList(ctx, model.CurrentWorkListParams{Process: optional(*process), RowLimit: int32(*limit)})
			if err != nil {
				return err
			}
			return workTable(rows).print(c.out, c.json)
		})
	}
}

type backoffRecord struct {
	MachineID       uuid.UUID `json:"machine_id"`
	Process         string    `json:"process"`
	Cause           string    `json:"cause"`
	Until           time.Time `json:"until"`
	IntervalSeconds float64   `json:"interval_seconds"`
	SecondsLeft     float64   `json:"seconds_left"`
}

func backoffTable(rows []model.ActiveBackoff) *table {
	t := &table{header: []string{"MACHINE", "PROCESS", "UNTIL", "SECONDS_LEFT", "INTERVAL_S", "CAUSE"}}
	for _, r := range rows {
		t.add(backoffRecord{r.MachineID, r.Process, r.Cause, r.Until, r.IntervalSeconds, r.SecondsLeft},
			r.MachineID, r.Process, r.Until, r.SecondsLeft, r.IntervalSeconds, r.Cause)
	}
	return t
}

func backoffsCommand(fs *flag.FlagSet) runFunc {
	process := fs.String("process", "", "only backoffs of this process")
	limit := fs.Int("limit", 1000, "at most this many backoffs")
	return func(ctx context.Context, c *common, args []string) error {
		if err := noArgs("backoffs", args); err != nil {
			return err
		}
		if err := checkLimit(*limit); err != nil {
			return err
		}
		return withQueries(ctx, c, func(q *model.Queries, _ *bmdb.Connection) error {
			rows, err := q.ActiveBackoffsList(ctx, model.ActiveBackoffsListParams{Process: optional(*process), RowLimit: int32(*limit)})
			if err != nil {
				return err
			}
			return backoffTable(rows).print(c.out, c.json)
		})
	}
}

type machineRecord struct {
	MachineID      uuid.UUID `json:"machine_id"`
	CreatedAt      time.Time `json:"created_at"`
	Stage          string    `json:"stage,omitempty"`
	LiveClaims     int64     `json:"live_claims"`
	ExpiredClaims  int64     `json:"expired_claims"`
	ActiveBackoffs int64     `json:"active_backoffs"`
}

func newMachineRecord(m web.MachineRow) machineRecord {
	return machineRecord{m.MachineID, m.MachineCreatedAt, m.Stage, m.LiveClaims, m.ExpiredClaims, m.ActiveBackoffs}
}

// stageNames returns the application's stages (web.ViewStages), nil if it
// defines none.
func stageNames(ctx context.Context, conn *bmdb.Connection) ([]string, error) {
	stages, err := web.ReadStages(ctx, conn.DB())
	if err != nil || stages == nil {
		return nil, err
	}
	names := []string{}
	for _, s := range stages {
		names = append(names, s.Name)
	}
	return names, nil
}

func machinesCommand(fs *flag.FlagSet) runFunc {
	stage := fs.String("stage", "", "only machines at this stage of the application's (its app_stages view)")
	after := fs.String("after", "", "start after this machine id (keyset pagination: the last id of the previous page)")
	limit := fs.Int("limit", 100, "at most this many machines")
	return func(ctx context.Context, c *common, args []string) error {
		if err := noArgs("machines", args); err != nil {
			return err
		}
		if err := checkLimit(*limit); err != nil {
			return err
		}
		afterID := uuid.Nil
		if *after != "" {
			var err error
			if afterID, err = parseMachine("--after", *after); err != nil {
				return err
			}
		}
		return withQueries(ctx, c, func(q *model.Queries, conn *bmdb.Connection) error {
			stages, err := stageNames(ctx, conn)
			if err != nil {
				return err
			}
			switch {
			case *stage != "" && stages == nil:
				return usagef("--stage %q: this database defines no stages (no %s view)", *stage, web.ViewStages)
			case *stage != "" && !slices.Contains(stages, *stage):
				return usagef("--stage %q is not one of %v", *stage, stages)
			}
			rows, err := web.ListMachines(ctx, conn.DB(), web.MachineFilter{Stage: *stage}, afterID, *limit, stages != nil)
			if err != nil {
				return err
			}
			t := &table{header: []string{"MACHINE", "STAGE", "LIVE_CLAIMS", "EXPIRED_CLAIMS", "BACKOFFS", "CREATED"}}
			for _, r := range rows {
				t.add(newMachineRecord(r), r.MachineID, r.Stage, r.LiveClaims, r.ExpiredClaims, r.ActiveBackoffs, r.MachineCreatedAt)
			}
			return t.print(c.out, c.json)
		})
	}
}

type historyRecord struct {
	At        time.Time `json:"at"`
	MachineID uuid.UUID `json:"machine_id"`
	Process   string    `json:"process"`
	Event     string    `json:"event"`
	Component string    `json:"component"`
	SessionID uuid.UUID `json:"session_id"`
	Cause     string    `json:"cause"`
}

// historyTable lists rows (newest first, as queried) oldest first.
func historyTable(rows []model.ReadableHistory) *table {
	t := &table{header: []string{"AT", "MACHINE", "PROCESS", "EVENT", "COMPONENT", "SESSION", "CAUSE"}}
	for i := len(rows) - 1; i >= 0; i-- {
		r := rows[i]
		t.add(historyRecord{r.At, r.MachineID, r.Process, r.Event, r.ComponentName, r.SessionID, r.Cause},
			r.At, r.MachineID, r.Process, r.Event, r.ComponentName, r.SessionID, r.Cause)
	}
	return t
}

func historyCommand(fs *flag.FlagSet) runFunc {
	machine := fs.String("machine", "", "the machine id (required)")
	process := fs.String("process", "", "only events of this process")
	since := fs.Duration("since", 0, "only events of the last D (e.g. 1h), on the database clock")
	limit := fs.Int("limit", 100, "at most this many events, the most recent")
	olderThan := fs.Duration("older-than", 0, "history prune: delete events older than this (e.g. 720h)")
	batch := fs.Int("batch", bmdb.PruneHistoryBatchDefault, "history prune: rows per transaction")
	return func(ctx context.Context, c *common, args []string) error {
		if len(args) == 1 && args[0] == "prune" {
			return prune(ctx, c, *olderThan, *batch)
		}
		if err := noArgs("history", args); err != nil {
			return err
		}
		id, err := parseMachine("--machine", *machine)
		if err != nil {
			return err
		}
		if *since < 0 {
			return usagef("--since is %v, must not be negative", *since)
		}
		if err := checkLimit(*limit); err != nil {
			return err
		}
		return withQueries(ctx, c, func(q *model.Queries, conn *bmdb.Connection) error {
			params := model.ReadableHistoryForMachineParams{MachineID: id, Process: optional(*process), RowLimit: int32(*limit)}
			if *since > 0 {
				var now time.Time
				if err := conn.DB().QueryRowContext(ctx, "SELECT now()").Scan(&now); err != nil {
					return err
				}
				params.Since = sql.NullTime{Time: now.Add(-*since), Valid: true}
			}
			rows, err := q.ReadableHistoryForMachine(ctx, params)
			if err != nil {
				return err
			}
			return historyTable(rows).print(c.out, c.json)
		})
	}
}

func prune(ctx context.Context, c *common, olderThan time.Duration, batch int) error {
	if olderThan <= 0 {
		return usagef("history prune needs --older-than D, a positive duration such as 720h")
	}
	if batch < 1 {
		return usagef("--batch is %d, must be positive", batch)
	}
	return withQueries(ctx, c, func(_ *model.Queries, conn *bmdb.Connection) error {
		n, err := conn.PruneHistory(ctx, olderThan, batch)
		if err != nil {
			return fmt.Errorf("pruned %d rows, then: %w", n, err)
		}
		t := &table{header: []string{"DELETED"}}
		t.add(struct {
			Deleted int64 `json:"deleted"`
		}{n}, n)
		return t.print(c.out, c.json)
	})
}

func machineCommand(fs *flag.FlagSet) runFunc {
	limit := fs.Int("limit", 20, "at most this many history events")
	return func(ctx context.Context, c *common, args []string) error {
		if len(args) != 1 {
			return usagef("machine needs one machine id")
		}
		id, err := parseMachine("machine", args[0])
		if err != nil {
			return err
		}
		if err := checkLimit(*limit); err != nil {
			return err
		}
		return withQueries(ctx, c, func(q *model.Queries, conn *bmdb.Connection) error {
			overview, err := q.MachineOverviewGet(ctx, id)
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("no machine %s", id)
			}
			if err != nil {
				return err
			}
			status := web.MachineRow{MachineOverview: overview}
			if stages, err := stageNames(ctx, conn); err != nil {
				return err
			} else if stages != nil {
				byID, err := web.ReadMachineStages(ctx, conn.DB(), []uuid.UUID{id})
				if err != nil {
					return err
				}
				status.Stage = byID[id]
			}
			work, err := q.CurrentWorkForMachine(ctx, id)
			if err != nil {
				return err
			}
			backoffs, err := q.ActiveBackoffsForMachine(ctx, id)
			if err != nil {
				return err
			}
			history, err := q.ReadableHistoryForMachine(ctx, model.ReadableHistoryForMachineParams{MachineID: id, RowLimit: int32(*limit)})
			if err != nil {
				return err
			}
			return printMachine(c, status, workTable(work), backoffTable(backoffs), historyTable(history))
		})
	}
}

func printMachine(c *common, status web.MachineRow, work, backoffs, history *table) error {
	if c.json {
		return (&table{records: []any{struct {
			Machine  machineRecord `json:"machine"`
			Work     []any         `json:"work"`
			Backoffs []any         `json:"backoffs"`
			History  []any         `json:"history"`
		}{
			newMachineRecord(status),
			nonNil(work.records), nonNil(backoffs.records), nonNil(history.records),
		}}}).print(c.out, true)
	}
	stage := ""
	if status.Stage != "" {
		stage = "stage " + status.Stage + ", "
	}
	fmt.Fprintf(c.out, "machine %s: %screated %s\n\nclaims:\n", status.MachineID, stage, cell(status.MachineCreatedAt))
	if err := work.print(c.out, false); err != nil {
		return err
	}
	fmt.Fprintln(c.out, "\nbackoffs in force:")
	if err := backoffs.print(c.out, false); err != nil {
		return err
	}
	fmt.Fprintln(c.out, "\nrecent history:")
	return history.print(c.out, false)
}

func nonNil(s []any) []any {
	if s == nil {
		return []any{}
	}
	return s
}

func backoffCommand(fs *flag.FlagSet) runFunc {
	machine := fs.String("machine", "", "the machine id (required)")
	process := fs.String("process", "", "the process (required)")
	reason := fs.String("reason", "", "why, for the history (default: who ran it)")
	return func(ctx context.Context, c *common, args []string) error {
		if len(args) != 1 || args[0] != "clear" {
			return usagef("backoff needs the subcommand clear")
		}
		id, err := parseMachine("--machine", *machine)
		if err != nil {
			return err
		}
		if *process == "" {
			return usagef("--process is required")
		}
		why := *reason
		if why == "" {
			why = "cleared by " + runtimeInfo()
		}
		conn, err := c.open(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		sess, err := conn.StartSession(ctx)
		if err != nil {
			return err
		}
		defer sess.Close(context.WithoutCancel(ctx))
		if err := sess.ClearBackoff(ctx, id, *process, why); err != nil {
			return err
		}
		t := &table{header: []string{"MACHINE", "PROCESS", "CLEARED"}}
		t.add(struct {
			MachineID uuid.UUID `json:"machine_id"`
			Process   string    `json:"process"`
			Cleared   bool      `json:"cleared"`
		}{id, *process, true}, id, *process, true)
		return t.print(c.out, c.json)
	}
}

func gcCommand(fs *flag.FlagSet) runFunc {
	return func(ctx context.Context, c *common, args []string) error {
		if err := noArgs("gc", args); err != nil {
			return err
		}
		return withQueries(ctx, c, func(_ *model.Queries, conn *bmdb.Connection) error {
			n, err := conn.CollectGarbage(ctx)
			if err != nil {
				return err
			}
			t := &table{header: []string{"SESSIONS_DELETED"}}
			t.add(struct {
				Deleted int64 `json:"sessions_deleted"`
			}{n}, n)
			return t.print(c.out, c.json)
		})
	}
}
