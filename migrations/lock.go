package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/wait"
)

// Migrators take turns through one row of bmdb_migration_lock: a lease on
// the database clock. The holder renews it while it migrates and deletes it
// when done; a holder that dies leaves a row that expires by itself, and
// the next migrator takes it over. Neither engine's lock is relied upon:
// golang-migrate's cockroachdb driver locks with a row that does not wait
// and survives a crash, and PostgreSQL's advisory locks do not exist on
// CockroachDB. Reading the schema version takes no lock at all.

// migrationLease is how long a migrator's lease lasts without renewal: a
// migrator killed while migrating delays the next one by at most this.
// Tests shorten it (setLease).
var migrationLease atomic.Int64 // nanoseconds

func init() { migrationLease.Store(int64(15 * time.Second)) }

// lease returns migrationLease.
func lease() time.Duration { return time.Duration(migrationLease.Load()) }

// setLease sets how long a migrator's lease lasts without renewal, and
// returns the previous value (tests).
func setLease(d time.Duration) time.Duration { return time.Duration(migrationLease.Swap(int64(d))) }

// retryDelay returns the jittered wait before retry number attempt (from
// 1) of a lost CREATE TABLE race.
func retryDelay(attempt int) time.Duration {
	d := min(2*time.Millisecond<<min(attempt-1, 8), 250*time.Millisecond)
	return d/2 + rand.N(d/2+1)
}

// Statements of the migration lock: constant text, values as parameters.
// The table is created before any migration runs, so it is not part of
// them (nor of sqlc's schema).
const (
	createMigrationLockSQL = `CREATE TABLE IF NOT EXISTS bmdb_migration_lock (
    lock_id INT8 PRIMARY KEY CHECK (lock_id = 1),
    holder UUID NOT NULL,
    holder_info TEXT NOT NULL,
    acquired_at TIMESTAMPTZ NOT NULL,
    deadline TIMESTAMPTZ NOT NULL
)`
	acquireMigrationLockSQL = `INSERT INTO bmdb_migration_lock (lock_id, holder, holder_info, acquired_at, deadline)
VALUES (1, $1, $2, statement_timestamp(), statement_timestamp() + $3::FLOAT8 * INTERVAL '1 second')
ON CONFLICT (lock_id) DO UPDATE
SET holder = excluded.holder, holder_info = excluded.holder_info,
    acquired_at = excluded.acquired_at, deadline = excluded.deadline
WHERE bmdb_migration_lock.deadline < statement_timestamp()
RETURNING holder`
	renewMigrationLockSQL = `UPDATE bmdb_migration_lock
SET deadline = statement_timestamp() + $2::FLOAT8 * INTERVAL '1 second'
WHERE lock_id = 1 AND holder = $1`
	releaseMigrationLockSQL = `DELETE FROM bmdb_migration_lock WHERE lock_id = 1 AND holder = $1`
	readMigrationLockSQL    = `SELECT holder, holder_info, acquired_at, deadline, deadline > statement_timestamp()
FROM bmdb_migration_lock WHERE lock_id = 1`
	clearMigrationLockSQL = `DELETE FROM bmdb_migration_lock`

	// schema_lock is golang-migrate's cockroachdb driver's lock, which
	// bmdb binaries before the driver of bmdb's (driver.go) took under the
	// lease; ClearLock still clears a row one of them left.
	clearCockroachLockSQL = `DELETE FROM schema_lock`
)

// Codes of a lost race between concurrent CREATE TABLE IF NOT EXISTS on
// PostgreSQL: the relation, or its row type, already exists (besides a
// unique violation in the catalog, 23505).
const (
	codeDuplicateTable  = "42P07"
	codeDuplicateObject = "42710"
)

// ensureTable runs a CREATE TABLE IF NOT EXISTS, retrying the races that
// concurrent creators lose on PostgreSQL and the retries of CockroachDB's
// schema changes, until ctx ends.
func ensureTable(ctx context.Context, db *sql.DB, createSQL string) error {
	for attempt := 1; ; attempt++ {
		_, err := db.ExecContext(ctx, createSQL)
		switch code := dbconn.SQLState(err); {
		case err == nil:
			return nil
		case code == dbconn.CodeUniqueViolation || code == codeDuplicateTable || code == codeDuplicateObject || dbconn.IsRetryable(err):
			if err := wait.Sleep(ctx, retryDelay(attempt)); err != nil {
				return err
			}
		default:
			return err
		}
	}
}

// migrationLock is a held lease. release ends it.
type migrationLock struct {
	db     *sql.DB
	holder uuid.UUID
	stop   context.CancelFunc
	wg     sync.WaitGroup
}

// acquireMigrationLock waits, with jittered growing polls bounded by ctx,
// until it holds the lease, and renews it in the background until release.
// While it waits it logs whom it waits for (holder, since when, until
// when), again whenever the holder changes; if ctx ends first, its error
// names the holder too.
func acquireMigrationLock(ctx context.Context, db *sql.DB, info string) (*migrationLock, error) {
	if err := ensureTable(ctx, db, createMigrationLockSQL); err != nil {
		return nil, fmt.Errorf("migrations: creating bmdb_migration_lock: %w", dbconn.ContextError(ctx, err))
	}
	holder := uuid.New()
	poll := 20 * time.Millisecond
	start := time.Now()
	var held *Lock // the lease we wait for, as last read
	for {
		var got uuid.UUID
		err := db.QueryRowContext(ctx, acquireMigrationLockSQL, holder, info, lease().Seconds()).Scan(&got)
		switch {
		case err == nil:
			if held != nil {
				klog.Infof("migrations: took the migration lock after waiting %v for %s", time.Since(start).Round(time.Millisecond), held.describe(true))
			}
			l := &migrationLock{db: db, holder: holder}
			l.renewInBackground()
			return l, nil
		case ctx.Err() != nil:
			return nil, waitedErr(ctx, db, start, held)
		case !errors.Is(err, sql.ErrNoRows) && !dbconn.IsRetryable(err):
			return nil, fmt.Errorf("migrations: taking the migration lock: %w", err)
		}
		if lock, err := readMigrationLock(ctx, db); err == nil && lock != nil {
			if held == nil || lock.Holder != held.Holder {
				klog.Infof("migrations: waiting for the migration lock held by %s", lock.describe(false))
			}
			held = lock
		}
		if err := wait.Sleep(ctx, poll/2+rand.N(poll/2+1)); err != nil {
			return nil, waitedErr(ctx, db, start, held)
		}
		poll = min(2*poll, 500*time.Millisecond)
	}
}

// waitedErr is acquireMigrationLock's error when ctx ended while it
// waited since start: it names the holder, as last read (held), or, if
// ctx ended before the lease was ever read, as read now in a short
// detached read.
func waitedErr(ctx context.Context, db *sql.DB, start time.Time, held *Lock) error {
	waited := time.Since(start).Round(time.Millisecond)
	if held == nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		held, _ = readMigrationLock(rctx, db)
		cancel()
	}
	if held != nil {
		return fmt.Errorf("migrations: waited %v for the migration lock held by %s: %w", waited, held.describe(false), context.Cause(ctx))
	}
	return fmt.Errorf("migrations: waiting %v for the migration lock: %w", waited, context.Cause(ctx))
}

// lockTimeFormat is how messages show the lease's times.
const lockTimeFormat = "2006-01-02T15:04:05.000Z07:00"

// describe says who holds l, since when and until when; taken says that
// the lock has since been taken from it (released, or expired).
func (l *Lock) describe(taken bool) string {
	s := fmt.Sprintf("%q (lease %s) since %s", l.HolderInfo, l.Holder, l.AcquiredAt.UTC().Format(lockTimeFormat))
	switch {
	case taken:
		return s + fmt.Sprintf(": it released the lock, or died and its lease (last seen renewed until %s) expired", l.Deadline.UTC().Format(lockTimeFormat))
	case l.Live:
		return s + fmt.Sprintf(", renewed until %s (a holder that died stops renewing it; it expires then)", l.Deadline.UTC().Format(lockTimeFormat))
	}
	return s + fmt.Sprintf(", expired at %s (taking it over)", l.Deadline.UTC().Format(lockTimeFormat))
}

// renewInBackground extends the lease every third of it until release.
func (l *migrationLock) renewInBackground() {
	ctx, cancel := context.WithCancel(context.Background())
	l.stop = cancel
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for wait.Sleep(ctx, lease()/3) == nil {
			rctx, cancel := context.WithTimeout(ctx, lease()/3)
			res, err := l.db.ExecContext(rctx, renewMigrationLockSQL, l.holder, lease().Seconds())
			cancel()
			if n, _ := rowsAffected(res, err); err == nil && n == 0 {
				klog.Warningf("migrations: migration lock %s was taken over while migrating (cleared by an operator?)", l.holder)
				return
			}
			if err != nil && ctx.Err() == nil {
				klog.Warningf("migrations: renewing the migration lock: %v", err)
			}
		}
	}()
}

// release stops renewing and deletes the lease (bounded by a few seconds:
// if it fails, the lease expires by itself).
func (l *migrationLock) release() {
	l.stop()
	l.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.db.ExecContext(ctx, releaseMigrationLockSQL, l.holder); err != nil {
		klog.Warningf("migrations: releasing the migration lock (it expires by itself within %v): %v", lease(), err)
	}
}

func rowsAffected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// clearedRows is rowsAffected, with a missing table counting as none.
func clearedRows(res sql.Result, err error) (int64, error) {
	if dbconn.SQLState(err) == dbconn.CodeUndefinedTable {
		return 0, nil
	}
	return rowsAffected(res, err)
}

// Lock describes the migration lease: the row of bmdb_migration_lock that
// the component migrating the schema holds (Migrator.ReadLock).
type Lock struct {
	Holder     uuid.UUID // the migrator's lease id
	HolderInfo string    // its Config.HolderInfo: component, host, pid
	AcquiredAt time.Time // on the database clock
	Deadline   time.Time // on the database clock; renewed while it migrates
	Live       bool      // the deadline has not passed: the holder is alive
}

// readMigrationLock returns the lease, or nil if nobody holds one.
func readMigrationLock(ctx context.Context, db *sql.DB) (*Lock, error) {
	var l Lock
	err := db.QueryRowContext(ctx, readMigrationLockSQL).Scan(&l.Holder, &l.HolderInfo, &l.AcquiredAt, &l.Deadline, &l.Live)
	switch {
	case errors.Is(err, sql.ErrNoRows) || dbconn.SQLState(err) == dbconn.CodeUndefinedTable:
		return nil, nil
	case err != nil:
		return nil, err
	}
	return &l, nil
}
