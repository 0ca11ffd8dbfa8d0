package bmdb

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
)

func machineSet(works []*Work) map[uuid.UUID]bool {
	set := map[uuid.UUID]bool{}
	for _, w := range works {
		set[w.Machine()] = true
	}
	return set
}

// WorkMany claims up to its limit, in order, skipping machines that are
// claimed or in backoff; their Finishes, batched, end them all in one
// transaction.
func TestWorkBatchAndBatchedFinish(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open(func(c *Config) { c.MaxConcurrentBatches = 1 }) // the Finishes queue behind a held batch
	s1, s2 := e.session(c), e.session(c)
	ctx := context.Background()
	var ms []uuid.UUID
	for range 6 {
		ms = append(ms, e.machine())
	}
	held, _ := s2.Work(ctx, "install", retrieveAll(ms[0]))
	failed, _ := s2.Work(ctx, "install", retrieveAll(ms[1]))
	if err := failed.Fail(ctx, &testBackoff, "x"); err != nil {
		t.Fatal(err)
	}
	works, err := s1.WorkMany(ctx, "install", 3, retrieveAll(ms...))
	if err != nil {
		t.Fatal(err)
	}
	got := machineSet(works)
	if len(works) != 3 || !got[ms[2]] || !got[ms[3]] || !got[ms[4]] {
		t.Fatalf("WorkMany claimed %v, want machines 2, 3, 4", got)
	}
	// What is left for a second batch: machine 5 only.
	rest, err := s2.WorkMany(ctx, "install", 10, retrieveAll(ms...))
	if err != nil || len(rest) != 1 || rest[0].Machine() != ms[5] {
		t.Fatalf("second WorkMany = %v, %v", machineSet(rest), err)
	}
	if _, err := s2.WorkMany(ctx, "install", 10, retrieveAll(ms...)); !errors.Is(err, ErrWorkConflict) {
		t.Fatalf("WorkMany with every machine taken = %v, want ErrWorkConflict", err)
	}

	tagAll := NewSharedCommit(func(tx *Tx, works []*Work) error {
		for _, w := range works {
			if err := tagCommit(w.Machine())(tx); err != nil {
				return err
			}
		}
		return nil
	})
	errs := make([]error, len(works))
	var finishes []func()
	for i, w := range works {
		finishes = append(finishes, func() { errs[i] = w.Finish(ctx, nil, CommitShared(tagAll)) })
	}
	behindHeldClaim(t, s1, ms[5], finishes...)()
	for i, w := range works {
		if errs[i] != nil || !e.tagged(w.Machine()) {
			t.Errorf("Finish of %s = %v (tagged %v)", w.Machine(), errs[i], e.tagged(w.Machine()))
		}
		if got := e.events(w.Machine(), s1); !slicesEqual(got, "install:Started@1", "install:Finished@1") {
			t.Errorf("history of %s = %v", w.Machine(), got)
		}
		if err := w.Cancel(ctx); !errors.Is(err, ErrWorkDone) {
			t.Errorf("Cancel after Finish = %v", err)
		}
	}
	if n := e.count("SELECT count(DISTINCT at) FROM work_history WHERE session_id = $1 AND event = 'Finished'", s1.ID()); n != 1 {
		t.Errorf("the batched Finishes took %d statements, want 1", n)
	}
	if err := held.Finish(ctx, noCommit); err != nil {
		t.Fatal(err)
	}
}

func TestBatchRejectsBadInput(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open()
	s := e.session(c)
	ctx := context.Background()
	m1 := e.machine()
	for _, limit := range []int{0, -1, MaxWorkMany + 1} {
		if _, err := s.WorkMany(ctx, "install", limit, retrieveAll(m1)); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("WorkMany(limit %d) = %v", limit, err)
		}
	}
	if n := e.count("SELECT count(*) FROM work"); n != 0 {
		t.Errorf("refused calls changed the claims: %d left", n)
	}
}

// queryIDs runs a retrieval's query in tx and returns the ids it selects.
func queryIDs(tx *Tx, query string) ([]uuid.UUID, error) {
	rows, err := tx.DBTX().QueryContext(context.Background(), query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}
