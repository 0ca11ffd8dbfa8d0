package bmdb

import (
	"github.com/bmdb-dev/bmdb/internal/claims"
	"github.com/bmdb-dev/bmdb/internal/txn"
)

// SharedCommit commits the results of several Works in one call, for
// applications whose results can be written in one statement (an INSERT
// ... SELECT over the machines' ids, say). The Finishes that share a
// transaction (see "Batches" in the package doc) and pass the same
// *SharedCommit through CommitShared are committed by one call with all
// their Works. Make one with NewSharedCommit for each kind of result,
// once, and reuse it: a new one per Finish shares nothing. Safe for
// concurrent use.
type SharedCommit struct {
	shared *claims.Shared
}

// NewSharedCommit returns a SharedCommit that applies the results of works
// inside tx with commit. Like Finish's commit, commit may run several
// times, must wrap errors with %w, and must not call Work or the ends of
// the same session. If it fails, its Works are finished again one at a
// time (commit called with one Work each), so that only the Works it
// refuses fail. It returns nil if commit is nil.
func NewSharedCommit(commit func(tx *Tx, works []*Work) error) *SharedCommit {
	if commit == nil {
		return nil
	}
	return &SharedCommit{shared: &claims.Shared{Commit: func(tx *txn.Tx, owners []any) error {
		works := make([]*Work, len(owners))
		for i, o := range owners {
			works[i] = o.(*Work)
		}
		return commit(newTx(tx), works)
	}}}
}

// FinishOption changes how Finish commits a Work's result. Finish takes
// one at most.
type FinishOption struct {
	shared *SharedCommit
}

// CommitShared is the FinishOption that commits the Work's result with s,
// once for all the Works of its transaction that pass s, instead of with
// Finish's commit, which must then be nil.
func CommitShared(s *SharedCommit) FinishOption { return FinishOption{shared: s} }
