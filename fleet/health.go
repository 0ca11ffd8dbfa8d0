package fleet

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/bmdb-dev/bmdb/model"
)

// recentStarts is how many of a process's most recent Started events name
// the components that serve it.
const recentStarts = 200

// ProcessHealth is what the overview says of one process: its claims, the
// machines that wait for it, and whether a live session serves it. bmdb
// knows no list of processes: a process appears once it has a claim, a
// backoff, an event in the last hour or (app_pending_work) pending work.
type ProcessHealth struct {
	Process              string  `json:"process"`
	LiveClaims           int64   `json:"live_claims"`
	OldestLiveAgeSeconds float64 `json:"oldest_live_age_seconds"`
	// ExpiredClaims are held by expired sessions: stuck until the next
	// takeover or GC.
	ExpiredClaims           int64   `json:"expired_claims"`
	OldestExpiredAgeSeconds float64 `json:"oldest_expired_age_seconds"`
	// InBackoff machines have no claim and a backoff in force; BackoffDue
	// ones are past their backoff, waiting to be retried.
	InBackoff  int64 `json:"in_backoff"`
	BackoffDue int64 `json:"backoff_due"`
	// Ready machines need the process (app_pending_work) and have neither
	// claim nor backoff; always 0 without that view.
	Ready int64 `json:"ready"`
	// Pending is the machines waiting for the process: ExpiredClaims +
	// InBackoff + BackoffDue + Ready (disjoint sets).
	Pending int64 `json:"pending"`
	// Components are the components seen doing the process (holding its
	// claims or starting its last claims), LiveSessions their live sessions.
	Components   []string `json:"components"`
	LiveSessions int64    `json:"live_sessions"`
	// Warning is set when the process has pending work and no live session.
	Warning string `json:"warning,omitempty"`
}

// readHealth returns the health of every process the overview shows, by
// name: those of events (the processes with history in the plotted hour)
// and the processes with claims, backoffs or pending work.
func readHealth(ctx context.Context, db *sql.DB, events []string, live []model.LiveSession, views AppViews) ([]ProcessHealth, error) {
	q := model.New(db)
	byName := map[string]*ProcessHealth{}
	get := func(p string) *ProcessHealth {
		if byName[p] == nil {
			byName[p] = &ProcessHealth{Process: p, Components: []string{}}
		}
		return byName[p]
	}
	for _, p := range events {
		get(p)
	}
	claims, err := q.CurrentWorkHealthByProcess(ctx)
	if err != nil {
		return nil, err
	}
	for _, c := range claims {
		ph := get(c.Process)
		ph.LiveClaims, ph.OldestLiveAgeSeconds = c.LiveClaims, c.OldestLiveAgeSeconds
		ph.ExpiredClaims, ph.OldestExpiredAgeSeconds = c.ExpiredClaims, c.OldestExpiredAgeSeconds
	}
	backoffs, err := q.WorkBackoffWaitingByProcess(ctx)
	if err != nil {
		return nil, err
	}
	for _, b := range backoffs {
		ph := get(b.Process)
		ph.InBackoff, ph.BackoffDue = b.InForce, b.Due
	}
	if views.Pending {
		ready, err := readReadyWork(ctx, db)
		if err != nil {
			return nil, err
		}
		for p, n := range ready {
			get(p).Ready = n
		}
	}
	if err := readComponents(ctx, q, byName); err != nil {
		return nil, err
	}
	out := make([]ProcessHealth, 0, len(byName))
	for _, ph := range byName {
		ph.judge(live)
		out = append(out, *ph)
	}
	slices.SortFunc(out, func(a, b ProcessHealth) int { return strings.Compare(a.Process, b.Process) })
	return out, nil
}

// readComponents fills in the components of each process: those holding
// its claims and those that started its most recent claims.
func readComponents(ctx context.Context, q *model.Queries, byName map[string]*ProcessHealth) error {
	holders, err := q.CurrentWorkComponentsByProcess(ctx)
	if err != nil {
		return err
	}
	for _, c := range holders {
		if ph := byName[c.Process]; ph != nil {
			ph.Components = appendNew(ph.Components, c.ComponentName)
		}
	}
	for p, ph := range byName {
		recent, err := q.WorkHistoryRecentComponents(ctx, model.WorkHistoryRecentComponentsParams{Process: p, RowLimit: recentStarts})
		if err != nil {
			return err
		}
		for _, c := range recent {
			ph.Components = appendNew(ph.Components, c)
		}
		slices.Sort(ph.Components)
	}
	return nil
}

// judge counts the live sessions of ph's components and the pending
// machines, and sets the warning.
func (ph *ProcessHealth) judge(live []model.LiveSession) {
	for _, s := range live {
		if slices.Contains(ph.Components, s.ComponentName) {
			ph.LiveSessions++
		}
	}
	ph.Pending = ph.ExpiredClaims + ph.InBackoff + ph.BackoffDue + ph.Ready
	if ph.Pending == 0 || ph.LiveSessions > 0 {
		return
	}
	who := "no component has done it recently"
	if len(ph.Components) > 0 {
		who = "no live session of " + strings.Join(ph.Components, ", ")
	}
	machines := "machines wait"
	if ph.Pending == 1 {
		machines = "machine waits"
	}
	ph.Warning = fmt.Sprintf("%d %s for %s and %s", ph.Pending, machines, ph.Process, who)
}

func appendNew(list []string, s string) []string {
	if s == "" || slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}
