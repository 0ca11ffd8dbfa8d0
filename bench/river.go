package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// benchArgs is the River job: one per machine, doing nothing.
type benchArgs struct {
	Seq int `json:"seq"`
}

func (benchArgs) Kind() string { return "bench" }

type benchWorker struct {
	river.WorkerDefaults[benchArgs]
}

func (benchWorker) Work(context.Context, *river.Job[benchArgs]) error { return nil }

// benchTxWorker is the transactional job, what a River user writes whose
// result must be atomic with the job's completion: in one transaction of
// the client's pool it deletes the job's row of bench_river_pending and
// completes the job (river.JobCompleteTx), then commits. A job that finds
// its row gone fails, and is retried: the exactly-once check sees it.
type benchTxWorker struct {
	river.WorkerDefaults[benchArgs]
	pool *pgxpool.Pool
}

func (w benchTxWorker) Work(ctx context.Context, job *river.Job[benchArgs]) error {
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }() // after Commit: ErrTxClosed, nothing done
	tag, err := tx.Exec(ctx, riverPendingDeleteSQL, job.ID)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("job %d: its bench_river_pending row is gone", job.ID)
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// The transactional job's table in River's database: one row per job,
// filled when the jobs are seeded, deleted by the job.
const (
	riverPendingSchema    = `CREATE TABLE IF NOT EXISTS bench_river_pending (job_id BIGINT PRIMARY KEY)`
	riverPendingSeedSQL   = `INSERT INTO bench_river_pending (job_id) SELECT id FROM river_job`
	riverPendingDeleteSQL = `DELETE FROM bench_river_pending WHERE job_id = $1`
)

// riverBench is River on its own database, migrated by rivermigrate, through
// openRiver makes a fresh River database (dropped by done unless -keep)
// with River's schema, and returns its bench and DSN.
func openRiver(ctx context.Context, cfg config) (rb *riverBench, dsn string, done func(), err error) {
	dsn, err = freshDatabase(ctx, cfg.dsn, cfg.riverDatabase)
	if err != nil {
		return nil, "", nil, err
	}
	drop := func() {
		if !cfg.keep {
			dropDatabase(context.Background(), cfg.dsn, cfg.riverDatabase)
		}
	}
	rb, err = newRiverBench(ctx, dsn, cfg.riverCooldown)
	if err != nil {
		drop()
		return nil, "", nil, err
	}
	return rb, dsn, func() { rb.Close(); drop() }, nil
}

// lib/pq and database/sql like bmdb.
type riverBench struct {
	db       *sql.DB
	cooldown time.Duration
}

func newRiverBench(ctx context.Context, dsn string, cooldown time.Duration) (*riverBench, error) {
	db, err := openPool(dsn)
	if err != nil {
		return nil, err
	}
	migrator, err := rivermigrate.New(riverdatabasesql.New(db), nil)
	if err != nil {
		db.Close()
		return nil, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		db.Close()
		return nil, fmt.Errorf("river migrations: %w", err)
	}
	if _, err := db.ExecContext(ctx, riverPendingSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("bench_river_pending: %w", err)
	}
	return &riverBench{db: db, cooldown: cooldown}, nil
}

func (r *riverBench) Close() error { return r.db.Close() }

// seedJobs replaces River's jobs with m new ones, through an insert-only
// client, and vacuums. With pending, bench_river_pending gets a row per
// job (the transactional job's); without, it is emptied.
func (r *riverBench) seedJobs(ctx context.Context, m int, pending bool) error {
	if _, err := r.db.ExecContext(ctx, `TRUNCATE river_job, bench_river_pending`); err != nil {
		return err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, benchWorker{})
	client, err := river.NewClient(riverdatabasesql.New(r.db), &river.Config{
		Workers: workers,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return err
	}
	if err := insertJobs(ctx, client, m); err != nil {
		return err
	}
	if pending {
		if _, err := r.db.ExecContext(ctx, riverPendingSeedSQL); err != nil {
			return err
		}
	}
	_, err = r.db.ExecContext(ctx, `VACUUM ANALYZE river_job, bench_river_pending`)
	return err
}

// insertJobs inserts m bench jobs, 1000 per statement.
func insertJobs(ctx context.Context, client *river.Client[*sql.Tx], m int) error {
	params := make([]river.InsertManyParams, m)
	for i := range params {
		params[i] = river.InsertManyParams{Args: benchArgs{Seq: i}}
	}
	for i := 0; i < m; i += 1000 {
		if _, err := client.InsertMany(ctx, params[i:min(i+1000, m)]); err != nil {
			return fmt.Errorf("river insert: %w", err)
		}
	}
	return nil
}

// run inserts m jobs (not timed), then works them with n workers and times
// until River reports all m completed.
func (r *riverBench) run(ctx context.Context, m, n int) (result, error) {
	if _, err := r.db.ExecContext(ctx, `TRUNCATE river_job`); err != nil {
		return result{}, err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, benchWorker{})
	client, err := river.NewClient(riverdatabasesql.New(r.db), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: n}},
		Workers:           workers,
		PollOnly:          true, // database/sql has no LISTEN
		FetchCooldown:     r.cooldown,
		FetchPollInterval: max(r.cooldown, 10*time.Millisecond),
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return result{}, err
	}
	if err := insertJobs(ctx, client, m); err != nil {
		return result{}, err
	}
	if _, err := r.db.ExecContext(ctx, `VACUUM ANALYZE river_job`); err != nil {
		return result{}, err
	}
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: m + 1, Kinds: []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed},
	})
	defer cancel()
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return result{}, err
	}
	done := 0
	for done < m {
		select {
		case ev := <-events:
			if ev.Kind != river.EventKindJobCompleted {
				return result{}, fmt.Errorf("river job %d failed", ev.Job.ID)
			}
			done++
		case <-ctx.Done():
			return result{}, ctx.Err()
		}
	}
	elapsed := time.Since(start)
	stopCtx, stop := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer stop()
	if err := client.Stop(stopCtx); err != nil {
		return result{}, err
	}
	var completed int
	if err := r.db.QueryRowContext(ctx, `SELECT count(*) FROM river_job WHERE state = 'completed'`).Scan(&completed); err != nil {
		return result{}, err
	}
	if completed != m {
		return result{}, fmt.Errorf("river: %d of %d jobs completed", completed, m)
	}
	return result{items: m, elapsed: elapsed}, nil
}

// checkRiver is the exactly-once check of a River run of m jobs: each job
// completed at its first attempt, and with pending (River tx) every row of
// bench_river_pending deleted, by the transaction that completed its job.
func checkRiver(ctx context.Context, db *sql.DB, m int, pending bool) (verdict string, ok bool, err error) {
	var once, other, left int
	err = db.QueryRowContext(ctx, `
SELECT count(*) FILTER (WHERE state = 'completed' AND attempt = 1), count(*) FILTER (WHERE state <> 'completed' OR attempt <> 1),
       (SELECT count(*) FROM bench_river_pending)
FROM river_job`).Scan(&once, &other, &left)
	if err != nil {
		return "", false, err
	}
	ok = once == m && other == 0
	verdict = fmt.Sprintf("%d jobs completed at their first attempt, %d not", once, other)
	if pending {
		ok = ok && left == 0
		verdict += fmt.Sprintf("; %d rows of bench_river_pending left", left)
	}
	return verdict, ok, nil
}
