// Package crdbmode is the test switch that makes bmdb take its CockroachDB
// code paths on a PostgreSQL server, and inject the errors CockroachDB
// produces, so that those paths run on every CI run although no CockroachDB
// server can be installed there.
//
// In this mode a Connection opened on PostgreSQL behaves as on CockroachDB:
// transactions retry through crdb.ExecuteInTx (savepoint restarts), Open
// migrates with golang-migrate's cockroachdb driver, sessions keep the clock
// margin, and claim transactions are not serialised per connection. The
// injector then fails statements inside transactions with 40001, RELEASE
// SAVEPOINT with 40001, and (when enabled) the commit point with 40003 or a
// lost connection, committed or not.
//
// It also emulates two of CockroachDB's behaviours PostgreSQL lacks: a
// transaction older than the closed timestamp whose session row a
// heartbeat rewrote since it began fails its read refresh (40001 at
// RELEASE), and migrations run one statement at a time (as CockroachDB
// 25.x applies a multi-statement file with autocommit_before_ddl), failing
// between two statements when a test asks for it; and a session check,
// a plain read there, waits for a transaction writing the session row (a
// heartbeat, a takeover) and times out at lock_timeout.
//
// It does not reproduce CockroachDB's clocks, its schema changer, its
// per-key conflicts or its transaction heartbeats: see docs/cockroachdb.md.
//
// Only code in this module can set it: tests call FromEnv in TestMain, and
// worker processes of the chaos harness are started with the same
// environment.
package crdbmode

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// EnvVar turns the mode on for a test binary: "1" for the defaults, or a
// comma-separated list of key=value among retry=RATE, ambiguous=RATE,
// closedts=DURATION and seed=N (rates in [0, 1]).
const EnvVar = "BMDB_TEST_COCKROACH"

// Defaults of the injection rates, per statement inside a transaction
// (retry) and per commit (ambiguous).
const (
	RetryRateDefault     = 0.02
	AmbiguousRateDefault = 0
)

// ClosedTimestampDefault is CockroachDB's kv.closed_timestamp.target_duration.
const ClosedTimestampDefault = 3 * time.Second

// Settings are the mode's switches.
type Settings struct {
	// Enabled makes new Connections on PostgreSQL take CockroachDB's paths.
	Enabled bool
	// RetryRate is the chance that a statement inside a transaction, or
	// its RELEASE SAVEPOINT, fails with 40001 instead of running.
	RetryRate float64
	// AmbiguousRate is the chance that a commit fails with 40003 or with a
	// lost connection, either before or after it took effect.
	AmbiguousRate float64
	// Seed seeds the injector's choices (0: random).
	Seed uint64
	// ClosedTimestamp is the emulated kv.closed_timestamp.target_duration:
	// a transaction older than this at RELEASE whose session row a
	// heartbeat wrote after it began fails its read refresh. 0:
	// ClosedTimestampDefault; negative: never.
	ClosedTimestamp time.Duration
	// MigrationFailAfter, if positive, fails the next multi-statement
	// migration file after that many of its statements ran (each committed
	// on its own), once.
	MigrationFailAfter int
}

// ClosedTimestampTarget returns s.ClosedTimestamp with its default
// applied; 0 means never.
func (s Settings) ClosedTimestampTarget() time.Duration {
	switch {
	case s.ClosedTimestamp == 0:
		return ClosedTimestampDefault
	case s.ClosedTimestamp < 0:
		return 0
	}
	return s.ClosedTimestamp
}

var current atomic.Pointer[Settings]

// Set switches the mode for Connections opened from now on.
func Set(s Settings) { current.Store(&s) }

// Get returns the current settings (the zero Settings when unset).
func Get() Settings {
	if s := current.Load(); s != nil {
		return *s
	}
	return Settings{}
}

// FromEnv sets the mode from EnvVar, if it is set, and returns the result.
func FromEnv() (Settings, error) {
	v := strings.TrimSpace(os.Getenv(EnvVar))
	if v == "" || v == "0" {
		return Get(), nil
	}
	s := Settings{Enabled: true, RetryRate: RetryRateDefault, AmbiguousRate: AmbiguousRateDefault}
	if v != "1" {
		for _, kv := range strings.Split(v, ",") {
			key, value, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok {
				return Settings{}, fmt.Errorf("%s: %q is not key=value", EnvVar, kv)
			}
			var err error
			switch key {
			case "retry":
				s.RetryRate, err = rate(value)
			case "ambiguous":
				s.AmbiguousRate, err = rate(value)
			case "seed":
				s.Seed, err = strconv.ParseUint(value, 10, 64)
			case "closedts":
				s.ClosedTimestamp, err = time.ParseDuration(value)
			default:
				err = fmt.Errorf("unknown key %q (want retry, ambiguous, closedts or seed)", key)
			}
			if err != nil {
				return Settings{}, fmt.Errorf("%s: %w", EnvVar, err)
			}
		}
	}
	Set(s)
	return s, nil
}

func rate(v string) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f >= 0 && f <= 1) {
		return 0, fmt.Errorf("rate %q is not a number in [0, 1]", v)
	}
	return f, nil
}

// Counts of injected errors, across the process, for reports.
var (
	InjectedRetryable atomic.Int64 // 40001 on a statement or at RELEASE
	InjectedAmbiguous atomic.Int64 // 40003 at the commit point
	InjectedConnLoss  atomic.Int64 // connection lost at the commit point
	InjectedRefresh   atomic.Int64 // 40001 at RELEASE: read refresh failed

	InjectedMigrationFailures atomic.Int64 // a migration file stopped half-way
	InjectedReadWaits         atomic.Int64 // a session check timed out waiting for a writer
)

// Report returns the counts as one line.
func Report() string {
	return fmt.Sprintf("cockroach mode: injected %d retryable (40001), %d ambiguous (40003), %d lost connections at commit, %d failed read refreshes, %d reads timed out waiting for a writer",
		InjectedRetryable.Load(), InjectedAmbiguous.Load(), InjectedConnLoss.Load(), InjectedRefresh.Load(), InjectedReadWaits.Load())
}
