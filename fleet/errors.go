package fleet

import (
	"errors"
	"fmt"
)

// The kinds of the caller's mistakes, which an *Error wraps.
var (
	// ErrInvalidArgument: a read refused an argument (a malformed cursor,
	// a stage filter where the application defines no stages).
	ErrInvalidArgument = errors.New("fleet: invalid argument")
	// ErrNotFound: the machine or session asked for does not exist.
	ErrNotFound = errors.New("fleet: not found")
)

// An Error is a mistake in what a read was asked for. Its message is for
// people, as package web and bmdbctl show it, without a prefix; errors.Is
// matches its Kind.
type Error struct {
	Kind error // ErrInvalidArgument or ErrNotFound
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns e.Kind.
func (e *Error) Unwrap() error { return e.Kind }

func invalidArgument(format string, args ...any) error {
	return &Error{Kind: ErrInvalidArgument, Msg: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) error {
	return &Error{Kind: ErrNotFound, Msg: fmt.Sprintf(format, args...)}
}
