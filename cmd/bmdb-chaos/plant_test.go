package main

import (
	"context"
	"database/sql/driver"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/bmdb-dev/bmdb/cmd/bmdb-chaos/internal/chaos"
	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
)

// Planted bugs: the checker must catch each. A plant rewrites some of
// bmdb's statements on their way to the server, in the worker processes
// of a test (this test binary, run as plantedWorker), through
// bmdb.Config.WrapConnector: nothing of it is in bmdb or in the
// bmdb-chaos command. Each statement is told by the name sqlc puts first
// in its text; a plant whose statement no longer reads as it expects
// panics, so that a change of bmdb's statements fails its test loudly
// rather than plant nothing.

// plantedWorker is the first argument of a worker process with a plant;
// the plant's name follows.
const plantedWorker = "planted-worker"

// plant is a bug planted in bmdb's statements.
type plant struct {
	// rewrites maps a statement's name to how the plant rewrites it.
	rewrites map[string]func(query string) string
}

// replace returns a rewrite of the matches of re by repl, which panics if
// re matches nothing.
func replace(re, repl string) func(string) string {
	rx := regexp.MustCompile(re)
	return func(q string) string {
		if !rx.MatchString(q) {
			panic(fmt.Sprintf("plant: %q matches nothing in %q: bmdb's statement changed", re, q))
		}
		return rx.ReplaceAllString(q, repl)
	}
}

// The parts of the pre-COMMIT check: the liveness test at the statement's
// clock and the lowered idle timeout.
var (
	skipLiveness = replace(`(s\.)?deadline > statement_timestamp\(\)`, "TRUE")
	skipIdle     = replace(`'idle_in_transaction_session_timeout'`, "'bmdb_plant.idle_timeout'")
)

var plants = map[string]plant{
	// (a) The check before COMMIT skipped: the last statement of a
	// transaction neither checks the session at its clock nor lowers the
	// idle timeout to the lease left, so a COMMIT held up in the network
	// commits after the deadline. (A claim statement keeps its liveness
	// test: it is the transaction's first check too.)
	"skip-precommit-check": {rewrites: map[string]func(string) string{
		"SessionCheckBeforeCommit": func(q string) string { return skipIdle(skipLiveness(q)) },
		"WorkFinishMany":           func(q string) string { return skipIdle(skipLiveness(q)) },
		"WorkClaimMany":            skipIdle,
		"WorkClaimManyArbitrated":  skipIdle,
	}},
	// (b) A claim that does not write its (machine, process) work_fencing
	// row: it reads the token (and the history's sequence) but stores
	// neither them nor the claim. Both engines' claim statements.
	"no-fencing-write": {rewrites: map[string]func(string) string{
		"WorkClaimMany":           noFencingWrite,
		"WorkClaimManyArbitrated": noFencingWrite,
	}},
	// (c) Fencing tokens not incremented.
	"no-token-increment": {rewrites: map[string]func(string) string{
		"WorkClaimMany":           noTokenIncrement,
		"WorkClaimManyArbitrated": noTokenIncrement,
	}},
	// (d) No takeovers: a claim statement never finds a claim of an
	// expired session (neither among its candidates nor sweeping), so a
	// dead session's machines wait for GC, as before issue 36.
	"no-takeover": {rewrites: map[string]func(string) string{
		"WorkClaimMany":           noExpired,
		"WorkClaimManyArbitrated": noExpired,
	}},
}

// The rewrites of plants (b) and (c).
var (
	noFencingWrite = replace(`(?s)fence AS \(\s*UPDATE work_fencing f SET .*?\s+FROM claim WHERE (.*?)\s+RETURNING f\.machine_id, f\.token, f\.version\s*\)`,
		"fence AS (SELECT f.machine_id, f.token + 1 AS token, f.version + 1 AS version FROM work_fencing f JOIN claim ON $1)")
	noTokenIncrement = replace(`token = f\.token \+ 1`, "token = f.token")
)

// noExpired makes a claim statement see no session as expired.
var noExpired = replace(`s\.deadline <= statement_timestamp\(\)`, "FALSE")

var statementName = regexp.MustCompile(`^-- name: (\w+)`)

// rewrite applies p to query.
func (p plant) rewrite(query string) string {
	if m := statementName.FindStringSubmatch(query); m != nil {
		if fn := p.rewrites[m[1]]; fn != nil {
			return fn(query)
		}
	}
	return query
}

// wrap is the plant's bmdb.Config.WrapConnector.
func (p plant) wrap(inner driver.Connector) driver.Connector {
	return &plantConnector{Connector: inner, p: p}
}

type plantConnector struct {
	driver.Connector
	p plant
}

func (c *plantConnector) Connect(ctx context.Context) (driver.Conn, error) {
	raw, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &plantConn{PQConn: raw.(dbconn.PQConn), p: c.p}, nil
}

// plantConn forwards every call, with the statements rewritten.
type plantConn struct {
	dbconn.PQConn
	p plant
}

func (c *plantConn) Prepare(query string) (driver.Stmt, error) {
	return c.PQConn.Prepare(c.p.rewrite(query))
}

func (c *plantConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.PQConn.PrepareContext(ctx, c.p.rewrite(query))
}

func (c *plantConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return c.PQConn.ExecContext(ctx, c.p.rewrite(query), args)
}

func (c *plantConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.PQConn.QueryContext(ctx, c.p.rewrite(query), args)
}

// plantConfig is a short run of the harness for a plant: 4 workers with a
// Connection each (one session each, so that a held COMMIT's session is
// the one whose lease the harness waits out), faults of kinds only.
func plantConfig(faults int, kinds ...chaos.FaultKind) chaos.Config {
	cfg := chaos.CIConfig()
	cfg.Connections, cfg.Items, cfg.Faults, cfg.Kinds = 1, 60, faults, kinds
	cfg.Gap = [2]time.Duration{300 * time.Millisecond, 800 * time.Millisecond}
	cfg.DrainTimeout = 20 * time.Second
	return cfg
}

// slowGC makes cfg's workers collect garbage every 30 s, the fallback a
// dead session's machines wait for without takeovers (with 4 sessions
// collecting, about 7 to 30 s after the deadline: beyond the reclaim
// bound however much a loaded machine widens it), and keeps a queue of
// free machines (CI mode's items) beside them while the faults run.
func slowGC(cfg chaos.Config) chaos.Config {
	cfg.GCPeriod, cfg.DrainTimeout, cfg.Items = 30*time.Second, time.Minute, chaos.CIConfig().Items
	return cfg
}

// TestPlantedBugs runs the harness against each planted bug and checks
// that it reports the violation the bug must cause, with its sub-history.
func TestPlantedBugs(t *testing.T) {
	mode, err := crdbmode.FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		plant string
		cfg   chaos.Config
		want  []string // in one violation
		skip  string   // why the plant shows nothing in this mode
		// liveness: the violation is a liveness bound's, which the
		// checker widens on a loaded machine and waives while it is
		// overloaded (the workers measured delays their sessions could
		// not outlive): a run overloaded for more than a quarter of its
		// time that shows nothing is inconclusive, not a pass.
		liveness bool
	}{
		// COMMITs held past their session's deadline: committed anyway.
		{"skip-precommit-check", plantConfig(10, chaos.FaultCommitStall),
			[]string{"after its session's final deadline", "; claim "},
			map[bool]string{true: "cockroach mode runs batches SERIALIZABLE, and there PostgreSQL aborts a COMMIT held past " +
				"the takeover that read what it wrote (40001, read/write dependencies), check or no check"}[mode.Enabled], false},
		// Tokens repeat: a second claim of an item is not above the first.
		{"no-fencing-write", plantConfig(1, chaos.FaultTerminate),
			[]string{"not linearizable", "none of these can come next", "token 1", "visualisation: "}, "", false},
		// Tokens stay 0: not above the initial state's.
		{"no-token-increment", plantConfig(1, chaos.FaultTerminate),
			[]string{"not linearizable", "none of these can come next", "token 0", "visualisation: "}, "", false},
		// Killed workers' machines wait for GC, every 30 s here: worked
		// again after more than the reclaim bound, even widened by the
		// delays measured on a loaded machine.
		// Or, when the drain ends before GC comes (orWant), they are still
		// held by the dead sessions: stuck.
		{"no-takeover", slowGC(plantConfig(8, chaos.FaultKill)),
			[]string{"worked again", "counting only time with free machines, more than", "worst measured then"}, "", true},
	} {
		t.Run(tc.plant, func(t *testing.T) {
			if tc.skip != "" {
				t.Skip(tc.skip)
			}
			report, _ := runChaos(t, tc.cfg, plantedWorker, tc.plant)
			for _, v := range report.Violations {
				if containsAll(v, tc.want) || (orWant[tc.plant] != nil && containsAll(v, orWant[tc.plant])) {
					t.Logf("caught: %s", v)
					if i := strings.Index(v, "visualisation: "); i >= 0 {
						if _, err := os.Stat(strings.TrimSpace(v[i+len("visualisation: "):])); err != nil {
							t.Errorf("visualisation: %v", err)
						}
					}
					return
				}
			}
			if tc.liveness && report.Overloaded > report.Runtime/4 {
				t.Skipf("no violation mentions all of %q, but the machine was overloaded for %v of the run's %v: inconclusive",
					tc.want, report.Overloaded.Round(time.Millisecond), report.Runtime.Round(time.Millisecond))
			}
			t.Fatalf("no violation mentions all of %q (worker logs kept in %s)", tc.want, report.LogDir)
		})
	}
}

// orWant are other words that catch a plant, by plant.
var orWant = map[string][]string{
	"no-takeover": {"stuck: no effect", "claimed by session", "expired"},
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
