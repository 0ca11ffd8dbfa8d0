package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/store"
)

// engine is the database product behind a Connection.
type engine int

const (
	enginePostgres engine = iota
	engineCockroach
)

func (e engine) String() string {
	if e == engineCockroach {
		return "CockroachDB"
	}
	return "PostgreSQL"
}

// Connection is a pool of database connections for one component, from which
// it starts sessions. It is safe for concurrent use. Close it when done; it
// does not close sessions, which must be closed first.
type Connection struct {
	cfg    Config
	db     *sql.DB
	engine engine
	// onPostgres is set when the server is PostgreSQL, whatever path the
	// engine takes (cockroach mode takes CockroachDB's on PostgreSQL).
	onPostgres bool
	// settings are the server-side bounds of the pool's connections.
	settings connSettings
	stats    counters
	metrics  *componentMetrics
	hooks    testHooks
	// prepared holds every model query prepared on the pool (once per
	// pooled connection): a transaction's statements skip parsing and
	// planning, and run in one round trip each.
	prepared *store.Queries
	// faults injects CockroachDB's errors in cockroach mode; nil: none.
	faults *faults
	// claimGate: batch transactions may take the claim gate
	// (PostgreSQL, ClaimConcurrency 0 or 1). Set by Open.
	claimGate bool
	// gateUntil is when the claim gate turns off again (UnixNano): batch
	// transactions take it only for gateHold after one of them failed
	// with a serialization error. Written and read by any goroutine.
	gateUntil atomic.Int64
	// claimSlots bounds concurrent claim transactions (ClaimConcurrency);
	// nil: no bound.
	claimSlots *slots

	closeOnce sync.Once
	closed    atomic.Bool
}

// counters are cumulative figures of a Connection, updated atomically.
type counters struct {
	txAttempts          atomic.Int64
	txRetries           atomic.Int64
	txConnectionRetries atomic.Int64
	txCommitRetries     atomic.Int64
	txLockTimeouts      atomic.Int64
	txDeadlocks         atomic.Int64
	heartbeatFailures   atomic.Int64
	claimCalls          atomic.Int64
	claimsAsked         atomic.Int64
	claimed             atomic.Int64
	claimConflicts      atomic.Int64
	claimNothingToDo    atomic.Int64
}

// testHooks let tests inside this package inject faults. Zero means none.
type testHooks struct {
	// beforePoke runs before every heartbeat attempt; a non-nil error fails
	// that attempt as if the database had returned it.
	beforePoke func(ctx context.Context) error
	// commit, if set, commits tx in place of tx.Commit, e.g. to report a
	// connection failure for a COMMIT that did or did not happen.
	commit func(tx *sql.Tx) error
	// afterSessionCheck runs inside every session transaction right after
	// its session check, e.g. to hold one there while another commits.
	afterSessionCheck func(session uuid.UUID)
	// beforeCommit runs inside every session transaction after its last
	// liveness check, right before COMMIT (RELEASE on CockroachDB).
	beforeCommit func(session uuid.UUID)
}

// Stats are cumulative figures of a Connection, for tests and metrics.
type Stats struct {
	// TxAttempts counts transaction attempts, first tries and retries.
	TxAttempts int64
	// TxRetries counts attempts that failed with a serialization error (or
	// a lock timeout, or a cached statement gone stale) and were retried.
	TxRetries int64
	// TxCommitRetries counts the TxRetries whose error came from COMMIT.
	TxCommitRetries int64
	// TxConnectionRetries counts attempts retried because the connection
	// failed before COMMIT (the server rolled them back).
	TxConnectionRetries int64
	// TxLockTimeouts counts the TxRetries whose error was a lock timeout
	// (55P03): the transaction waited lock_timeout for another one.
	TxLockTimeouts int64
	// TxDeadlocks counts the TxRetries whose error was a deadlock (40P01).
	TxDeadlocks int64
	// HeartbeatFailures counts failed heartbeat attempts.
	HeartbeatFailures int64

	// ClaimCalls counts the Work and WorkBatch calls that claimed, or
	// returned ErrWorkConflict or ErrNothingToDo.
	ClaimCalls int64
	// ClaimsAsked counts the machines those calls asked for (their limits).
	ClaimsAsked int64
	// Claimed counts the machines they claimed.
	Claimed int64
	// ClaimConflicts counts the calls that returned ErrWorkConflict: their
	// candidates were claimed, or being claimed, by other sessions. A
	// process that keeps getting them while others claim is losing its
	// candidates to them.
	ClaimConflicts int64
	// ClaimNothingToDo counts the calls that returned ErrNothingToDo.
	ClaimNothingToDo int64
}

// Open connects to the database in cfg.DSN, detects whether it is
// CockroachDB or PostgreSQL, and migrates its schema up (unless
// cfg.SkipMigrations; then it only checks the version). ctx bounds the whole
// of Open, connecting and migrating included, even against a server that
// accepts the connection and never answers.
//
// Every connection of the pool is bounded the same way afterwards: a call
// whose context ends has its socket cut at once (an *AbandonedError), and
// the connection is closed rather than reused. The server bounds each
// connection too: lock_timeout (SessionInterval/4) and
// idle_in_transaction_session_timeout (SessionInterval), so that a stalled
// client cannot hold locks past its lease; transactions on DB() get them
// as well.
//
// Errors wrap ErrInvalidArgument for a bad Config, or are a
// *SchemaVersionError for a schema this binary must not use; none contains
// the DSN's password.
func Open(ctx context.Context, cfg Config) (*Connection, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	mode := cfg.mode()
	settings := poolSettings(cfg, mode.Enabled)
	connector, err := newConnector(cfg.DSN, cfg.NetworkTimeout, settings, dbconn.NewFaults(mode))
	if err != nil {
		return nil, err
	}
	db, err := dbconn.OpenPool(ctx, connector, cfg.DSN)
	if err != nil {
		return nil, withConnectHint(err)
	}
	db.SetMaxOpenConns(cfg.MaxOpenConns)
	db.SetMaxIdleConns(cfg.MaxIdleConns)
	metrics := cfg.Metrics
	if metrics == nil {
		metrics, _ = NewMetrics(nil) // cannot fail without a registerer
	}
	c := &Connection{cfg: cfg, db: db, settings: settings, faults: connector.Faults(), metrics: metrics.forComponent(cfg.ComponentName)}
	if err := c.setUp(ctx, mode.Enabled); err != nil {
		db.Close()
		return nil, err
	}
	if c.prepared, err = store.Prepare(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("bmdb: preparing statements: %w", redactError(contextError(ctx, err), cfg.DSN))
	}
	klog.V(1).Infof("bmdb: component %q connected to %s at %s", cfg.ComponentName, c.engineName(), redactDSN(cfg.DSN))
	return c, nil
}

// poolSettings are the server-side bounds of a Connection's pool, and on
// CockroachDB (or in cockroach mode) the settings it pins.
func poolSettings(cfg Config, cockroachMode bool) connSettings {
	return connSettings{
		LockTimeout:       max(cfg.SessionInterval/4, 10*time.Millisecond),
		IdleInTransaction: cfg.SessionInterval,
		ConnectionCheck:   max(cfg.SessionInterval/4, 100*time.Millisecond),
		StmtCacheSize:     max(cfg.StatementCacheSize, 0),
		PinCockroach:      true,
		EmulatedCockroach: cockroachMode,
	}
}

// setUp detects the engine and brings the schema to this binary's version.
// In cockroach mode (package crdbmode) a PostgreSQL server is used as
// CockroachDB.
func (c *Connection) setUp(ctx context.Context, cockroachMode bool) error {
	eng, err := detectEngine(ctx, c.db, c.cfg.DSN)
	if err != nil {
		return err
	}
	c.engine, c.onPostgres = eng, eng == enginePostgres
	if cockroachMode {
		c.engine = engineCockroach
	}
	if c.engine == engineCockroach && c.cfg.SessionInterval < 2*c.cfg.MaxClockOffset {
		return invalidArgument("Config.SessionInterval is %v: on CockroachDB it must be at least twice Config.MaxClockOffset (%v), or less than half of it would be usable", c.cfg.SessionInterval, c.cfg.MaxClockOffset)
	}
	if n := c.cfg.ClaimConcurrency; n > 0 || (n == 0 && c.engine == enginePostgres) {
		c.claimSlots = newSlots(max(n, 1))
	}
	c.claimGate = c.engine == enginePostgres && c.cfg.ClaimConcurrency >= 0 && c.cfg.ClaimConcurrency <= 1
	return migrateOnOpen(ctx, c, !c.cfg.SkipMigrations)
}

// engineName names the engine and, in cockroach mode, the server.
func (c *Connection) engineName() string {
	if c.engine == engineCockroach && c.onPostgres {
		return "CockroachDB (cockroach mode on PostgreSQL)"
	}
	return c.engine.String()
}

// sessionLifetime is how long after the start of a successful heartbeat a
// session counts itself alive: the interval, less Config.MaxClockOffset on
// CockroachDB, whose now() is a node's clock that may run ahead of another
// node's by up to that much. On PostgreSQL one clock decides.
func (c *Connection) sessionLifetime() time.Duration {
	if c.engine != engineCockroach {
		return c.cfg.SessionInterval
	}
	return c.cfg.SessionInterval - c.cfg.MaxClockOffset
}

// detectEngine tells CockroachDB from PostgreSQL by SELECT version().
func detectEngine(ctx context.Context, db *sql.DB, dsn string) (engine, error) {
	cockroach, err := dbconn.IsCockroach(ctx, db, dsn)
	if err != nil || !cockroach {
		return enginePostgres, err
	}
	return engineCockroach, nil
}

// Close closes the pool. Sessions must be closed first: their heartbeats
// fail once the pool is gone. Close is idempotent; later calls return nil.
func (c *Connection) Close() error {
	var err error
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		err = errors.Join(c.prepared.Close(), c.db.Close())
	})
	return err
}

// Stats returns the connection's cumulative figures.
func (c *Connection) Stats() Stats {
	return Stats{
		TxAttempts:          c.stats.txAttempts.Load(),
		TxRetries:           c.stats.txRetries.Load(),
		TxCommitRetries:     c.stats.txCommitRetries.Load(),
		TxConnectionRetries: c.stats.txConnectionRetries.Load(),
		TxLockTimeouts:      c.stats.txLockTimeouts.Load(),
		TxDeadlocks:         c.stats.txDeadlocks.Load(),
		HeartbeatFailures:   c.stats.heartbeatFailures.Load(),
		ClaimCalls:          c.stats.claimCalls.Load(),
		ClaimsAsked:         c.stats.claimsAsked.Load(),
		Claimed:             c.stats.claimed.Load(),
		ClaimConflicts:      c.stats.claimConflicts.Load(),
		ClaimNothingToDo:    c.stats.claimNothingToDo.Load(),
	}
}

// DB returns the connection's pool, for reads outside any session (progress
// displays, operators' queries). Writes belong in Session.Transact, which
// checks the session.
func (c *Connection) DB() *sql.DB { return c.db }

// ComponentName returns the component name the connection's sessions carry.
func (c *Connection) ComponentName() string { return c.cfg.ComponentName }
