package bmdb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/store"
)

// MaxBatch is the largest limit of WorkBatch and the most Works FinishAll
// takes.
const MaxBatch = 1000

// WorkBatch is Work for up to limit machines at once: one transaction claims
// as many candidates as it can, in order, up to limit, and returns one Work
// for each. Each Work then ends on its own (Finish, Cancel, Fail) or together
// with others (FinishAll).
//
// On PostgreSQL, concurrent claim cycles on the small, hot work table
// conflict under SERIALIZABLE whatever machines they touch, so throughput
// grows with work done per transaction, not with workers: claim for as many
// machines as you have free workers (as worker.Loop does), and let
// concurrent ends share transactions (see Work.Finish). A batch holds its
// machines until each ends, so keep limit near what a worker processes at
// once. Like Work, it may share its transaction with the session's other
// concurrent claims of process.
//
// It returns an error wrapping ErrInvalidArgument for limit outside
// [1, MaxBatch], and otherwise the errors of Work.
func (s *Session) WorkBatch(ctx context.Context, process string, limit int, retrieve func(tx *Tx) ([]uuid.UUID, error)) ([]*Work, error) {
	if limit < 1 || limit > MaxBatch {
		return nil, invalidArgument("WorkBatch: limit is %d, must be in [1, %d]", limit, MaxBatch)
	}
	return s.claimBatch(ctx, process, limit, retrieve)
}

// FinishAll finishes works, all claims of this session, in one transaction
// of a few statements whatever their number: it ends every claim (only if
// this session still holds it), records Finished, clears their backoffs,
// and runs commit(tx, works) once, to apply the results of all of them. It
// is all or nothing: if any claim is gone, FinishAll returns ErrWorkLost
// naming it and nothing commits; that Work is ended (ErrWorkDone from then
// on) and the others stay open, to be finished again without it. Like
// Finish, an error from commit rolls everything back and leaves every Work
// open.
//
// commit may run several times (see Transact) and must not be nil. works
// must be non-empty, at most MaxBatch, of this session, distinct, and not
// ended (else ErrInvalidArgument or ErrWorkDone).
func (s *Session) FinishAll(ctx context.Context, works []*Work, commit func(tx *Tx, works []*Work) error) error {
	if err := s.checkBatch(works); err != nil {
		return err
	}
	if commit == nil {
		return invalidArgument("FinishAll: commit is nil")
	}
	// Lock in a fixed order, so that overlapping calls cannot deadlock.
	sorted := slices.Clone(works)
	slices.SortFunc(sorted, func(a, b *Work) int {
		if c := bytes.Compare(a.machine[:], b.machine[:]); c != 0 {
			return c
		}
		return strings.Compare(a.process, b.process)
	})
	for _, w := range sorted {
		w.mu.Lock()
		defer w.mu.Unlock()
	}
	for _, w := range works {
		if w.ended {
			return fmt.Errorf("bmdb: FinishAll: %q on %s: %w", w.process, w.machine, ErrWorkDone)
		}
	}
	var lost *Work
	err := s.claimTransact(ctx, priorityEnd, func(tx *Tx) error {
		lost = nil
		for process, group := range byProcess(works) {
			var err error
			if lost, err = s.finishGroup(ctx, tx, process, group); err != nil {
				return err
			}
			if lost != nil {
				return lost.lostError()
			}
		}
		return commit(tx, works)
	})
	switch {
	case err == nil:
		for _, w := range works {
			w.ended = true
			s.conn.metrics.workEvent(w.process, store.WorkHistoryEventFinished)
		}
	case errors.Is(err, ErrSessionExpired) || errors.Is(err, ErrSessionClosed):
		for _, w := range works {
			w.ended = true
		}
	case lost != nil:
		lost.ended = true
	}
	return err
}

// finishGroup ends the claims of one process inside tx and clears their
// backoffs (finishMany). It returns the first Work whose claim was no
// longer held, if any.
func (s *Session) finishGroup(ctx context.Context, tx *Tx, process string, group []*Work) (*Work, error) {
	ended, err := s.finishMany(ctx, tx, process, group)
	if err != nil {
		return nil, fmt.Errorf("bmdb: FinishAll: ending %d claims of %q: %w", len(group), process, err)
	}
	for _, w := range group {
		if !ended[w.claimID] {
			return w, nil
		}
	}
	return nil, nil
}

// byProcess groups works by process.
func byProcess(works []*Work) map[string][]*Work {
	groups := map[string][]*Work{}
	for _, w := range works {
		groups[w.process] = append(groups[w.process], w)
	}
	return groups
}

// checkBatch validates the Works given to FinishAll.
func (s *Session) checkBatch(works []*Work) error {
	if len(works) == 0 || len(works) > MaxBatch {
		return invalidArgument("FinishAll: %d works, must be 1 to %d", len(works), MaxBatch)
	}
	type key struct {
		machine uuid.UUID
		process string
	}
	seen := make(map[key]bool, len(works))
	for i, w := range works {
		switch {
		case w == nil:
			return invalidArgument("FinishAll: works[%d] is nil", i)
		case w.s != s:
			return invalidArgument("FinishAll: works[%d] (%q on %s) belongs to another session", i, w.process, w.machine)
		case seen[key{w.machine, w.process}]:
			return invalidArgument("FinishAll: works[%d] (%q on %s) is given twice", i, w.process, w.machine)
		}
		seen[key{w.machine, w.process}] = true
	}
	return nil
}
