package fleet

import "testing"

// The series: events per minute of the last hour per process, and the
// claim ages now, in their buckets.
func TestSeries(t *testing.T) {
	f := seed(t)
	o := overview(t, f.db)
	if len(o.Events) != 1 || o.Events[0].Process != "install-os" || len(o.Events[0].Finished) != EventMinutes {
		t.Fatalf("events %+v", o.Events)
	}
	e := o.Events[0]
	// The events happened while seeding: this minute, or the one before.
	if e.Summary() != "1 finished, 1 failed, 0 abandoned" || e.Finished[EventMinutes-1]+e.Finished[EventMinutes-2] != 1 {
		t.Errorf("install-os events %+v", e)
	}
	if !e.Since.Equal(o.Now.Truncate(60e9).Add(-(EventMinutes - 1) * 60e9)) {
		t.Errorf("events since %v, now %v", e.Since, o.Now)
	}
	if len(o.ClaimAges) != len(AgeBuckets) || o.ClaimAges.Claims() != 1 || o.ClaimAges[0].Alive+o.ClaimAges[1].Alive != 1 {
		t.Errorf("claim ages %+v", o.ClaimAges)
	}
	for i, b := range o.ClaimAges {
		if b.Label != AgeBuckets[i] {
			t.Errorf("bucket %d labelled %q, want %q", i, b.Label, AgeBuckets[i])
		}
	}
}
