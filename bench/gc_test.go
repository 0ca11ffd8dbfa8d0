package main

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/internal/store"
)

// GC's read of expired sessions, through the versions heartbeats leave.
// On CockroachDB every heartbeat left its session's old entry deleted in
// place in sessions_deadline_idx until gc.ttlseconds (4 h) had passed, and
// a scan of the index stepped over each: GC read it from its start. That
// index is gone (migration 000017): GC lists expired sessions from the
// primary index, whose entry a heartbeat rewrites in place. PostgreSQL
// stands in here: each heartbeat of its own transaction leaves a dead
// version, and a transaction whose snapshot is older than all of them,
// held open meanwhile, keeps PostgreSQL from removing them, so that every
// scan meets each one, as CockroachDB's meets each deleted entry (or, in
// the primary index, each older version of a row, which its MVCC scans
// skip by key).
const (
	gcBenchDatabase   = "bmdb_bench_gc"
	gcBenchSessions   = 100             // a fleet of 100 sessions
	gcBenchHeartbeats = 1000            // heartbeats each, one every interval/2
	gcBenchGrace      = 5 * time.Second // Config.GCGracePeriod's default (the interval's)
)

// gcReadThroughDeadlines is GC's list before 000017: from the start of
// sessions_deadline_idx, which the bench puts back for the comparison.
const gcReadThroughDeadlines = `SELECT session_id, deadline FROM sessions
WHERE deadline >= '0001-01-01' AND deadline < $1
ORDER BY deadline, session_id LIMIT 1000`

// BenchmarkGCReadOfExpiredSessions is one GC read (the expiry bound, then
// the expired sessions listed, of which there are none) after
// gcBenchSessions x gcBenchHeartbeats heartbeats: "primary" is GC's list
// now (SessionListExpired), "deadline-index" the list before 000017,
// through sessions_deadline_idx from its start.
func BenchmarkGCReadOfExpiredSessions(b *testing.B) {
	ctx := context.Background()
	admin := adminDSN(b)
	dsn, err := freshDatabase(ctx, admin, gcBenchDatabase)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = dropDatabase(context.Background(), admin, gcBenchDatabase) })
	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: "bench-gc"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	db := conn.DB()
	if _, err := db.ExecContext(ctx, "CREATE INDEX sessions_deadline_idx ON sessions (deadline)"); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := heartbeatVersions(ctx, b, db, dsn); err != nil {
		b.Fatal(err)
	}
	b.Logf("%d heartbeats of %d sessions in %v", gcBenchSessions*gcBenchHeartbeats, gcBenchSessions, time.Since(start).Round(time.Millisecond))
	for _, read := range []string{"primary", "deadline-index"} {
		b.Run(read, func(b *testing.B) {
			for range b.N {
				if err := gcRead(ctx, db, read); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// heartbeatVersions starts gcBenchSessions sessions and heartbeats each
// gcBenchHeartbeats times, one transaction per heartbeat of the fleet, at
// deadlines 2.5 s apart that end 10 s before now, then once more to an
// hour from now: every heartbeat but the last leaves a dead version (and
// a dead entry of sessions_deadline_idx) below GC's bound. A transaction
// whose snapshot predates them all stays open until b ends.
func heartbeatVersions(ctx context.Context, b *testing.B, db *sql.DB, dsn string) error {
	if _, err := db.ExecContext(ctx, `INSERT INTO sessions (component_name, runtime_info, interval_seconds, deadline)
		SELECT 'bench-gc', '', 5, now() FROM generate_series(1, $1::INT8)`, gcBenchSessions); err != nil {
		return err
	}
	// On a pool of its own: bmdb's connections end a transaction left
	// idle for longer than the session interval.
	pool, err := openPool(dsn)
	if err != nil {
		return err
	}
	holder, err := pool.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		pool.Close()
		return err
	}
	b.Cleanup(func() {
		_ = holder.Rollback()
		pool.Close()
	})
	var n int
	if err := holder.QueryRowContext(ctx, "SELECT count(*) FROM sessions").Scan(&n); err != nil {
		return fmt.Errorf("taking the old snapshot: %w", err)
	}
	step := 2500 * time.Millisecond
	first := -10*time.Second - time.Duration(gcBenchHeartbeats-1)*step
	for k := range gcBenchHeartbeats {
		offset := first + time.Duration(k)*step
		if _, err := db.ExecContext(ctx, "UPDATE sessions SET deadline = now() + $1 * INTERVAL '1 second' WHERE component_name = 'bench-gc'", offset.Seconds()); err != nil {
			return err
		}
	}
	_, err = db.ExecContext(ctx, "UPDATE sessions SET deadline = now() + INTERVAL '1 hour' WHERE component_name = 'bench-gc'")
	return err
}

// gcRead is one GC read: the bound, then the list, by read.
func gcRead(ctx context.Context, db *sql.DB, read string) error {
	q := store.New(db)
	bound, err := q.SessionExpiryBound(ctx, gcBenchGrace.Seconds())
	if err != nil {
		return err
	}
	var listed int
	switch read {
	case "primary":
		ids, err := q.SessionListExpired(ctx, store.SessionListExpiredParams{Before: bound, RowLimit: 1000})
		if err != nil {
			return err
		}
		listed = len(ids)
	default:
		rows, err := db.QueryContext(ctx, gcReadThroughDeadlines, bound)
		if err != nil {
			return err
		}
		for rows.Next() {
			listed++
		}
		if err := rows.Close(); err != nil {
			return err
		}
	}
	if listed != 0 {
		return fmt.Errorf("%d expired sessions, want none", listed)
	}
	return nil
}
