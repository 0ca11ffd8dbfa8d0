package fleet

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/model"
)

// Session is one session: its row while it has one, its claims and its
// most recent history.
type Session struct {
	// Now is the database's clock when the session was read.
	Now time.Time `json:"now"`
	ID  uuid.UUID `json:"session_id"`
	// Row is nil once the session has expired and been collected; its
	// history remains.
	Row     *model.Session          `json:"session"`
	Alive   bool                    `json:"alive"`
	Work    []model.CurrentWork     `json:"work"`
	History []model.ReadableHistory `json:"history"`
}

// ReadSession returns session id with its claims and its historyLimit
// most recent events. A session without a row and without history is
// ErrNotFound.
func ReadSession(ctx context.Context, db *sql.DB, id uuid.UUID, historyLimit int) (Session, error) {
	q := model.New(db)
	s := Session{ID: id}
	row, err := q.SessionGet(ctx, id)
	switch {
	case err == nil:
		s.Row = &row
	case !errors.Is(err, sql.ErrNoRows):
		return Session{}, err
	}
	if s.Work, err = q.CurrentWorkForSession(ctx, id); err != nil {
		return Session{}, err
	}
	if s.History, err = q.ReadableHistoryForSession(ctx, model.ReadableHistoryForSessionParams{SessionID: id, RowLimit: int32(historyLimit)}); err != nil {
		return Session{}, err
	}
	if s.Row == nil && len(s.History) == 0 {
		return Session{}, notFound("no session %s", id)
	}
	if s.Now, err = Now(ctx, db); err != nil {
		return Session{}, err
	}
	if s.Row != nil {
		s.Alive = s.Row.Deadline.After(s.Now)
	}
	return s, nil
}
