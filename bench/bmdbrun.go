package main

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
	"github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/bmdb"
)

// retrieveSQL is the bench application's retrieval: pending machines,
// oldest first, without a claim of process ($1) and not in backoff for it.
// $2 candidates are returned after skipping $3.
const retrieveSQL = `
SELECT p.machine_id FROM bench_pending p
WHERE NOT EXISTS (
        SELECT 1 FROM work w WHERE w.machine_id = p.machine_id AND w.process = $1
    )
  AND NOT EXISTS (
        SELECT 1 FROM work_backoff b
        WHERE b.machine_id = p.machine_id AND b.process = $1 AND b.until > now()
    )
ORDER BY p.seq
LIMIT $2 OFFSET $3`

// retrieveLeanSQL is retrieveSQL without the anti-joins: the oldest pending
// machines, relying on Work to skip claimed ones and ones in backoff. On
// PostgreSQL it reads no work index page, so concurrent claims of different
// machines do not conflict through it (-retrieval lean).
const retrieveLeanSQL = `
SELECT p.machine_id FROM bench_pending p
WHERE $1::TEXT IS NOT NULL
ORDER BY p.seq
LIMIT $2 OFFSET $3`

// leanRetrieval selects retrieveLeanSQL (flag -retrieval).
var leanRetrieval bool

// commitSQL is the trivial commit of Finish: the machine no longer needs work.
const commitSQL = `DELETE FROM bench_pending WHERE machine_id = $1`

// commitManySQL is commitSQL for a batch of Finishes (bmdb.CommitShared).
const commitManySQL = `DELETE FROM bench_pending WHERE machine_id = ANY ($1::UUID[])`

// pick is how a worker chooses among the oldest candidates.
type pick string

const (
	pickFirst   pick = "first"   // k oldest, in order
	pickShuffle pick = "shuffle" // k oldest, shuffled
	pickOffset  pick = "offset"  // one candidate at a random offset below k
)

// retriever returns a Work retrieve function for process.
func retriever(ctx context.Context, process string, p pick, k int) func(tx *bmdb.Tx) ([]uuid.UUID, error) {
	return func(tx *bmdb.Tx) ([]uuid.UUID, error) {
		if p == pickOffset {
			ids, err := query(ctx, tx, process, 1, rand.N(k))
			if len(ids) > 0 || err != nil {
				return ids, err
			}
			return query(ctx, tx, process, 1, 0) // fewer than k left
		}
		ids, err := query(ctx, tx, process, k, 0)
		if p == pickShuffle {
			rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		}
		return ids, err
	}
}

// query runs retrieveSQL in tx.
func query(ctx context.Context, tx *bmdb.Tx, process string, limit, offset int) ([]uuid.UUID, error) {
	var rows *sql.Rows
	var err error
	if leanRetrieval {
		rows, err = tx.DBTX().QueryContext(ctx, retrieveLeanSQL, process, limit, offset)
	} else {
		rows, err = tx.DBTX().QueryContext(ctx, retrieveSQL, process, limit, offset)
	}
	if err != nil {
		return nil, fmt.Errorf("retrieve: %w", err)
	}
	defer rows.Close()
	var ids []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("retrieve: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("retrieve: %w", err)
	}
	return ids, nil
}

// cycle is one worker's claim loop configuration.
type cycle struct {
	conn     *bmdb.Connection
	process  string
	retrieve func(ctx context.Context) func(tx *bmdb.Tx) ([]uuid.UUID, error)
	commit   func(ctx context.Context, w *bmdb.Work) func(tx *bmdb.Tx) error
	// limit stops the run after this many claims (0: until ErrNothingToDo).
	limit int64
	// untilEmpty keeps workers polling on ErrNothingToDo until limit claims.
	untilEmpty bool
	// batch > 1 claims up to batch machines per transaction (WorkMany) and
	// finishes them together (concurrent Finishes with one SharedCommit,
	// which bmdb's batcher commits in one transaction).
	batch int
}

// claim makes one Work or WorkMany call.
func (c cycle) claim(ctx context.Context, sess *bmdb.Session) ([]*bmdb.Work, error) {
	if c.batch > 1 {
		return sess.WorkMany(ctx, c.process, c.batch, c.retrieve(ctx))
	}
	w, err := sess.Work(ctx, c.process, c.retrieve(ctx))
	if err != nil {
		return nil, err
	}
	return []*bmdb.Work{w}, nil
}

// finish ends the claims of one claim call.
func (c cycle) finish(ctx context.Context, sess *bmdb.Session, works []*bmdb.Work) error {
	if len(works) > 1 {
		batch := bmdb.NewSharedCommit(func(tx *bmdb.Tx, works []*bmdb.Work) error {
			return commitMany(ctx, tx, works)
		})
		errs := make([]error, len(works))
		var wg sync.WaitGroup
		for i, w := range works {
			wg.Go(func() { errs[i] = w.Finish(ctx, nil, bmdb.CommitShared(batch)) })
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	return works[0].Finish(ctx, c.commit(ctx, works[0]))
}

// commitMany deletes the pending tags of works in one statement.
func commitMany(ctx context.Context, tx *bmdb.Tx, works []*bmdb.Work) error {
	ids := make([]uuid.UUID, len(works))
	for i, w := range works {
		ids[i] = w.Machine()
	}
	_, err := tx.DBTX().ExecContext(ctx, commitManySQL, pq.Array(ids))
	return err
}

// finishCommit deletes the machine's pending tag.
func finishCommit(ctx context.Context, w *bmdb.Work) func(tx *bmdb.Tx) error {
	return func(tx *bmdb.Tx) error {
		if _, err := tx.DBTX().ExecContext(ctx, commitSQL, w.Machine()); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		return nil
	}
}

// run processes machines with n workers sharing one session, as worker.Loop
// does, and measures claim latency (from the first Work call to a claim,
// conflicts included). On ErrWorkConflict a worker waits a jittered,
// doubling 1-16 ms, like worker.Loop with PollMin 1ms; on ErrNothingToDo it
// stops (unless untilEmpty), since nothing becomes claimable later.
func (c cycle) run(ctx context.Context, n int) (result, error) {
	sess, err := c.conn.StartSession(ctx)
	if err != nil {
		return result{}, err
	}
	defer sess.Close(context.Background())
	before := c.conn.Stats()
	var (
		claimed, conflicts, empty atomic.Int64
		mu                        sync.Mutex
		claims                    latencies
		at                        []time.Duration
		first                     error
		wg                        sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		first = cmpErr(first, err)
		mu.Unlock()
	}
	start := time.Now()
	for range n {
		wg.Go(func() {
			var mine, when []time.Duration
			defer func() {
				mu.Lock()
				claims = append(claims, mine...)
				at = append(at, when...)
				mu.Unlock()
			}()
			for ctx.Err() == nil && (c.limit == 0 || claimed.Load() < c.limit) {
				t0 := time.Now()
				wait := time.Millisecond
				var works []*bmdb.Work
				var err error
				for works == nil {
					if c.limit > 0 && claimed.Load() >= c.limit {
						return
					}
					works, err = c.claim(ctx, sess)
					switch {
					case err == nil:
					case errors.Is(err, bmdb.ErrWorkConflict), c.untilEmpty && errors.Is(err, bmdb.ErrNothingToDo):
						if errors.Is(err, bmdb.ErrWorkConflict) {
							conflicts.Add(1)
						} else {
							empty.Add(1)
						}
						time.Sleep(rand.N(wait) + 50*time.Microsecond)
						wait = min(2*wait, 16*time.Millisecond)
					case errors.Is(err, bmdb.ErrNothingToDo):
						empty.Add(1)
						return
					default:
						fail(err)
						return
					}
				}
				claimed.Add(int64(len(works)))
				for range works {
					mine = append(mine, time.Since(t0))
					when = append(when, time.Since(start))
				}
				if err := c.finish(ctx, sess, works); err != nil {
					fail(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	after := c.conn.Stats()
	return result{
		items:     len(claims),
		elapsed:   elapsed,
		attempts:  after.TxAttempts - before.TxAttempts,
		retries:   after.TxRetries - before.TxRetries,
		conflicts: conflicts.Load(),
		empty:     empty.Load(),
		claims:    claims,
		at:        at,
	}, first
}

// throughputCycle is the bmdb run of the comparison table.
func throughputCycle(conn *bmdb.Connection, process string, p pick, k, batch int) cycle {
	return cycle{
		batch:   batch,
		conn:    conn,
		process: process,
		retrieve: func(ctx context.Context) func(tx *bmdb.Tx) ([]uuid.UUID, error) {
			return retriever(ctx, process, p, k)
		},
		commit: finishCommit,
	}
}
