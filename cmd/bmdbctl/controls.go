package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/fleet"
	"github.com/bmdb-dev/bmdb/model"
)

// The fleet controls: pause, resume, cap and processes (see "Fleet
// controls" in bmdb's package doc). processes lists fleet.ProcessControl
// records, as the overview's JSON has them, and --history
// fleet.ControlRecord ones.

func processesCommand(fs *flag.FlagSet) runFunc {
	history := fs.Bool("history", false, "list the pauses, resumes and cap changes instead, newest first")
	f := addListFilter(fs, "changes (--history)", 100)
	return func(ctx context.Context, c *common, args []string) error {
		if err := f.check("processes", args); err != nil {
			return err
		}
		return withQueries(ctx, c, func(_ *model.Queries, conn *bmdb.Connection) error {
			if *history {
				rows, err := fleet.ReadControlHistory(ctx, conn.DB(), *f.process, *f.limit)
				if err != nil {
					return err
				}
				t := &table{header: []string{"PROCESS", "ACTION", "CAP", "AT", "BY", "REASON", "RUNTIME"}}
				for _, rec := range rows {
					t.add(rec, rec.Process, rec.Action, capCell(rec.ClaimCap), rec.At, rec.Actor, rec.Reason, rec.RuntimeInfo)
				}
				return t.print(c.out, c.json)
			}
			rows, err := fleet.ReadProcessControls(ctx, conn.DB())
			if err != nil {
				return err
			}
			t := &table{header: []string{"PROCESS", "STATE", "CAP", "LIVE", "CHANGED", "BY", "REASON"}}
			for _, rec := range rows {
				state := "running"
				if rec.Paused {
					state = "PAUSED"
				}
				t.add(rec, rec.Process, state, capCell(rec.ClaimCap), rec.LiveClaims, rec.ChangedAt, rec.ChangedBy, rec.Reason)
			}
			return t.print(c.out, c.json)
		})
	}
}

// capCell shows a cap, or "-" for none.
func capCell(cap *int64) string {
	if cap == nil {
		return "-"
	}
	return strconv.FormatInt(*cap, 10)
}

// controlFlags are the flags of pause, resume and cap: who and why.
func controlFlags(fs *flag.FlagSet) (reason, by *string) {
	reason = fs.String("reason", "", "why, for the record (process_control_history)")
	by = fs.String("by", os.Getenv("USER"), "who, for the record (default $USER)")
	return reason, by
}

// control runs change on a session of its own, and prints whether it
// changed the controls of process.
func control(ctx context.Context, c *common, process, action string, change func(*bmdb.Session) (bool, error)) error {
	var changed bool
	err := c.withSession(ctx, func(sess *bmdb.Session) (err error) {
		changed, err = change(sess)
		return err
	})
	if err != nil {
		return err
	}
	if !c.json {
		if changed {
			fmt.Fprintf(c.out, "%s: %s\n", process, action)
		} else {
			fmt.Fprintf(c.out, "%s: already so, nothing changed (%s)\n", process, action)
		}
		return nil
	}
	return writeJSON(c.out, struct {
		Process string `json:"process"`
		Action  string `json:"action"`
		Changed bool   `json:"changed"`
	}{process, action, changed})
}

// oneProcess checks that args are one valid process name, and returns it.
func oneProcess(cmd string, args []string, more string) (string, error) {
	if len(args) < 1 {
		return "", usagef("%s needs a PROCESS", cmd)
	}
	if err := bmdb.ValidateProcess(args[0]); err != nil {
		return "", usagef("PROCESS %q: %v", args[0], err)
	}
	if more == "" && len(args) > 1 {
		return "", usagef("%s takes one PROCESS, got %q", cmd, args)
	}
	return args[0], nil
}

func pauseCommand(fs *flag.FlagSet) runFunc {
	reason, by := controlFlags(fs)
	return func(ctx context.Context, c *common, args []string) error {
		process, err := oneProcess("pause", args, "")
		if err != nil {
			return err
		}
		return control(ctx, c, process, "paused", func(s *bmdb.Session) (bool, error) {
			return s.PauseProcess(ctx, process, bmdb.ControlChange{By: *by, Reason: *reason})
		})
	}
}

func resumeCommand(fs *flag.FlagSet) runFunc {
	reason, by := controlFlags(fs)
	return func(ctx context.Context, c *common, args []string) error {
		process, err := oneProcess("resume", args, "")
		if err != nil {
			return err
		}
		return control(ctx, c, process, "running", func(s *bmdb.Session) (bool, error) {
			return s.ResumeProcess(ctx, process, bmdb.ControlChange{By: *by, Reason: *reason})
		})
	}
}

func capCommand(fs *flag.FlagSet) runFunc {
	reason, by := controlFlags(fs)
	none := fs.Bool("none", false, "remove the cap")
	return func(ctx context.Context, c *common, args []string) error {
		process, err := oneProcess("cap", args, "N")
		if err != nil {
			return err
		}
		n := 0
		switch {
		case *none && len(args) == 1:
		case *none:
			return usagef("cap --none takes no N, got %q", args[1:])
		case len(args) != 2:
			return usagef("cap needs PROCESS and N (1..%d), or PROCESS --none", bmdb.MaxCap)
		default:
			n, err = strconv.Atoi(args[1])
			if err != nil || n < 1 || n > bmdb.MaxCap {
				return usagef("N %q must be a number in [1, %d] (--none removes the cap)", args[1], bmdb.MaxCap)
			}
		}
		action := fmt.Sprintf("capped at %d live claims", n)
		if n == 0 {
			action = "no cap"
		}
		return control(ctx, c, process, action, func(s *bmdb.Session) (bool, error) {
			return s.CapProcess(ctx, process, n, bmdb.ControlChange{By: *by, Reason: *reason})
		})
	}
}
