package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/lib/pq"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/model"
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
	cfg     Config
	db      *sql.DB
	engine  engine
	stats   counters
	metrics *componentMetrics
	hooks   testHooks
	// prepared holds every model query prepared on the pool (once per
	// pooled connection): a transaction's statements skip parsing and
	// planning, and run in one round trip each.
	prepared *model.Queries
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
	heartbeatFailures   atomic.Int64
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
}

// Stats are cumulative figures of a Connection, for tests and metrics.
type Stats struct {
	// TxAttempts counts transaction attempts, first tries and retries.
	TxAttempts int64
	// TxRetries counts attempts that failed with a serialization error
	// and were retried.
	TxRetries int64
	// TxCommitRetries counts the TxRetries whose error came from COMMIT.
	TxCommitRetries int64
	// TxConnectionRetries counts attempts retried because the connection
	// failed before COMMIT (the server rolled them back).
	TxConnectionRetries int64
	// HeartbeatFailures counts failed heartbeat attempts.
	HeartbeatFailures int64
}

// Open connects to the database in cfg.DSN, detects whether it is
// CockroachDB or PostgreSQL, and migrates its schema up (unless
// cfg.SkipMigrations; then it only checks the version). ctx bounds the whole
// of Open, including connecting: an unreachable database fails when ctx is
// done (or after the DSN's connect_timeout).
//
// Errors wrap ErrInvalidArgument for a bad Config, or are a
// *SchemaVersionError for a schema this binary must not use; none contains
// the DSN's password.
func Open(ctx context.Context, cfg Config) (*Connection, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	db, err := openDB(ctx, cfg.DSN)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(cfg.MaxOpenConns)
	db.SetMaxIdleConns(cfg.MaxIdleConns)
	metrics := cfg.Metrics
	if metrics == nil {
		metrics, _ = NewMetrics(nil) // cannot fail without a registerer
	}
	c := &Connection{cfg: cfg, db: db, metrics: metrics.forComponent(cfg.ComponentName)}
	if err := c.setUp(ctx); err != nil {
		db.Close()
		return nil, err
	}
	if c.prepared, err = model.Prepare(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("bmdb: preparing statements: %w", redactError(contextError(ctx, err), cfg.DSN))
	}
	klog.V(1).Infof("bmdb: component %q connected to %s at %s", cfg.ComponentName, c.engine, redactDSN(cfg.DSN))
	return c, nil
}

// setUp detects the engine and brings the schema to this binary's version.
func (c *Connection) setUp(ctx context.Context) error {
	eng, err := detectEngine(ctx, c.db, c.cfg.DSN)
	if err != nil {
		return err
	}
	c.engine = eng
	if n := c.cfg.ClaimConcurrency; n > 0 || (n == 0 && eng == enginePostgres) {
		c.claimSlots = newSlots(max(n, 1))
	}
	return migrateOnOpen(ctx, c.db, c.cfg.DSN, c.engine, !c.cfg.SkipMigrations)
}

// detectEngine tells CockroachDB from PostgreSQL by SELECT version().
func detectEngine(ctx context.Context, db *sql.DB, dsn string) (engine, error) {
	var version string
	if err := db.QueryRowContext(ctx, "SELECT version()").Scan(&version); err != nil {
		return 0, fmt.Errorf("bmdb: detecting database engine at %s: %w", redactDSN(dsn), redactError(err, dsn))
	}
	if strings.Contains(version, "CockroachDB") {
		return engineCockroach, nil
	}
	return enginePostgres, nil
}

// openDB returns a pool for dsn that has connected once within ctx.
func openDB(ctx context.Context, dsn string) (*sql.DB, error) {
	connector, err := pq.NewConnector(dsn)
	if err != nil {
		var urlErr *url.Error
		if errors.As(err, &urlErr) {
			err = urlErr.Err // url.Error quotes the whole URL, password included
		}
		return nil, invalidArgument("Config.DSN is malformed: %v", redactError(err, dsn))
	}
	db := sql.OpenDB(connector)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, fmt.Errorf("bmdb: connecting to %s: %w", redactDSN(dsn), redactError(err, dsn))
	}
	return db, nil
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
		HeartbeatFailures:   c.stats.heartbeatFailures.Load(),
	}
}

// DB returns the connection's pool, for reads outside any session (progress
// displays, operators' queries). Writes belong in Session.Transact, which
// checks the session.
func (c *Connection) DB() *sql.DB { return c.db }

// ComponentName returns the component name the connection's sessions carry.
func (c *Connection) ComponentName() string { return c.cfg.ComponentName }
