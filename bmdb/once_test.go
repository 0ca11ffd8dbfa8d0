package bmdb

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/lib/pq"
)

// Tx.Once runs its function once per attempt and key: a second call with
// an equal key gets the first result, another key runs again, an error is
// returned and not remembered, and a retried attempt starts afresh.
func TestTxOnceWithinAnAttempt(t *testing.T) {
	e := newEnv(t)
	c := e.open()
	exact(c)
	s := e.session(c)
	type key struct{ n int }
	var runs, attempts int
	count := func() (any, error) { runs++; return runs, nil }
	err := s.Transact(context.Background(), func(tx *Tx) error {
		attempts++
		runs = 0
		a, err := tx.Once(key{1}, count)
		if err != nil {
			return err
		}
		b, _ := tx.Once(key{1}, count)
		other, _ := tx.Once(key{2}, count)
		if a != 1 || b != 1 || other != 2 || runs != 2 {
			return fmt.Errorf("attempt %d: key 1 gave %v then %v, key 2 %v, %d runs; want 1, 1, 2 and 2 runs", attempts, a, b, other, runs)
		}
		failure := errors.New("failed read")
		if _, err := tx.Once(key{3}, func() (any, error) { return nil, failure }); !errors.Is(err, failure) {
			return fmt.Errorf("a failing fn: %v, want its error", err)
		}
		if v, err := tx.Once(key{3}, count); err != nil || v != 3 {
			return fmt.Errorf("after an error: %v, %v; want fn run again (3)", v, err)
		}
		if attempts == 1 {
			return &pq.Error{Code: codeSerializationFailure, Message: "injected"}
		}
		return nil
	})
	if err != nil || attempts != 2 {
		t.Fatalf("Transact = %v after %d attempts, want success at the second", err, attempts)
	}
}

// Bad input to Tx.Once is an error naming it, not a panic.
func TestTxOnceRejectsBadInput(t *testing.T) {
	e := newEnv(t)
	s := e.session(e.open())
	fn := func() (any, error) { return 1, nil }
	for name, call := range map[string]func(tx *Tx) error{
		"nil key":      func(tx *Tx) error { _, err := tx.Once(nil, fn); return err },
		"slice key":    func(tx *Tx) error { _, err := tx.Once([]int{1}, fn); return err },
		"uncomparable": func(tx *Tx) error { _, err := tx.Once(struct{ f func() }{}, fn); return err },
		"nil function": func(tx *Tx) error { _, err := tx.Once("k", nil); return err },
	} {
		err := s.Transact(context.Background(), call)
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
}

// Claims that share a batch share a retrieval through Tx.Once (as
// worker.Loop's handlers do): three Work calls queued behind a held batch
// run in one transaction, with one retrieval, and each claims a machine
// of its own.
func TestClaimsOfOneBatchShareARetrieval(t *testing.T) {
	e, _, s := batchEnv(t)
	var ms []uuid.UUID
	for range 4 {
		ms = append(ms, e.machine())
	}
	e.fence("install", ms...)
	var retrievals atomic.Int64
	type key struct{}
	shared := func(tx *Tx) ([]uuid.UUID, error) {
		v, err := tx.Once(key{}, func() (any, error) {
			retrievals.Add(1)
			return ms[1:], nil
		})
		if err != nil {
			return nil, err
		}
		return append([]uuid.UUID(nil), v.([]uuid.UUID)...), nil
	}
	works := make([]*Work, 3)
	errs := make([]error, 3)
	var calls []func()
	for i := range works {
		calls = append(calls, func() { works[i], errs[i] = s.Work(context.Background(), "install", shared) })
	}
	behindHeldClaim(t, s, ms[0], calls...)()
	got := map[uuid.UUID]bool{}
	for i, w := range works {
		if errs[i] != nil {
			t.Fatalf("Work %d: %v", i, errs[i])
		}
		got[w.Machine()] = true
	}
	if len(got) != 3 {
		t.Errorf("the three calls claimed %v, want three machines", got)
	}
	if n := retrievals.Load(); n != 1 {
		t.Errorf("%d retrievals for one batch of three claims, want 1", n)
	}
	if sizes := e.startedPerTransaction(s); len(sizes) != 2 || sizes[1] != 3 {
		t.Errorf("claim transactions' sizes %v, want the held one's, then 3", sizes)
	}
}
