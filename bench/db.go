package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strings"

	"github.com/lib/pq"
)

// withDatabase returns dsn (URL or key=value form) pointing at database name.
func withDatabase(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parsing DSN: %w", err)
		}
		u.Path = "/" + name
		return u.String(), nil
	}
	return dsn + " dbname=" + name, nil
}

// freshDatabase drops and recreates database name (a constant of this
// program after -db-prefix, which is checked to be letters, digits and _)
// and returns its DSN.
func freshDatabase(ctx context.Context, adminDSN, name string) (string, error) {
	admin, err := sql.Open("postgres", adminDSN)
	if err != nil {
		return "", err
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+pq.QuoteIdentifier(name)+" WITH (FORCE)"); err != nil {
		return "", fmt.Errorf("dropping %s: %w", name, err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+pq.QuoteIdentifier(name)); err != nil {
		return "", fmt.Errorf("creating %s: %w", name, err)
	}
	return withDatabase(adminDSN, name)
}

// dropDatabase removes a database made by freshDatabase.
func dropDatabase(ctx context.Context, adminDSN, name string) error {
	admin, err := sql.Open("postgres", adminDSN)
	if err != nil {
		return err
	}
	defer admin.Close()
	_, err = admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+pq.QuoteIdentifier(name)+" WITH (FORCE)")
	return err
}

// benchSchema is the bench's own tables in the bmdb database, beside bmdb's
// (which bmdb.Open migrates): bench_pending is the application's "needs
// work" tag that Finish's commit deletes; bench_floor is the floor's claim
// table, shaped like work; floorSchema's are the matrix's floors'.
const benchSchema = `
CREATE TABLE IF NOT EXISTS bench_pending (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    seq BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS bench_pending_seq_idx ON bench_pending (seq);
CREATE TABLE IF NOT EXISTS bench_floor (
    machine_id UUID NOT NULL,
    process TEXT NOT NULL,
    PRIMARY KEY (machine_id, process)
);` + floorSchema

// resetSQL empties every table a run touches. Sessions stay: live ones
// belong to running benchmarks, closed ones are already gone.
const resetSQL = `TRUNCATE machines, work, work_history, work_backoff, bench_pending, bench_floor, floor_work, floor_history CASCADE`

// seedSQL creates $1 machines, oldest first, each pending with seq 1..$1.
const seedSQL = `
WITH m AS (
    INSERT INTO machines (machine_id, machine_created_at)
    SELECT gen_random_uuid(), now() - (($1::INT8 - g) * INTERVAL '1 millisecond')
    FROM generate_series(1, $1::INT8) g
    RETURNING machine_id, machine_created_at
)
INSERT INTO bench_pending (machine_id, seq)
SELECT machine_id, row_number() OVER (ORDER BY machine_created_at, machine_id) FROM m`

// seed empties the bench tables and creates n pending machines.
func seed(ctx context.Context, db *sql.DB, n int) error {
	if _, err := db.ExecContext(ctx, resetSQL); err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	if _, err := db.ExecContext(ctx, seedSQL, n); err != nil {
		return fmt.Errorf("seeding %d machines: %w", n, err)
	}
	if _, err := db.ExecContext(ctx, "VACUUM ANALYZE"); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	return nil
}

// machineIDs returns every machine, oldest first.
func machineIDs(ctx context.Context, db *sql.DB) ([]string, error) {
	rows, err := db.QueryContext(ctx, `SELECT machine_id FROM bench_pending ORDER BY seq`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// exactlyOnce counts machines by their number of Finished history rows for
// process: exactly one, none, more than one.
const exactlyOnceSQL = `
SELECT count(*) FILTER (WHERE n = 1), count(*) FILTER (WHERE n = 0), count(*) FILTER (WHERE n > 1)
FROM (
    SELECT (SELECT count(*) FROM work_history h
            WHERE h.machine_id = m.machine_id AND h.process = $1 AND h.event = 'Finished') AS n
    FROM machines m
) c`

// check is the outcome of exactlyOnceSQL.
type check struct{ one, none, many int }

func (c check) String() string {
	verdict := "OK"
	if c.none != 0 || c.many != 0 {
		verdict = "FAILED"
	}
	return fmt.Sprintf("%s: %d machines with exactly 1 Finished row, %d with none, %d with more", verdict, c.one, c.none, c.many)
}

func verify(ctx context.Context, db *sql.DB, process string) (check, error) {
	var c check
	err := db.QueryRowContext(ctx, exactlyOnceSQL, process).Scan(&c.one, &c.none, &c.many)
	return c, err
}

// flushPool makes every backend of db's idle connections flush its
// pending statistics (pgStatFlushSQL), so that what they did is in
// pg_stat_database before a run's window opens rather than up to 10 s
// into it. It holds all the pool's connections at once to reach each. A
// server that does not allow the flush (before PostgreSQL 15, or a user
// without the right) is left as it is.
func flushPool(ctx context.Context, db *sql.DB) error {
	n := db.Stats().OpenConnections
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
		_, _ = c.ExecContext(ctx, pgStatFlushSQL)
	}
	return nil
}
