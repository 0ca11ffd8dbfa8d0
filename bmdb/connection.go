package bmdb

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/internal/counters"
	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/lease"
	"github.com/bmdb-dev/bmdb/internal/tracing"
	"github.com/bmdb-dev/bmdb/internal/txn"
	"github.com/bmdb-dev/bmdb/migrations"
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
	// settings are the server-side bounds of the pool's connections.
	settings connSettings
	counters *counters.Counters // what it did: Stats, and metrics
	metrics  *Metrics           // where its histograms are observed, and its counters exported
	// runner runs every transaction (package txn); collector its GC
	// passes (package lease).
	runner    *txn.Runner
	collector *lease.Collector
	// leaseHooks let tests inside this package inject faults into its
	// sessions (lease.Hooks); zero means none.
	leaseHooks lease.Hooks
	// batchTx is the isolation of batch transactions (Config.SerializableBatches)
	// on PostgreSQL; CockroachDB's are SERIALIZABLE. Set by Open.
	batchTx *sql.TxOptions
	// tracer starts the spans of its sessions' calls and batches
	// (Config.TracerProvider; off when nil).
	tracer tracing.Tracer

	closeOnce sync.Once
}

// Open connects to the database in cfg.DSN, detects whether it is
// CockroachDB or PostgreSQL, and migrates its schema up (unless
// cfg.SkipMigrations; then it only checks the version). ctx bounds the whole
// of Open, connecting and migrating included, even against a server that
// accepts the connection and never answers.
//
// Every connection of the pool is bounded the same way afterwards: a call
// whose context ends has its socket cut at once (its error wraps the
// context's cause, and what the driver reported), and
// the connection is closed rather than reused. The server bounds each
// connection too: lock_timeout (SessionInterval/4) and
// idle_in_transaction_session_timeout (SessionInterval), so that a stalled
// client cannot hold locks past its lease; transactions on DB() get them
// as well.
//
// Errors wrap ErrInvalidArgument for a bad Config, or are a
// *migrations.SchemaVersionError for a schema this binary must not use
// (migrations.ErrSchemaTooNew, ErrSchemaTooOld, ErrSchemaDirty: a dirty one
// says how to repair it); none contains the DSN's password.
func Open(ctx context.Context, cfg Config) (*Connection, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	settings := poolSettings(cfg)
	connector, err := newConnector(cfg.DSN, cfg.NetworkTimeout, settings, cfg.WrapConnector)
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
	c := &Connection{cfg: cfg, db: db, settings: settings, metrics: metrics, counters: &counters.Counters{}, tracer: tracing.New(cfg.TracerProvider)}
	metrics.add(cfg.ComponentName, c.counters)
	if err := c.setUp(ctx); err != nil {
		db.Close()
		return nil, err
	}
	c.runner = &txn.Runner{
		DB: db, Cockroach: c.engine == engineCockroach, MaxAttempts: cfg.MaxTxAttempts,
		MaxAttemptDuration: cfg.MaxTransactionDuration, Counters: c.counters,
	}
	c.collector = &lease.Collector{Runner: c.runner, Grace: cfg.GCGracePeriod}
	klog.V(1).Infof("bmdb: component %q connected to %s at %s", cfg.ComponentName, c.engineName(), redactDSN(cfg.DSN))
	return c, nil
}

// poolSettings are the server-side bounds of a Connection's pool, and on
// CockroachDB the settings it pins.
func poolSettings(cfg Config) connSettings {
	return connSettings{
		LockTimeout:       max(cfg.SessionInterval/4, 10*time.Millisecond),
		IdleInTransaction: cfg.SessionInterval,
		ConnectionCheck:   max(cfg.SessionInterval/4, 100*time.Millisecond),
		StmtCacheSize:     max(cfg.StatementCacheSize, 0),
		PinCockroach:      true,
	}
}

// setUp detects the engine and brings the schema to this binary's version.
func (c *Connection) setUp(ctx context.Context) error {
	eng, err := detectEngine(ctx, c.db, c.cfg.DSN)
	if err != nil {
		return err
	}
	c.engine = eng
	if c.engine == engineCockroach && c.cfg.SessionInterval < 2*c.cfg.MaxClockOffset {
		return invalidArgument("Config.SessionInterval is %v: on CockroachDB it must be at least twice Config.MaxClockOffset (%v), or less than half of it would be usable", c.cfg.SessionInterval, c.cfg.MaxClockOffset)
	}
	c.batchTx = txn.Serializable
	if c.engine == enginePostgres && !c.cfg.SerializableBatches {
		c.batchTx = txn.Snapshot
	}
	if c.engine == engineCockroach {
		c.logClusterSettings(ctx)
	}
	// The schemas (package migrations), on this Connection's pool.
	info := c.cfg.ComponentName + " (" + c.cfg.RuntimeInfo + ")" // RuntimeInfo has its default
	m, err := migrations.New(c.db, &migrations.Config{Application: c.cfg.Application, HolderInfo: truncateCause(info)})
	switch {
	case err != nil:
	case c.cfg.SkipMigrations:
		err = m.Check(ctx)
	default:
		_, err = m.Up(ctx)
	}
	return redactError(err, c.cfg.DSN)
}

// Cluster settings bmdb's reasoning on CockroachDB depends on, which it
// cannot pin (docs/cockroachdb.md, "Settings that matter"): read and
// logged at Open where the user may read them (VIEWCLUSTERSETTING).
const (
	sqlClosedTimestampTarget = "SHOW CLUSTER SETTING kv.closed_timestamp.target_duration"
	sqlExclusiveLocksBlock   = "SHOW CLUSTER SETTING kv.lock.exclusive_locks_block_non_locking_reads.enabled"
)

// logClusterSettings logs the cluster settings above, and warns when
// Config.MaxTransactionDuration is not below the closed timestamp target
// (Config.MaxTransactionDuration says why it must be).
func (c *Connection) logClusterSettings(ctx context.Context) {
	var closed, blocks string
	err := c.db.QueryRowContext(ctx, sqlClosedTimestampTarget).Scan(&closed)
	if err == nil {
		err = c.db.QueryRowContext(ctx, sqlExclusiveLocksBlock).Scan(&blocks)
	}
	if err != nil {
		klog.Infof("bmdb: could not read the cluster settings kv.closed_timestamp.target_duration and kv.lock.exclusive_locks_block_non_locking_reads.enabled (%v); "+
			"bmdb assumes their defaults, 3s and true (docs/cockroachdb.md)", redactError(err, c.cfg.DSN))
		return
	}
	klog.V(1).Infof("bmdb: cluster settings: kv.closed_timestamp.target_duration = %s, kv.lock.exclusive_locks_block_non_locking_reads.enabled = %s", closed, blocks)
	if target, perr := parseCockroachDuration(closed); perr == nil && c.cfg.MaxTransactionDuration >= 0 && c.cfg.MaxTransactionDuration >= target {
		klog.Warningf("bmdb: Config.MaxTransactionDuration (%v) is not below the cluster's kv.closed_timestamp.target_duration (%v): transactions that run that long may fail their read refresh (docs/cockroachdb.md)",
			c.cfg.MaxTransactionDuration, target)
	}
	if blocks != "true" {
		klog.Infof("bmdb: kv.lock.exclusive_locks_block_non_locking_reads.enabled is %s: plain reads do not wait for claims' locks (docs/cockroachdb.md)", blocks)
	}
}

// parseCockroachDuration parses a duration as SHOW CLUSTER SETTING prints
// it, e.g. "00:00:03" or "3s".
func parseCockroachDuration(s string) (time.Duration, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return d, nil
	}
	var h, m int
	var sec float64
	if _, err := fmt.Sscanf(s, "%d:%d:%f", &h, &m, &sec); err != nil {
		return 0, err
	}
	return time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + time.Duration(sec*float64(time.Second)), nil
}

// engineName names the engine.
func (c *Connection) engineName() string { return c.engine.String() }

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
		c.runner.Closed.Store(true)
		err = c.db.Close()
	})
	return err
}

// closed reports whether Close was called.
func (c *Connection) closed() bool { return c.runner.Closed.Load() }

// DB returns the connection's pool, for reads outside any session (progress
// displays, operators' queries). Writes belong in Session.Transact, which
// checks the session.
func (c *Connection) DB() *sql.DB { return c.db }
