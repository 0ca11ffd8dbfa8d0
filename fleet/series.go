package fleet

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/bmdb-dev/bmdb/model"
)

// The overview's series, which package web plots: events per minute over
// the last hour, by the (at) index of work_history, and the ages of the
// claims now (one row per claim in flight).
const (
	// EventMinutes is how many minutes EventRates cover.
	EventMinutes = 60
	// eventRowLimit bounds the events query: minutes × events × processes.
	eventRowLimit = EventMinutes * 3 * 100
)

// EventRates are one process's Finished, Failed and Abandoned events per
// minute over the last hour, oldest minute first.
type EventRates struct {
	Process   string    `json:"process"`
	Since     time.Time `json:"since"` // the first minute
	Finished  []int64   `json:"finished"`
	Failed    []int64   `json:"failed"`
	Abandoned []int64   `json:"abandoned"`
}

// readEventRates returns the event rates of every process with events in
// the hour before now, by process.
func readEventRates(ctx context.Context, db *sql.DB, now time.Time) ([]EventRates, error) {
	since := now.Truncate(time.Minute).Add(-(EventMinutes - 1) * time.Minute)
	rows, err := model.New(db).WorkHistoryEventsPerMinute(ctx, model.WorkHistoryEventsPerMinuteParams{Since: since, RowLimit: eventRowLimit})
	if err != nil {
		return nil, err
	}
	byProcess := map[string]*EventRates{}
	out := []EventRates{}
	for _, r := range rows {
		e := byProcess[r.Process]
		if e == nil {
			e = &EventRates{Process: r.Process, Since: since,
				Finished: make([]int64, EventMinutes), Failed: make([]int64, EventMinutes), Abandoned: make([]int64, EventMinutes)}
			byProcess[r.Process] = e
		}
		i := int(r.Minute.Sub(since) / time.Minute)
		if i < 0 || i >= EventMinutes {
			continue
		}
		switch r.Event {
		case "Finished":
			e.Finished[i] += r.Events
		case "Failed":
			e.Failed[i] += r.Events
		case "Abandoned":
			e.Abandoned[i] += r.Events
		}
	}
	for _, e := range byProcess {
		out = append(out, *e)
	}
	slices.SortFunc(out, func(a, b EventRates) int { return strings.Compare(a.Process, b.Process) })
	return out, nil
}

// Summary says how many events of each kind the hour had.
func (e EventRates) Summary() string {
	var finished, failed, abandoned int64
	for i := range e.Finished {
		finished, failed, abandoned = finished+e.Finished[i], failed+e.Failed[i], abandoned+e.Abandoned[i]
	}
	return fmt.Sprintf("%d finished, %d failed, %d abandoned", finished, failed, abandoned)
}

// AgeBuckets are the labels of ClaimAges' buckets, in order; their bounds
// are in the query (model's CurrentWorkAgeHistogram).
var AgeBuckets = []string{"<10 s", "10–30 s", "30 s–1 m", "1–5 m", "5–15 m", "15 m–1 h", "1–6 h", "≥6 h"}

// AgeBucket is one bar of the claim age distribution.
type AgeBucket struct {
	Label   string `json:"label"`
	Alive   int64  `json:"alive"`
	Expired int64  `json:"expired"` // held by expired sessions
}

// ClaimAges is the distribution of the ages of the claims now, one bucket
// per AgeBuckets label, youngest first.
type ClaimAges []AgeBucket

// readClaimAges returns the age distribution of the claims now.
func readClaimAges(ctx context.Context, db *sql.DB) (ClaimAges, error) {
	rows, err := model.New(db).CurrentWorkAgeHistogram(ctx)
	if err != nil {
		return nil, err
	}
	out := make(ClaimAges, len(AgeBuckets))
	for i, l := range AgeBuckets {
		out[i].Label = l
	}
	for _, r := range rows {
		if r.Bucket < 0 || int(r.Bucket) >= len(out) {
			continue
		}
		if r.Alive {
			out[r.Bucket].Alive += r.Claims
		} else {
			out[r.Bucket].Expired += r.Claims
		}
	}
	return out, nil
}

// Claims returns the number of claims.
func (c ClaimAges) Claims() int64 {
	var n int64
	for _, b := range c {
		n += b.Alive + b.Expired
	}
	return n
}
