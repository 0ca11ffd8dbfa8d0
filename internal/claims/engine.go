// Package claims is bmdb's batch engine: it runs a session's claims and
// ends (Work, WorkMany, Finish, Cancel, Fail) in shared transactions, one
// queue per process, with one statement per kind of claim and end
// (queries/internal/work.sql), and makes the rows those statements need
// (a pair's claim row, a process's controls row) outside any transaction.
//
// A call that finds nobody running a batch of its process runs one itself,
// on its own goroutine, with whatever else waits: no hand-off when it is
// alone. While Config.MaxConcurrentBatches batches run, calls wait; each
// batch takes in, at the start of each attempt, those that wait, and a
// batch that ends hands its place to the next waiting call, whose goroutine
// runs the next batch. So batches form from what waits while others run,
// without a timer, and the engine starts no goroutine of its own.
//
// It sits on package lease (the session's checks, takeovers) and package
// txn (the runner); bmdb's Session and Work sit on it.
package claims

import (
	"context"
	"database/sql"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/counters"
	"github.com/bmdb-dev/bmdb/internal/lease"
	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/tracing"
	"github.com/bmdb-dev/bmdb/internal/txn"
)

// Config is what the engine needs of its Connection.
type Config struct {
	ComponentName string
	// MaxBatchSize bounds the calls one batch serves
	// (bmdb.Config.MaxBatchSize).
	MaxBatchSize int
	// MaxConcurrentBatches bounds the batches of one process that run at
	// once (bmdb.Config.MaxConcurrentBatches).
	MaxConcurrentBatches int
	// Isolation is the batches' (txn.Snapshot or txn.Serializable).
	Isolation *sql.TxOptions
	// Cockroach says the server is CockroachDB: claim statements are
	// offered no more candidates than they claim, and caps are arbitrated
	// by the slot's unique key rather than locked (claim.go).
	Cockroach bool
	// Tracer starts the batches' spans (bmdb.Config.TracerProvider's);
	// the zero Tracer starts none.
	Tracer tracing.Tracer
	// ObserveClaim, if not nil, receives the latency of each claim made
	// for process (bmdb's histogram).
	ObserveClaim func(process string, d time.Duration)
}

// Engine runs one session's claims and ends. Safe for concurrent use.
type Engine struct {
	cfg      Config
	runner   *txn.Runner
	lease    *lease.Lease
	counters *counters.Counters

	mu     sync.Mutex
	queues map[string]*queue // guarded by mu; one per process, made on first use
}

// New returns the engine of the session l.
func New(runner *txn.Runner, l *lease.Lease, cfg Config) *Engine {
	return &Engine{cfg: cfg, runner: runner, lease: l, counters: runner.Counters, queues: map[string]*queue{}}
}

// Claim is one claim made: what an end fences on.
type Claim struct {
	Machine uuid.UUID
	ID      uuid.UUID // work.claim_id
	Token   int64     // its fencing token
}

// Retrieve returns a claim's candidates, in order of preference.
type Retrieve func(tx *txn.Tx) ([]uuid.UUID, error)

// ClaimCall asks for up to Limit machines among what Retrieve returns. Do
// sets its outcome: the claims made (Claims), the processes of the claims
// its takeovers ended (Abandoned), and, if it claimed none, why (Err:
// ErrNothingToDo, ErrProcessPaused, ErrCapReached, ErrWorkConflict,
// ErrUnknownMachine, or the ambiguous commit it could not resolve).
type ClaimCall struct {
	Limit    int
	Retrieve Retrieve

	Claims    []Claim
	Abandoned []string
	Err       error
	Batch     Batch // the batch that carried it, for its span

	start  time.Time          // when the call was made, for the latency
	fenced map[uuid.UUID]bool // candidates whose claim rows it made (and ran again); owned by its batch
}

// EndCall ends Claim as Event (Finished, Canceled or Failed). A Finish
// commits its result with Commit, or with Shared, once for all the
// Finishes of a batch that pass the same Shared (Owner is what Shared's
// commit gets for it); a Fail records Cause and, with a Backoff, keeps the
// pair from being claimed. Do sets Err: ErrWorkLost if the claim was gone.
type EndCall struct {
	Claim   Claim
	Event   store.WorkHistoryEvent
	Cause   string
	Backoff Backoff
	Commit  func(tx *txn.Tx) error
	Shared  *Shared
	Owner   any

	Err   error
	Batch Batch // the batch that carried it, for its span
	gone  bool  // an attempt found the claim gone: so are the later ones'
}

// Shared commits the results of several Finishes in one call: Commit gets
// the Owners of the EndCalls that pass it, in one batch.
type Shared struct {
	Commit func(tx *txn.Tx, owners []any) error
}

// Backoff computes a failed pair's next interval (bmdb.Backoff).
type Backoff interface {
	// Next is the interval that follows prev (0: no previous failure).
	Next(prev time.Duration) time.Duration
	// Wait is the jittered wait for interval, given u uniform in [0, 1).
	Wait(interval time.Duration, u float64) time.Duration
}

// Do runs one call for process: a claim, an end, or both. It waits for the
// call's batch to commit, or runs it itself (see the package doc), and
// returns the batch's error, or nil and the call's own outcomes in claim
// and end. A call whose ctx ends while it waits leaves with ctx's cause;
// once its batch has begun, it waits for the outcome, which the session
// and the latest deadline of the batch's calls bound. A session that has
// ended returns its error at once. If one of the call's callbacks
// panicked, Do panics with the same value, on the caller's goroutine.
func (e *Engine) Do(ctx context.Context, process string, claim *ClaimCall, end *EndCall) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if err := e.lease.Alive(); err != nil {
		return err
	}
	if claim != nil {
		claim.start = time.Now()
	}
	return e.queue(process).do(ctx, &request{claim: claim, end: end})
}

// queue returns the queue of process, made on first use.
func (e *Engine) queue(process string) *queue {
	e.mu.Lock()
	defer e.mu.Unlock()
	q := e.queues[process]
	if q == nil {
		q = &queue{e: e, process: process}
		e.queues[process] = q
	}
	return q
}

// Waiting returns how many calls for process wait for a batch (tests).
func (e *Engine) Waiting(process string) int {
	q := e.queue(process)
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, r := range q.waiting {
		if !r.taken {
			n++
		}
	}
	return n
}
