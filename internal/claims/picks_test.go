package claims

import (
	"testing"
	"time"

	"github.com/google/uuid"
)

// The pick book steers one session's batches apart: a machine offered by
// an attempt in flight is not offered by another until that attempt ends;
// one claimed by a batch that committed after an attempt began is not
// offered by it, but is by an attempt that began later; and offers of an
// attempt that ended are free again.
func TestPickBook(t *testing.T) {
	var b pickBook
	a, c := &pickToken{}, &pickToken{}
	b.begin(a)
	b.begin(c)
	m, n := uuid.New(), uuid.New()
	if !b.offer(a, m) {
		t.Fatal("an attempt could not offer a machine no one offered")
	}
	if !b.offer(a, m) {
		t.Fatal("an attempt could not offer again a machine it offered")
	}
	if b.offer(c, m) {
		t.Fatal("another attempt offered a machine offered by one in flight")
	}
	time.Sleep(time.Millisecond) // the commit comes after c began
	b.committed([]uuid.UUID{m})
	b.release(a)
	if b.offer(c, m) {
		t.Fatal("an attempt offered a machine claimed after it began (its snapshot may predate the claim)")
	}
	if !b.offer(c, n) {
		t.Fatal("an attempt could not offer a machine no one offered or claimed")
	}
	b.begin(c) // a new attempt: its snapshot sees the claim
	if !b.offer(c, m) {
		t.Fatal("an attempt that began after the claim committed could not offer it")
	}
	if !b.offer(a, n) {
		t.Fatal("an offer of an attempt that ended was not freed")
	}
	b.withdraw(a, []uuid.UUID{n}) // offered, not claimed (PostgreSQL)
	if !b.offer(c, n) {
		t.Fatal("a withdrawn offer was not freed")
	}
}
