package fleet

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/model"
)

// takeoverWindow is how soon after an Abandoned row the next claim of the
// same (machine, process) must start to count as the takeover that
// abandoned it: a takeover writes both in one transaction, milliseconds
// apart.
const takeoverWindow = time.Second

// abandonedWhySQL reads, for each Abandoned row, what followed it for the
// same machine and process (the next history row), and its session's
// deadline if the session row is still there. A takeover removes the
// expired holder's claims and starts its own claim in one transaction; GC
// (or the holder's own Close after it expired) only removes them.
const abandonedWhySQL = `
SELECT h.id, s.deadline, n.event::TEXT, n.session_id, n.component_name, n.at
FROM work_history h
LEFT JOIN sessions s ON s.session_id = h.session_id
LEFT JOIN LATERAL (
    SELECT x.event, x.session_id, x.component_name, x.at FROM work_history x
    WHERE x.machine_id = h.machine_id AND x.process = h.process AND x.id > h.id
    ORDER BY x.id LIMIT 1
) n ON true
WHERE h.id = ANY ($1::INT8[]) AND h.event = 'Abandoned'`

// abandonedWhy says, for each Abandoned event in history (by id), why the
// claim was abandoned: its holder's session had expired (at its deadline,
// if the session row is still there), and the claim was taken over by
// another session, or removed when the expired session was collected.
// The reason is derived from history and sessions, nothing more is stored.
func abandonedWhy(ctx context.Context, db *sql.DB, history []model.ReadableHistory) (map[int64]string, error) {
	var ids []int64
	for _, h := range history {
		if h.Event == "Abandoned" {
			ids = append(ids, h.ID)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := db.QueryContext(ctx, abandonedWhySQL, pq.Array(ids))
	if err != nil {
		return nil, fmt.Errorf("reading why claims were abandoned: %w", err)
	}
	defer rows.Close()
	at := map[int64]time.Time{}
	holder := map[int64]uuid.UUID{}
	for _, h := range history {
		at[h.ID], holder[h.ID] = h.At, h.SessionID
	}
	why := map[int64]string{}
	for rows.Next() {
		var id int64
		var deadline, nextAt sql.NullTime
		var nextEvent, nextComponent sql.NullString
		var nextSession uuid.NullUUID
		if err := rows.Scan(&id, &deadline, &nextEvent, &nextSession, &nextComponent, &nextAt); err != nil {
			return nil, fmt.Errorf("reading why claims were abandoned: %w", err)
		}
		expired := "its holder's session had expired"
		if deadline.Valid {
			expired = "its holder's session expired at " + deadline.Time.UTC().Format("2006-01-02 15:04:05Z")
		}
		switch {
		case nextEvent.String == "Started" && nextSession.Valid && nextSession.UUID != holder[id] &&
			nextAt.Valid && nextAt.Time.Sub(at[id]) < takeoverWindow:
			why[id] = fmt.Sprintf("%s; taken over by session %s (%s)", expired, nextSession.UUID.String()[:8], nextComponent.String)
		default:
			why[id] = expired + "; removed when the expired session was collected (GC) or closed"
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading why claims were abandoned: %w", err)
	}
	return why, nil
}
