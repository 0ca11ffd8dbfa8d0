package fleet

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
)

// A session with its claims and history; collected, its history still.
func TestReadSession(t *testing.T) {
	f := seed(t)
	ctx := context.Background()
	s, err := ReadSession(ctx, f.db, f.sess.ID(), 50)
	if err != nil {
		t.Fatal(err)
	}
	if s.Row == nil || !s.Alive || len(s.Work) != 1 || s.Work[0].MachineID != f.busy || len(s.History) != 50 || s.Row.RuntimeInfo != "host1 pid 42" {
		t.Errorf("session: row %v alive %v, %d claims, %d events", s.Row != nil, s.Alive, len(s.Work), len(s.History))
	}
	f.expire(t)
	if s, err = ReadSession(ctx, f.db, f.sess.ID(), 50); err != nil || s.Alive || s.Row == nil {
		t.Errorf("expired session: %+v, %v", s, err)
	}
	if _, err := f.db.Exec("DELETE FROM sessions WHERE session_id = $1", f.sess.ID()); err != nil {
		t.Fatal(err)
	}
	if s, err = ReadSession(ctx, f.db, f.sess.ID(), 10); err != nil || s.Row != nil || s.Alive || len(s.History) != 10 {
		t.Errorf("collected session: row %v alive %v, %d events, %v", s.Row, s.Alive, len(s.History), err)
	}
	unknown := uuid.New()
	if _, err := ReadSession(ctx, f.db, unknown, 10); !errors.Is(err, ErrNotFound) || err.Error() != "no session "+unknown.String() {
		t.Errorf("unknown session: %v, want ErrNotFound", err)
	}
}
