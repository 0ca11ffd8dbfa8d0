// Package crdbmode is cockroach mode: an Emulator (emulator.go) that stands
// in for CockroachDB in front of a PostgreSQL server, installed by tests
// through bmdb.Config.WrapConnector, so that bmdb's CockroachDB code paths
// run on every CI run although no CockroachDB server can be installed
// there. Nothing in bmdb knows of it: bmdb detects CockroachDB from what
// the server says, and meets what CockroachDB does.
//
// With it, a Connection opened on PostgreSQL behaves as on CockroachDB:
// transactions retry through crdb.ExecuteInTx (savepoint restarts, each
// with a new snapshot), Open migrates one statement at a time, sessions
// keep the clock margin, and the errors CockroachDB
// produces are injected: 40001 on statements of a transaction and at
// RELEASE SAVEPOINT, an ambiguous commit point (40003 or a lost
// connection, committed or not), a failed read refresh of a transaction
// older than the closed timestamp, session checks that wait for a writer
// of their row, plain reads that wait for exclusive locks, a
// transaction's own idle timeout that changes nothing, and migration
// scripts run as the emulated version runs them (one transaction that
// refuses what CockroachDB refuses in one, or one commit per statement
// with autocommit_before_ddl on: ddl.go), and, if asked, a role's
// disallow_full_table_scans (fullscan.go).
//
// It does not reproduce CockroachDB's clocks, its schema changer, its
// per-key conflicts or its transaction heartbeats: see docs/cockroachdb.md.
//
// Test binaries turn it on with EnvVar (FromEnv), and the chaos harness
// passes that environment to its worker processes.
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
// closedts=DURATION, seed=N, version=MAJOR.MINOR, clockoffset=DURATION,
// autocommit=on|off and fullscans=on|off (rates in [0, 1]; versions as
// ParseVersion takes them; autocommit is the role's autocommit_before_ddl,
// Settings.AutocommitBeforeDDL; fullscans=off is the role's
// disallow_full_table_scans, Settings.DisallowFullTableScans).
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
	// Enabled turns the mode on (FromEnv); an Emulator emulates whatever
	// this says.
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
	// a transaction older than this at RELEASE is pushed to that long ago,
	// and fails its read refresh if a heartbeat wrote its session row
	// between its start and then. 0: ClosedTimestampDefault; negative:
	// never.
	ClosedTimestamp time.Duration
	// MigrationFailAfter, if positive, fails the next migration after
	// that many of its statements ran, once (ddl.go): a script of several
	// statements (whose transaction, if it runs as one, commits nothing),
	// or the statements a connection runs one by one between its version
	// table's dirty and clean marks (which stay applied).
	MigrationFailAfter int
	// Version is the CockroachDB release emulated (zero: VersionDefault).
	Version Version
	// ClockOffset shifts the clock the Emulator's connections read
	// (now(), statement_timestamp(), clock_timestamp()), as a gateway
	// node's clock may be off from another's by up to the cluster's
	// maximum offset (locking.go).
	ClockOffset time.Duration
	// AutocommitBeforeDDL, if not nil, is the emulated role's
	// autocommit_before_ddl (ALTER ROLE ... SET), which decides how a
	// script of several statements runs (ddl.go); only for versions that
	// have the setting (24.1 and later). nil: the version's default, on
	// from 25.1.
	AutocommitBeforeDDL *bool
	// DisallowFullTableScans is the role's disallow_full_table_scans: each
	// of bmdb's statements whose plan needs a full scan fails as on
	// CockroachDB (fullscan.go).
	DisallowFullTableScans bool
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

// FromEnv returns the mode EnvVar asks for: off if it is unset.
func FromEnv() (Settings, error) {
	v := strings.TrimSpace(os.Getenv(EnvVar))
	if v == "" || v == "0" {
		return Settings{}, nil
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
			case "version":
				s.Version, err = ParseVersion(value)
			case "clockoffset":
				s.ClockOffset, err = time.ParseDuration(value)
			case "autocommit":
				s.AutocommitBeforeDDL, err = onOff(value)
			case "fullscans":
				var allowed *bool
				if allowed, err = onOff(value); err == nil {
					s.DisallowFullTableScans = !*allowed
				}
			default:
				err = fmt.Errorf("unknown key %q (want retry, ambiguous, closedts, seed, version, clockoffset, autocommit or fullscans)", key)
			}
			if err != nil {
				return Settings{}, fmt.Errorf("%s: %w", EnvVar, err)
			}
		}
	}
	if s.AutocommitBeforeDDL != nil && !s.Version.HasAutocommitBeforeDDL() {
		return Settings{}, fmt.Errorf("%s: autocommit: version %v has no autocommit_before_ddl (24.1 and later have)", EnvVar, s.Version)
	}
	return s, nil
}

func onOff(v string) (*bool, error) {
	switch v {
	case "on":
		return new(true), nil
	case "off":
		return new(false), nil
	}
	return nil, fmt.Errorf("%q is not on or off", v)
}

func rate(v string) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f >= 0 && f <= 1) {
		return 0, fmt.Errorf("rate %q is not a number in [0, 1]", v)
	}
	return f, nil
}

// Kind is a kind of injected error.
type Kind int

// Kinds of injected errors.
const (
	Retryable         Kind = iota // 40001 on a statement or at RELEASE
	Ambiguous                     // 40003 at the commit point
	ConnLoss                      // connection lost at the commit point
	Refresh                       // 40001 at RELEASE: read refresh failed
	MigrationFailures             // a migration file stopped half-way
	ReadWaits                     // a read timed out waiting for a writer or an exclusive lock
	LocksAtFetch                  // a locking read's fetched rows locked before its filters (not an error)
	kinds
)

// Counts are the errors Emulators injected, by Kind, for reports; one
// Counts may serve every Emulator of a test binary. Safe for concurrent
// use.
type Counts struct{ n [kinds]atomic.Int64 }

// Of returns how many errors of kind were injected.
func (c *Counts) Of(kind Kind) int64 { return c.n[kind].Load() }

// Report returns the counts as one line.
func (c *Counts) Report() string {
	return fmt.Sprintf("cockroach mode: injected %d retryable (40001), %d ambiguous (40003), %d lost connections at commit, %d failed read refreshes, %d reads timed out waiting for a writer or a lock; locked at fetch %d times",
		c.Of(Retryable), c.Of(Ambiguous), c.Of(ConnLoss), c.Of(Refresh), c.Of(ReadWaits), c.Of(LocksAtFetch))
}
