package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/fleet"
	"github.com/bmdb-dev/bmdb/model"
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

// noArgs fails unless command name got no positional arguments.
func noArgs(name string, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", name, args)
	}
	return nil
}

// parseMachine parses the machine id s, given as flagName (or the argument
// so described); it is required.
func parseMachine(flagName, s string) (uuid.UUID, error) {
	if s == "" {
		return uuid.Nil, usagef("%s is required", flagName)
	}
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, usagef("%s %q is not a UUID (a machine id such as 3f2c7d9e-0c1b-4a5e-9a8f-1b2c3d4e5f60)", flagName, s)
	}
	return id, nil
}

// checkProcess checks --process: a valid process name if given, and given
// if required.
func checkProcess(process string, required bool) error {
	switch {
	case process == "" && required:
		return usagef("--process is required")
	case process == "":
		return nil
	}
	if err := bmdb.ValidateProcess(process); err != nil {
		return usagef("--process %q: %s", process, strings.TrimPrefix(err.Error(), bmdb.ErrInvalidArgument.Error()+": "))
	}
	return nil
}

// optional is s as a nullable query parameter: NULL if empty.
func optional(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }

// listFilter are the flags of a command that lists rows of one process or
// of all: --process P and --limit N.
type listFilter struct {
	process *string
	limit   *int
}

// addListFilter adds --process and --limit, described as what, with
// default limit.
func addListFilter(fs *flag.FlagSet, what string, limit int) listFilter {
	return listFilter{
		process: fs.String("process", "", "only "+what+" of this process"),
		limit:   fs.Int("limit", limit, "at most this many "+what),
	}
}

// check checks command name's arguments (none) and the filter's flags.
func (f listFilter) check(name string, args []string) error {
	if err := noArgs(name, args); err != nil {
		return err
	}
	if err := checkProcess(*f.process, false); err != nil {
		return err
	}
	return checkLimit(*f.limit)
}

// checkLimit checks --limit.
func checkLimit(limit int) error {
	if limit < 1 || limit > 100000 {
		return usagef("--limit is %d, must be in [1, 100000]", limit)
	}
	return nil
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
				t.add(r, r.SessionID, r.ComponentName, r.CreatedAt, r.Deadline, r.SecondsLeft, r.RuntimeInfo)
			}
			return t.print(c.out, c.json)
		})
	}
}

// workTable lists claims; its JSON records are those of the web pages.
func workTable(rows []model.CurrentWork) *table {
	t := &table{header: []string{"MACHINE", "PROCESS", "COMPONENT", "SESSION", "STARTED", "AGE_S", "ALIVE"}}
	for _, r := range rows {
		t.add(r, r.MachineID, r.Process, r.ComponentName, r.SessionID, r.StartedAt, r.AgeSeconds, r.Alive)
	}
	return t
}

func workCommand(fs *flag.FlagSet) runFunc {
	f := addListFilter(fs, "claims", 1000)
	return func(ctx context.Context, c *common, args []string) error {
		if err := f.check("work", args); err != nil {
			return err
		}
		return withQueries(ctx, c, func(q *model.Queries, _ *bmdb.Connection) error {
			rows, err := q.CurrentWorkList(ctx, model.CurrentWorkListParams{Process: optional(*f.process), RowLimit: int32(*f.limit)})
			if err != nil {
				return err
			}
			return workTable(rows).print(c.out, c.json)
		})
	}
}

// backoffTable lists backoffs in force; its JSON records have the web
// pages' field names, with seconds_left where the machine page (which lists
// expired backoffs too) has active.
func backoffTable(rows []model.ActiveBackoff) *table {
	t := &table{header: []string{"MACHINE", "PROCESS", "UNTIL", "SECONDS_LEFT", "INTERVAL_S", "CAUSE"}}
	for _, r := range rows {
		t.add(r, r.MachineID, r.Process, r.Until, r.SecondsLeft, r.IntervalSeconds, r.Cause)
	}
	return t
}

func backoffsCommand(fs *flag.FlagSet) runFunc {
	f := addListFilter(fs, "backoffs", 1000)
	return func(ctx context.Context, c *common, args []string) error {
		if err := f.check("backoffs", args); err != nil {
			return err
		}
		return withQueries(ctx, c, func(q *model.Queries, _ *bmdb.Connection) error {
			rows, err := q.ActiveBackoffsList(ctx, model.ActiveBackoffsListParams{Process: optional(*f.process), RowLimit: int32(*f.limit)})
			if err != nil {
				return err
			}
			return backoffTable(rows).print(c.out, c.json)
		})
	}
}

// stageNames returns the application's stages (fleet.ViewStages), nil if
// it defines none.
func stageNames(ctx context.Context, conn *bmdb.Connection) ([]string, error) {
	stages, err := fleet.ReadStages(ctx, conn.DB())
	if err != nil || stages == nil {
		return nil, err
	}
	names := []string{}
	for _, s := range stages {
		names = append(names, s.Name)
	}
	return names, nil
}

// machinesLimitDefault is the default --limit of machines.
const machinesLimitDefault = 100

func machinesCommand(fs *flag.FlagSet) runFunc {
	stage := fs.String("stage", "", "only machines at this stage of the application's (its app_stages view)")
	process := fs.String("process", "", "only machines with a claim of this process (live, or held by an expired session)")
	after := fs.String("after", "", "start after this machine id (keyset pagination: the last id of the previous page)")
	limit := fs.Int("limit", machinesLimitDefault, "at most this many machines (a page; a last line tells the next page's --after)")
	return func(ctx context.Context, c *common, args []string) error {
		if err := noArgs("machines", args); err != nil {
			return err
		}
		if err := checkProcess(*process, false); err != nil {
			return err
		}
		if err := checkLimit(*limit); err != nil {
			return err
		}
		if *after != "" {
			if _, err := parseMachine("--after", *after); err != nil {
				return err
			}
		}
		return withQueries(ctx, c, func(_ *model.Queries, conn *bmdb.Connection) error {
			stages, err := stageNames(ctx, conn)
			if err != nil {
				return err
			}
			switch {
			case *stage != "" && stages == nil:
				return usagef("--stage %q: this database defines no stages (no %s view)", *stage, fleet.ViewStages)
			case *stage != "" && !slices.Contains(stages, *stage):
				return usagef("--stage %q is not one of %v", *stage, stages)
			}
			page, err := fleet.ListMachines(ctx, conn.DB(), fleet.MachineFilter{Stage: *stage, Process: *process}, *after, *limit, stages != nil)
			if err != nil {
				return err
			}
			if c.json {
				// A page of machines and, if there are more, the --after
				// of the next: the web's /machines JSON has the same keys.
				return writeJSON(c.out, page)
			}
			t := &table{header: []string{"MACHINE", "STAGE", "LIVE_CLAIMS", "EXPIRED_CLAIMS", "BACKOFFS", "CREATED"}}
			for _, r := range page.Machines {
				t.add(r, r.MachineID, r.Stage, r.LiveClaims, r.ExpiredClaims, r.ActiveBackoffs, r.MachineCreatedAt)
			}
			if err := t.print(c.out, false); err != nil {
				return err
			}
			if page.Next != "" {
				cmd := "bmdbctl machines --after " + page.Next
				if *stage != "" {
					cmd += " --stage " + *stage
				}
				if *process != "" {
					cmd += " --process " + *process
				}
				if *limit != machinesLimitDefault {
					cmd += fmt.Sprintf(" --limit %d", *limit)
				}
				_, err = fmt.Fprintf(c.out, "(more machines: %s)\n", cmd)
			}
			return err
		})
	}
}

// historyTable lists events newest first (as queried, and as the web
// pages list them); one machine's without the machine column.
func historyTable(rows []model.ReadableHistory) *table {
	t := &table{header: []string{"AT", "MACHINE", "PROCESS", "EVENT", "COMPONENT", "SESSION", "CAUSE"}}
	for _, r := range rows {
		t.add(r, r.At, r.MachineID, r.Process, r.Event, r.ComponentName, r.SessionID, r.Cause)
	}
	return t
}

func historyCommand(fs *flag.FlagSet) runFunc {
	machine := fs.String("machine", "", "only this machine's events (default: the whole fleet's)")
	process := fs.String("process", "", "only events of this process")
	since := duration(fs, "since", 0, "only events of the last D (e.g. 1h), on the database clock")
	limit := fs.Int("limit", 100, "at most this many events, the most recent")
	olderThan := duration(fs, "older-than", 0, "history prune: delete events older than this (e.g. 720h)")
	batch := fs.Int("batch", bmdb.PruneHistoryBatchDefault, "history prune: rows per transaction")
	return func(ctx context.Context, c *common, args []string) error {
		if len(args) > 0 && args[0] == "prune" {
			if err := noArgs("history prune", args[1:]); err != nil {
				return err
			}
			return prune(ctx, c, *olderThan, *batch)
		}
		if err := noArgs("history", args); err != nil {
			return err
		}
		if err := checkProcess(*process, false); err != nil {
			return err
		}
		id := uuid.Nil
		if *machine != "" {
			var err error
			if id, err = parseMachine("--machine", *machine); err != nil {
				return err
			}
		}
		if *since < 0 {
			return usagef("--since is %v, must not be negative", *since)
		}
		if err := checkLimit(*limit); err != nil {
			return err
		}
		return withQueries(ctx, c, func(q *model.Queries, conn *bmdb.Connection) error {
			var from sql.NullTime
			if *since > 0 {
				now, err := fleet.Now(ctx, conn.DB())
				if err != nil {
					return err
				}
				from = sql.NullTime{Time: now.Add(-*since), Valid: true}
			}
			if id == uuid.Nil {
				rows, err := q.ReadableHistoryRecent(ctx, model.ReadableHistoryRecentParams{Process: optional(*process), Since: from, RowLimit: int32(*limit)})
				if err != nil {
					return err
				}
				return historyTable(rows).print(c.out, c.json)
			}
			rows, err := q.ReadableHistoryForMachine(ctx, model.ReadableHistoryForMachineParams{MachineID: id, Process: optional(*process), Since: from, RowLimit: int32(*limit)})
			if err != nil {
				return err
			}
			return historyTable(rows).without("MACHINE").print(c.out, c.json)
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

// machineJSON is machine ID --json: one object with the keys of the web
// page's JSON (fleet.Machine) that bmdbctl shows. Its backoffs are those
// in force, as in backoffs --json.
type machineJSON struct {
	Status   fleet.MachineRow        `json:"status"`
	Work     []model.CurrentWork     `json:"work"`
	Backoffs []model.ActiveBackoff   `json:"backoffs"`
	History  []model.ReadableHistory `json:"history"`
}

func machineCommand(fs *flag.FlagSet) runFunc {
	limit := fs.Int("limit", 20, "at most this many history events, the most recent")
	return func(ctx context.Context, c *common, args []string) error {
		if len(args) != 1 {
			return usagef("machine needs one machine id, got %d arguments", len(args))
		}
		id, err := parseMachine("machine id", args[0])
		if err != nil {
			return err
		}
		if err := checkLimit(*limit); err != nil {
			return err
		}
		return withQueries(ctx, c, func(q *model.Queries, conn *bmdb.Connection) error {
			m, err := readMachine(ctx, q, conn, id, *limit)
			if err != nil {
				return err
			}
			return printMachine(c, m)
		})
	}
}

// readMachine reads what machine ID shows: its status (with its stage if
// the application defines stages), claims, backoffs in force and its limit
// most recent events.
func readMachine(ctx context.Context, q *model.Queries, conn *bmdb.Connection, id uuid.UUID, limit int) (machineJSON, error) {
	var m machineJSON
	var err error
	if m.Status, err = fleet.ReadMachineStatus(ctx, conn.DB(), id); err != nil {
		return m, err
	}
	if m.Work, err = q.CurrentWorkForMachine(ctx, id); err != nil {
		return m, err
	}
	if m.Backoffs, err = q.ActiveBackoffsForMachine(ctx, id); err != nil {
		return m, err
	}
	m.History, err = q.ReadableHistoryForMachine(ctx, model.ReadableHistoryForMachineParams{MachineID: id, RowLimit: int32(limit)})
	return m, err
}

// printMachine writes m as one JSON object, or as a heading and three
// tables without the machine column, which the heading names.
func printMachine(c *common, m machineJSON) error {
	if c.json {
		return writeJSON(c.out, m)
	}
	stage := ""
	if m.Status.Stage != "" {
		stage = "stage " + m.Status.Stage + ", "
	}
	fmt.Fprintf(c.out, "machine %s: %screated %s\n\nclaims:\n", m.Status.MachineID, stage, cell(m.Status.MachineCreatedAt))
	if err := workTable(m.Work).without("MACHINE").print(c.out, false); err != nil {
		return err
	}
	fmt.Fprintln(c.out, "\nbackoffs in force:")
	if err := backoffTable(m.Backoffs).without("MACHINE").print(c.out, false); err != nil {
		return err
	}
	fmt.Fprintln(c.out, "\nrecent history, newest first:")
	return historyTable(m.History).without("MACHINE").print(c.out, false)
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
		if err := checkProcess(*process, true); err != nil {
			return err
		}
		why := *reason
		if why == "" {
			why = "cleared by " + runtimeInfo()
		}
		err = c.withSession(ctx, nil, func(sess *bmdb.Session) error {
			return sess.ClearBackoff(ctx, id, *process, why)
		})
		if err != nil {
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
