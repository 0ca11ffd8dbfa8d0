package claims

import (
	"errors"
	"fmt"
)

// The engine's sentinel errors, which bmdb exports under the same names
// (bmdb/errors.go documents them for callers).
var (
	ErrWorkConflict   = errors.New("bmdb: work conflict: machine already claimed by a live session")
	ErrNothingToDo    = errors.New("bmdb: nothing to do")
	ErrProcessPaused  = fmt.Errorf("%w: process paused", ErrNothingToDo)
	ErrCapReached     = fmt.Errorf("%w: process at its cap of live claims", ErrNothingToDo)
	ErrWorkLost       = errors.New("bmdb: work claim lost")
	ErrUnknownMachine = errors.New("bmdb: unknown machine")
)
