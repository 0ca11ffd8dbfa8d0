package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/fleet"
	"github.com/bmdb-dev/bmdb/model"
)

// The fleet controls: pause, resume, cap, controls delete and processes
// (see "Fleet controls" in bmdb's package doc). processes lists
// fleet.ProcessControl records, as the overview's JSON has them, and
// --history fleet.ControlRecord ones.

func processesCommand(fs *flag.FlagSet) runFunc {
	history := fs.Bool("history", false, "list the pauses, resumes, cap changes and deletions instead, newest first")
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

// controlFlags are the flags of pause, resume, cap and controls delete:
// who and why.
func controlFlags(fs *flag.FlagSet) (reason, by *string) {
	reason = fs.String("reason", "", "why, for the record (process_control_history)")
	by = fs.String("by", os.Getenv("USER"), "who, for the record (default $USER)")
	return reason, by
}

// newFlag is the flag of pause, resume and cap that lets them control a
// process the database does not know yet.
func newFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("new", false, "control a process the database does not know yet (no claims, history, backoffs or controls): without it, such a name is refused as a typo")
}

// control runs change on a session of its own, and prints whether it
// changed the controls of process. Unless isNew, it first refuses (a
// usage error) a process the database does not know: command cmd would
// otherwise make controls for a typo.
func control(ctx context.Context, c *common, cmd, process, action string, isNew bool, change func(*bmdb.Session) (bool, error)) error {
	var changed bool
	err := c.withSession(ctx, func(conn *bmdb.Connection) error {
		if isNew {
			return nil
		}
		err := fleet.CheckProcessKnown(ctx, conn.DB(), process)
		if errors.Is(err, fleet.ErrUnknownProcess) {
			return usagef("%v; pass --new to %s it anyway", err, cmd)
		}
		return err
	}, func(sess *bmdb.Session) (err error) {
		changed, err = change(sess)
		return err
	})
	if err != nil {
		return err
	}
	return printControl(c, process, action, changed)
}

// printControl prints what a control did to process: action, or nothing
// if !changed.
func printControl(c *common, process, action string, changed bool) error {
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
	isNew := newFlag(fs)
	return func(ctx context.Context, c *common, args []string) error {
		process, err := oneProcess("pause", args, "")
		if err != nil {
			return err
		}
		return control(ctx, c, "pause", process, "paused", *isNew, func(s *bmdb.Session) (bool, error) {
			return s.PauseProcess(ctx, process, bmdb.ControlChange{By: *by, Reason: *reason})
		})
	}
}

func resumeCommand(fs *flag.FlagSet) runFunc {
	reason, by := controlFlags(fs)
	isNew := newFlag(fs)
	return func(ctx context.Context, c *common, args []string) error {
		process, err := oneProcess("resume", args, "")
		if err != nil {
			return err
		}
		return control(ctx, c, "resume", process, "running", *isNew, func(s *bmdb.Session) (bool, error) {
			return s.ResumeProcess(ctx, process, bmdb.ControlChange{By: *by, Reason: *reason})
		})
	}
}

func capCommand(fs *flag.FlagSet) runFunc {
	reason, by := controlFlags(fs)
	none := fs.Bool("none", false, "remove the cap")
	isNew := newFlag(fs)
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
				return usagef("N %q: a cap is a number of live claims in [1, %d], or --none for no cap", args[1], bmdb.MaxCap)
			}
		}
		action := fmt.Sprintf("capped at %d live claims", n)
		if n == 0 {
			action = "no cap"
		}
		return control(ctx, c, "cap", process, action, *isNew, func(s *bmdb.Session) (bool, error) {
			return s.CapProcess(ctx, process, n, bmdb.ControlChange{By: *by, Reason: *reason})
		})
	}
}

// controlsCommand is controls delete PROCESS: it deletes the controls
// row of a process (bmdb.Session.DeleteProcessControls), which lifts its
// pause and cap, and so refuses a paused or capped process without
// --force.
func controlsCommand(fs *flag.FlagSet) runFunc {
	reason, by := controlFlags(fs)
	force := fs.Bool("force", false, "delete the controls of a paused or capped process too, which lifts its pause and cap")
	return func(ctx context.Context, c *common, args []string) error {
		if len(args) < 1 || args[0] != "delete" {
			return usagef("controls needs the subcommand delete")
		}
		process, err := oneProcess("controls delete", args[1:], "")
		if err != nil {
			return err
		}
		var deleted bool
		err = c.withSession(ctx, func(conn *bmdb.Connection) error {
			ctl, ok, err := fleet.ReadProcessControl(ctx, conn.DB(), process)
			if err != nil || !ok || !ctl.InForce() || *force {
				return err
			}
			return usagef("%s is %s: deleting its controls lifts that; pass --force to delete them anyway", process, ctl.State())
		}, func(sess *bmdb.Session) (err error) {
			deleted, err = sess.DeleteProcessControls(ctx, process, bmdb.ControlChange{By: *by, Reason: *reason})
			return err
		})
		if err != nil {
			return err
		}
		if !deleted && !c.json {
			_, err := fmt.Fprintf(c.out, "%s: no controls, nothing changed\n", process)
			return err
		}
		return printControl(c, process, "controls deleted", deleted)
	}
}
