package claims

import (
	"sync"
	"time"

	"github.com/google/uuid"
)

// pickBook is what the batches of one queue that run at once tell each
// other about their candidates: the machines an attempt in flight offered
// to a claim statement, and the machines the queue's batches claimed
// lately, with when they committed. The claims of one batch share one
// retrieval (worker.Loop's, through Tx.Once), and so do those of the batch
// beside it: without the book both pick among the same machines, and on
// PostgreSQL at snapshot isolation a batch whose snapshot predates the
// other's commit finds its pick stale and runs again, every call of it
// (ClaimsStale), over and over while the other keeps committing. With it
// a batch offers neither what the other offered nor what a batch claimed
// after its attempt began. The database still arbitrates every claim: the
// book only steers the picks of one session's batches, never what is
// safe. Safe for concurrent use.
type pickBook struct {
	mu      sync.Mutex
	picking map[uuid.UUID]*pickToken // offered by an attempt in flight
	claimed map[uuid.UUID]time.Time  // claimed by a batch that committed then
	order   []claimedAt              // claimed's entries, oldest first
}

// pickToken is one batch's place in the book: what its attempt in flight
// offered, and when that attempt began. Owned by the batch's goroutine;
// offered is written under the book's mu, by that goroutine alone.
type pickToken struct {
	start   time.Time
	offered []uuid.UUID
}

type claimedAt struct {
	machine uuid.UUID
	at      time.Time
}

// pickMemory is how long the book remembers a claim: longer than an
// attempt of a batch lasts but for a stall, after which a stale pick costs
// no more than a retry. (On CockroachDB an attempt's read timestamp is
// taken at BEGIN, a moment before begin notes its start: the book may miss
// a claim committed in that moment, which the database then arbitrates.)
const pickMemory = 10 * time.Second

// begin starts a new attempt of tok's batch: what its last attempt
// offered is free to others again.
func (b *pickBook) begin(tok *pickToken) {
	b.release(tok)
	tok.start = time.Now()
}

// offer reports whether tok's attempt may offer m, and if so notes it:
// not if another attempt in flight offered it, nor if a batch claimed it
// after tok's attempt began (its snapshot may predate that commit).
func (b *pickBook) offer(tok *pickToken, m uuid.UUID) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.init()
	if owner, ok := b.picking[m]; ok {
		return owner == tok
	}
	if at, ok := b.claimed[m]; ok && !at.Before(tok.start) {
		return false
	}
	b.picking[m] = tok
	tok.offered = append(tok.offered, m)
	return true
}

// release frees what tok's attempt offered.
func (b *pickBook) release(tok *pickToken) {
	b.withdraw(tok, tok.offered)
	tok.offered = tok.offered[:0]
}

// withdraw frees machines that tok's attempt offered and will not claim.
func (b *pickBook) withdraw(tok *pickToken, machines []uuid.UUID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range machines {
		if b.picking[m] == tok {
			delete(b.picking, m)
		}
	}
}

// init makes the book's maps on first use; b.mu held.
func (b *pickBook) init() {
	if b.picking == nil {
		b.picking, b.claimed = map[uuid.UUID]*pickToken{}, map[uuid.UUID]time.Time{}
	}
}

// committed notes the machines a batch claimed, as of now, and forgets
// claims older than pickMemory.
func (b *pickBook) committed(machines []uuid.UUID) {
	if len(machines) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now() // under the lock: order stays oldest first
	b.init()
	for _, m := range machines {
		b.claimed[m] = now
		b.order = append(b.order, claimedAt{m, now})
	}
	i := 0
	for ; i < len(b.order) && now.Sub(b.order[i].at) > pickMemory; i++ {
		if at := b.claimed[b.order[i].machine]; at.Equal(b.order[i].at) {
			delete(b.claimed, b.order[i].machine)
		}
	}
	b.order = b.order[i:]
}
