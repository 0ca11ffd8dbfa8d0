package main

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lib/pq"
)

// The floor's two transactions per item: the least a claim cycle must do
// (insert a claim row, later delete it), each committed on its own.
const (
	floorInsertSQL = `INSERT INTO bench_floor (machine_id, process) VALUES ($1, $2)`
	floorDeleteSQL = `DELETE FROM bench_floor WHERE machine_id = $1 AND process = $2`
)

// runFloor pushes every machine through floorInsertSQL and floorDeleteSQL
// with n workers, through lib/pq and database/sql, SERIALIZABLE, with the
// pool settings bmdb uses by default.
func runFloor(ctx context.Context, dsn string, db *sql.DB, n int) (result, error) {
	ids, err := machineIDs(ctx, db)
	if err != nil {
		return result{}, err
	}
	pool, err := openPool(dsn)
	if err != nil {
		return result{}, err
	}
	defer pool.Close()
	items := make(chan string, len(ids))
	for _, id := range ids {
		items <- id
	}
	close(items)
	var (
		mu      sync.Mutex
		retries int64
		first   error
		wg      sync.WaitGroup
	)
	start := time.Now()
	for range n {
		wg.Go(func() {
			var r int64
			for id := range items {
				for _, step := range floorSteps {
					k, err := execSerializable(ctx, pool, step(id, "floor"))
					r += k
					if err != nil {
						mu.Lock()
						first = cmpErr(first, err)
						mu.Unlock()
						return
					}
				}
			}
			mu.Lock()
			retries += r
			mu.Unlock()
		})
	}
	wg.Wait()
	return result{items: len(ids), elapsed: time.Since(start), retries: retries}, first
}

// openPool opens a pool on dsn through lib/pq, configured like a
// bmdb.Connection's by default.
func openPool(dsn string) (*sql.DB, error) {
	return openCountingPool(dsn, nil)
}

// openCountingPool is openPool whose round trips and statements rt counts
// (nil: none).
func openCountingPool(dsn string, rt *rtCounter) (*sql.DB, error) {
	connector, err := pq.NewConnector(dsn)
	if err != nil {
		return nil, err
	}
	var c driver.Connector = connector
	if rt != nil {
		c = rt.wrap(connector)
	}
	pool := sql.OpenDB(c)
	pool.SetMaxIdleConns(32) // bmdb's default Config.MaxIdleConns
	return pool, nil
}

// floorSteps are the floor's two statements, each its own transaction.
var floorSteps = []func(id, process string) func(context.Context, *sql.Tx) error{
	func(id, process string) func(context.Context, *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, floorInsertSQL, id, process)
			return err
		}
	},
	func(id, process string) func(context.Context, *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, floorDeleteSQL, id, process)
			return err
		}
	},
}

// execSerializable runs exec in its own SERIALIZABLE transaction, retrying
// serialization failures, and returns the number of retries.
func execSerializable(ctx context.Context, db *sql.DB, exec func(context.Context, *sql.Tx) error) (int64, error) {
	for retries := int64(0); ; retries++ {
		err := func() error {
			tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
			if err != nil {
				return err
			}
			if err := exec(ctx, tx); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		}()
		var pqErr *pq.Error
		if errors.As(err, &pqErr) && (pqErr.Code == "40001" || pqErr.Code == "40P01") {
			continue
		}
		if err != nil {
			return retries, fmt.Errorf("floor: %w", err)
		}
		return retries, nil
	}
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}
