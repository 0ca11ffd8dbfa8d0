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

// GC's read through the dead entries heartbeats leave in
// sessions_deadline_idx. On CockroachDB every heartbeat leaves its old
// entry deleted in place until gc.ttlseconds (4 h) have passed, and a scan
// steps over each. PostgreSQL stands in here: each heartbeat of its own
// transaction leaves a dead index entry, and a transaction whose snapshot
// is older than all of them, held open meanwhile, keeps PostgreSQL from
// removing them or marking them dead in the index (which it would do at
// the first scan otherwise), so every scan fetches each one's row to find
// it invisible, as CockroachDB's steps over each deleted entry.
const (
	gcBenchDatabase   = "bmdb_bench_gc"
	gcBenchSessions   = 100              // a fleet of 100 sessions
	gcBenchHeartbeats = 1000             // heartbeats each, one every interval/2
	gcBenchPeriod     = 30 * time.Second // Config.GCPeriod's default: a window's span
	gcBenchGrace      = 5 * time.Second  // Config.GCGracePeriod's default (the interval's)
)

// BenchmarkGCDeadIndexEntries is one GC read (the expiry bound, then the
// expired sessions listed from sessions_deadline_idx, of which there are
// none) with gcBenchSessions x gcBenchHeartbeats dead entries below the
// bound: full reads from the index's start, as every pass did before and
// a Connection's first and hourly passes still do; window reads from one
// GCPeriod before the bound (about 1,100 of the entries), as the other
// periodic passes do.
func BenchmarkGCDeadIndexEntries(b *testing.B) {
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
	start := time.Now()
	if err := deadDeadlineEntries(ctx, b, db, dsn); err != nil {
		b.Fatal(err)
	}
	b.Logf("%d dead entries in sessions_deadline_idx made in %v", gcBenchSessions*gcBenchHeartbeats, time.Since(start).Round(time.Millisecond))
	var bound time.Time
	if bound, err = store.New(db).SessionExpiryBound(ctx, gcBenchGrace.Seconds()); err != nil {
		b.Fatal(err)
	}
	for _, read := range []struct {
		name  string
		after time.Time
	}{{"full", time.Time{}}, {"window", bound.Add(-gcBenchPeriod)}} {
		b.Run(read.name, func(b *testing.B) {
			for range b.N {
				if err := gcRead(ctx, db, read.after); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// deadDeadlineEntries starts gcBenchSessions sessions and heartbeats each
// gcBenchHeartbeats times, one transaction per heartbeat of the fleet, at
// deadlines 2.5 s apart that end 10 s before now (so that the last
// GCPeriod of them is in a window), then once more to an hour from now:
// every heartbeat but the last leaves a dead entry below GC's bound. A
// transaction whose snapshot predates them all stays open until b ends.
func deadDeadlineEntries(ctx context.Context, b *testing.B, db *sql.DB, dsn string) error {
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

// gcRead is GC's read: the bound, then the list from after.
func gcRead(ctx context.Context, db *sql.DB, after time.Time) error {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	q := store.New(tx)
	bound, err := q.SessionExpiryBound(ctx, gcBenchGrace.Seconds())
	if err != nil {
		return err
	}
	expired, err := q.SessionListExpired(ctx, store.SessionListExpiredParams{After: after, Before: bound, RowLimit: 1000})
	if err != nil {
		return err
	}
	if len(expired) != 0 {
		return fmt.Errorf("%d expired sessions, want none", len(expired))
	}
	return tx.Commit()
}
