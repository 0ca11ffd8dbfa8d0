package bmdb

import (
	"database/sql/driver"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"

	"github.com/bmdb-dev/bmdb/internal/procinfo"
	"github.com/bmdb-dev/bmdb/migrations"
)

// Limits of the arguments of Session methods, and Config's defaults.
const (
	// MaxCreateMachines is the most machines one Tx.CreateMachines call
	// creates: few enough that the call stays well within the default
	// Config.MaxTransactionDuration on CockroachDB
	// (TestCreateMachinesWithinTransactionBound).
	MaxCreateMachines = 10000

	// The defaults of Config's fields, stated on each field.
	sessionIntervalDefault      = 5 * time.Second
	maxTxAttemptsDefault        = 100
	maxIdleConnsDefault         = 32
	maxBatchSizeDefault         = 100
	maxConcurrentBatchesDefault = 1
	statementCacheSizeDefault   = 128
	// The default --max-offset of a CockroachDB cluster.
	maxClockOffsetDefault = 500 * time.Millisecond
	// A second below CockroachDB's default closed timestamp target
	// (kv.closed_timestamp.target_duration, 3 s), for the commit's round
	// trip and the clocks' offset.
	maxTransactionDurationDefault = 2 * time.Second

	// The longest Config.ComponentName, in bytes.
	maxComponentNameLength = 255
	// The longest Config.RuntimeInfo, in bytes.
	maxRuntimeInfoLength = 4096
	// The longest process name, in bytes.
	maxProcessLength = 128
	// The longest ControlChange.By, in bytes.
	maxControlByLength = 128
	// maxCauseLength is the longest failure cause stored by Work.Fail, in
	// bytes; longer causes are truncated (at a UTF-8 boundary), not refused,
	// so that a failure is always recorded.
	maxCauseLength = 4096
)

// Config configures a Connection. Only DSN and ComponentName are required.
// Its fields come in groups: identity and server, sessions, transactions,
// batching, pool, observability.
type Config struct {
	// Identity and server: what the component is, and where its database is.

	// DSN is the lib/pq connection string, as a URL
	// (postgres://user:password@host:port/db?sslmode=verify-full) or as
	// key=value pairs. It is passed to the driver unchanged; bmdb never logs
	// its password. Required.
	DSN string

	// ComponentName names the component in its sessions rows, e.g.
	// "provisioner". Required; at most 255 bytes.
	ComponentName string

	// RuntimeInfo is free text stored with each session for operators
	// (bmdbctl sessions, the web pages): which process, where, built from
	// what. At most 4096 bytes. Defaults to the program's name, host and
	// pid, and its build from the binary's build info (main package,
	// module version, VCS revision, Go version), e.g. "burnin on rack7-h3,
	// pid 4242; example.com/burnin/cmd/burnin v1.4.0 vcs 0123456789ab
	// go1.26.8".
	RuntimeInfo string

	// Application, if not nil, is the application's own schema, migrated
	// (or checked) by Open after bmdb's (see migrations.NewApplication).
	// Defaults to nil: bmdb's schema only.
	Application *migrations.Application

	// SkipMigrations, when true, makes Open only check that the database
	// schema is exactly at the version this binary embeds (bmdb's, and the
	// Application's), instead of migrating it up. Defaults to false
	// (migrate on Open).
	SkipMigrations bool

	// Sessions: how soon a dead component's claims stop counting, and garbage collection.

	// SessionInterval is a session's lifetime without a successful
	// heartbeat. Heartbeats run every SessionInterval/2. Must be positive
	// when set. Defaults to 5 s: a dead or partitioned component loses its
	// claims within about this long.
	SessionInterval time.Duration

	// MaxClockOffset is the CockroachDB cluster's maximum clock offset
	// (its --max-offset). A session there counts itself dead this much
	// before one interval after its last heartbeat, because another node's
	// clock may run ahead by up to this much and see the deadline pass
	// early; so SessionInterval must be at least twice MaxClockOffset, or
	// Open refuses it. Unused on PostgreSQL, whose one clock decides. Must
	// not be negative. Defaults to 500 ms, the default --max-offset of a
	// CockroachDB cluster.
	MaxClockOffset time.Duration

	// GCPeriod is how often each live session deletes sessions that expired
	// more than GCGracePeriod ago (recording Abandoned history for their
	// claims). Each wait is jittered by up to 25%. Claims of expired
	// sessions do not wait for it: the first claim that meets one among its
	// candidates takes its session over, and a session's claims of a
	// process sweep the process's expired claims every quarter interval
	// (see the package doc). It bounds how long a dead session's machines
	// wait for an application's retrieval that skips every claim row,
	// expired or not, even when no live session claims for the process
	// meanwhile: about GCGracePeriod + GCPeriod after the session's
	// deadline. Each pass scans the sessions table (on
	// CockroachDB at follower_read_timestamp()): a fleet of thousands of
	// components may raise it. Must be positive when set. Defaults to
	// SessionInterval.
	GCPeriod time.Duration

	// GCGracePeriod is how long an expired session row is kept before GC
	// deletes it. Expired sessions never block claims: Work takes their
	// claims over at once. On CockroachDB GC lists expired sessions as of
	// follower_read_timestamp(), about 4.8 s ago: below that, a live
	// session whose last heartbeat the listing did not see is locked, for
	// the length of a GC transaction, before GC finds it alive. Must not be
	// negative; zero means the default. Defaults to SessionInterval.
	GCGracePeriod time.Duration

	// Transactions: retries and bounds.

	// MaxTxAttempts bounds the attempts of one transaction that keeps
	// failing with serialization errors; then it returns
	// *RetriesExhaustedError. Must be positive when set. Defaults to 100.
	MaxTxAttempts int

	// MaxTransactionDuration bounds, on CockroachDB, how long one attempt
	// of a transaction (Transact's fn, a Work's retrieval, a Finish's
	// commit callback, with bmdb's own statements) may run before its
	// commit: one that ran longer returns an error wrapping
	// ErrTransactionTooLong and is not retried: on CockroachDB a
	// transaction older than the closed timestamp target (3 s by default)
	// is pushed and fails its read refresh if a heartbeat of its session
	// landed meanwhile, the likelier the longer it ran (txlimit.go). Keep it
	// below the cluster's kv.closed_timestamp.target_duration less the
	// commit latency. Not applied on PostgreSQL. Negative: no bound.
	// Defaults to 2 s, a second below CockroachDB's default closed
	// timestamp target, for the commit's round trip and the clocks' offset.
	MaxTransactionDuration time.Duration

	// SerializableBatches runs the batch transactions (the claims and
	// ends of Work, WorkMany, Finish, Cancel and Fail) SERIALIZABLE on
	// PostgreSQL, like Session.Transact: retrievals and commit callbacks
	// get PostgreSQL's full serializability, and processes' batches may
	// abort each other (and retry) through its page-level read tracking,
	// whatever machines they touch. By default they run at snapshot
	// isolation (REPEATABLE READ), under which batches neither wait for nor
	// abort each other unless they touch the same (machine, process): what
	// each guarantees is "Isolation" in the package doc. On CockroachDB
	// batches are SERIALIZABLE whatever this says (its conflicts are per
	// key). Defaults to false.
	SerializableBatches bool

	// Batching: how a session's claims and ends share transactions.

	// MaxBatchSize bounds how many calls of a session for one process one
	// batch serves (see "Batches" in the package doc). Must be in
	// [1, MaxWorkMany]; 1 gives every call a transaction of its own. Defaults
	// to 100.
	MaxBatchSize int

	// MaxConcurrentBatches bounds how many batch transactions of one
	// session and process run at once, each on a connection of its own:
	// when calls wait while a batch runs, the session's batcher starts
	// another batch for them, up to this many (see "Batches" in the
	// package doc). 1 runs one batch at a time: calls that arrive while
	// it runs wait and share the next, the largest batches, fastest for a
	// process with many handlers and for several processes alike
	// (bench/README.md). More lets a session's calls commit beside a
	// batch held up by a slow retrieval or commit callback, at the price
	// of smaller batches. Must be in [1, 64]. Defaults to 1.
	MaxConcurrentBatches int

	// Pool and connections.

	// MaxOpenConns bounds the connection pool (database/sql's
	// SetMaxOpenConns). Must not be negative; Open migrates only with 0 or
	// at least 2 (see migrations.Migrator), and refuses 1 with
	// ErrInvalidArgument when there is something to migrate. Defaults to
	// 0, no limit.
	MaxOpenConns int

	// MaxIdleConns is the number of idle pooled connections kept (database/sql's
	// SetMaxIdleConns). Must not be negative. Defaults to 32.
	MaxIdleConns int

	// NetworkTimeout bounds what no context bounds: connecting when the
	// caller's context has no deadline (database/sql opens connections in
	// the background too), and, as TCP keepalives and the TCP user timeout
	// where the platform has one, how long a connection may go without the
	// server acknowledging it before the kernel closes it. Calls with a
	// context are cut when it ends, whatever this says. Must not be
	// negative. Defaults to 2*SessionInterval, at least a second.
	NetworkTimeout time.Duration

	// StatementCacheSize is how many statements with parameters each
	// pooled connection keeps prepared, least recently used first out:
	// statements run through a Tx or DB() (retrievals, commit callbacks)
	// are prepared the second time a connection runs them, and then take
	// one round trip instead of lib/pq's two. A cached statement
	// whose result columns changed under it (ALTER TABLE) or that was
	// deallocated is prepared again; in a transaction, that attempt fails
	// and bmdb's transactions retry it. PostgreSQL may give a statement it
	// has run five times a generic plan, one for every parameter value; for
	// a query whose best plan depends on the value (a skewed column), set
	// plan_cache_mode=force_custom_plan for the role or database, or turn
	// the cache off. Negative keeps none of the application's statements
	// prepared (bmdb's own are prepared whatever this says); 0 means
	// 128. At most 10000.
	StatementCacheSize int

	// WrapConnector, if not nil, wraps lib/pq's driver.Connector, under
	// bmdb's driver wrapper, for the Connection's pool (Open's migrations
	// run on it too). For tests that stand in for another server
	// or inject its faults (cockroach mode is such a wrapper), or for
	// instrumentation. The connector it returns must return lib/pq's
	// connections, or forward every call to them (bmdb's wrapper above it
	// bounds each call by its context, cutting the socket when it ends,
	// and applies the server-side timeouts). Defaults to nil: lib/pq's
	// connector as it is.
	WrapConnector func(driver.Connector) driver.Connector

	// Observability: metrics and traces.

	// Metrics receives the connection's Prometheus metrics (see
	// NewMetrics). Defaults to nil: metrics are kept but exported nowhere.
	Metrics *Metrics

	// TracerProvider, if not nil, receives the connection's OpenTelemetry
	// spans: its calls', its batch transactions' and worker.Loop's (see
	// "Tracing" in the package doc). Pass otel.GetTracerProvider() to use
	// the global one. Defaults to nil: no span is started, at no cost
	// (not even OpenTelemetry's no-op spans).
	TracerProvider trace.TracerProvider
}

// withDefaults returns c with every unset field at its default.
func (c Config) withDefaults() Config {
	if c.RuntimeInfo == "" {
		c.RuntimeInfo = procinfo.Describe()
	}
	if c.SessionInterval == 0 {
		c.SessionInterval = sessionIntervalDefault
	}
	if c.GCPeriod == 0 {
		c.GCPeriod = c.SessionInterval
	}
	if c.GCGracePeriod == 0 {
		c.GCGracePeriod = c.SessionInterval
	}
	if c.MaxTxAttempts == 0 {
		c.MaxTxAttempts = maxTxAttemptsDefault
	}
	if c.MaxIdleConns == 0 {
		c.MaxIdleConns = maxIdleConnsDefault
	}
	if c.NetworkTimeout == 0 {
		c.NetworkTimeout = max(2*c.SessionInterval, time.Second)
	}
	if c.MaxClockOffset == 0 {
		c.MaxClockOffset = maxClockOffsetDefault
	}
	if c.StatementCacheSize == 0 {
		c.StatementCacheSize = statementCacheSizeDefault
	}
	if c.MaxBatchSize == 0 {
		c.MaxBatchSize = maxBatchSizeDefault
	}
	if c.MaxConcurrentBatches == 0 {
		c.MaxConcurrentBatches = maxConcurrentBatchesDefault
	}
	if c.MaxTransactionDuration == 0 {
		c.MaxTransactionDuration = maxTransactionDurationDefault
	}
	return c
}

// validate names the first field of c (after defaults) that is invalid.
func (c Config) validate() error {
	switch {
	case c.DSN == "":
		return invalidArgument("Config.DSN is empty")
	case c.ComponentName == "":
		return invalidArgument("Config.ComponentName is empty")
	case len(c.ComponentName) > maxComponentNameLength:
		return invalidArgument("Config.ComponentName is %d bytes long, more than %d", len(c.ComponentName), maxComponentNameLength)
	case !validText(c.ComponentName):
		return invalidArgument("Config.ComponentName is not valid UTF-8 or contains NUL")
	case len(c.RuntimeInfo) > maxRuntimeInfoLength:
		return invalidArgument("Config.RuntimeInfo is %d bytes long, more than %d", len(c.RuntimeInfo), maxRuntimeInfoLength)
	case !validText(c.RuntimeInfo):
		return invalidArgument("Config.RuntimeInfo is not valid UTF-8 or contains NUL")
	case c.SessionInterval <= 0:
		return invalidArgument("Config.SessionInterval is %v, must be positive", c.SessionInterval)
	case c.SessionInterval < 10*time.Millisecond:
		return invalidArgument("Config.SessionInterval is %v, must be at least 10ms", c.SessionInterval)
	case c.GCPeriod <= 0:
		return invalidArgument("Config.GCPeriod is %v, must be positive", c.GCPeriod)
	case c.GCGracePeriod < 0:
		return invalidArgument("Config.GCGracePeriod is %v, must not be negative", c.GCGracePeriod)
	case c.MaxTxAttempts <= 0:
		return invalidArgument("Config.MaxTxAttempts is %d, must be positive", c.MaxTxAttempts)
	case c.MaxConcurrentBatches < 1 || c.MaxConcurrentBatches > 64:
		return invalidArgument("Config.MaxConcurrentBatches is %d, must be in [1, 64]", c.MaxConcurrentBatches)
	case c.MaxOpenConns < 0:
		return invalidArgument("Config.MaxOpenConns is %d, must not be negative", c.MaxOpenConns)
	case c.MaxIdleConns < 0:
		return invalidArgument("Config.MaxIdleConns is %d, must not be negative", c.MaxIdleConns)
	case c.NetworkTimeout < 0:
		return invalidArgument("Config.NetworkTimeout is %v, must not be negative", c.NetworkTimeout)
	case c.MaxClockOffset < 0:
		return invalidArgument("Config.MaxClockOffset is %v, must not be negative", c.MaxClockOffset)
	case c.StatementCacheSize > 10000:
		return invalidArgument("Config.StatementCacheSize is %d, more than 10000", c.StatementCacheSize)
	case c.MaxBatchSize < 1 || c.MaxBatchSize > MaxWorkMany:
		return invalidArgument("Config.MaxBatchSize is %d, must be in [1, %d]", c.MaxBatchSize, MaxWorkMany)
	case c.Application != nil && c.Application.Validate() != nil:
		return fmt.Errorf("%w: Config.Application: %w", ErrInvalidArgument, c.Application.Validate())
	}
	return nil
}

// ValidateProcess returns an error wrapping ErrInvalidArgument, naming
// what is wrong, if process is not a valid process name. This is the one
// rule for process names, applied wherever one enters bmdb (Session.Work
// and its relatives, worker.Config.Process, bmdbctl's flags, the web
// pages' query parameters): a process name is 1 to 128 bytes
// of valid UTF-8 with no white space (spaces, tabs, newlines, or any other
// Unicode space) and no control characters (NUL, C0 and C1 controls,
// DEL). Letters of any script, digits and punctuation are fine, e.g.
// "burn-in" or "os_install.v2".
func ValidateProcess(process string) error {
	switch {
	case process == "":
		return invalidArgument("process name is empty")
	case len(process) > maxProcessLength:
		return invalidArgument("process name is %d bytes long, more than %d", len(process), maxProcessLength)
	case !utf8.ValidString(process):
		return invalidArgument("process name %q is not valid UTF-8", process)
	}
	for i, r := range process {
		switch {
		case unicode.IsControl(r):
			return invalidArgument("process name %q has a control character (%U) at byte %d", process, r, i)
		case unicode.IsSpace(r):
			return invalidArgument("process name %q has white space (%U) at byte %d", process, r, i)
		}
	}
	return nil
}

// truncateCause shortens cause to at most maxCauseLength bytes without
// splitting a UTF-8 sequence, and replaces invalid UTF-8.
func truncateCause(cause string) string {
	cause = toValidUTF8(cause)
	if len(cause) <= maxCauseLength {
		return cause
	}
	cut := maxCauseLength
	for cut > 0 && !utf8.RuneStart(cause[cut]) {
		cut--
	}
	return cause[:cut]
}

// toValidUTF8 replaces invalid UTF-8 and NUL bytes, which TEXT columns
// refuse, with U+FFFD.
func toValidUTF8(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// validText reports whether s can be stored in a TEXT column unchanged.
func validText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}
