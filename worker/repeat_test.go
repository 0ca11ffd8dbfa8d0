package worker

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
)

// A warning is logged once, then counted; the count is logged when
// another warning or a success replaces it, and every repeatedEvery.
func TestRepeatedWarning(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var r repeated
	for _, step := range []struct {
		msg  string // "": ok()
		at   time.Duration
		want []string
	}{
		{msg: "a", at: 0, want: []string{"a"}},
		{msg: "a", at: time.Second},
		{msg: "a", at: 2 * time.Second},
		{msg: "b", at: 3 * time.Second, want: []string{"a (repeated 2 times in 2s)", "b"}},
		{msg: "b", at: 3*time.Second + 250*time.Millisecond},
		{msg: "b", at: 33 * time.Second, want: []string{"b (repeated 2 times in 30s)"}},
		{msg: "b", at: 34 * time.Second},
		{msg: "", at: 35 * time.Second, want: []string{"b (repeated 1 times in 1s)"}},
		{msg: "", at: 36 * time.Second},
		{msg: "b", at: 37 * time.Second, want: []string{"b"}},
		{msg: "b", at: 37*time.Second + 40*time.Millisecond},
		{msg: "", at: 38 * time.Second, want: []string{"b (repeated 1 times in 40ms)"}},
	} {
		var got []string
		if step.msg == "" {
			got = r.clear()
		} else {
			got = r.note(step.msg, at(step.at))
		}
		if !slices.Equal(got, step.want) {
			t.Errorf("at %v, %q: logged %q, want %q", step.at, step.msg, got, step.want)
		}
	}
}

// A loop whose claims fail for a while (here its retrieval's own service
// is down) logs the warning once, and the count when the claims succeed
// again, not a line per poll.
func TestClaimWarningLoggedOnceWithCount(t *testing.T) {
	logs := tapKlog(t)
	e := newEnv(t, 0)
	const proc = "warn-once"
	var failing atomic.Int64
	l, err := New(e.conn, Config{
		Process: proc,
		Retrieve: func(ctx context.Context, tx *bmdb.Tx, limit int32) ([]uuid.UUID, error) {
			if failing.Add(1) <= 40 {
				return nil, errors.New("inventory service unavailable")
			}
			return nil, nil
		},
		Work:    func(context.Context, *bmdb.Work) (func(*bmdb.Tx) error, error) { return nil, nil },
		PollMin: 5 * time.Millisecond, PollMax: 10 * time.Millisecond,
		StopWhenIdle: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := returned(t, runAsync(t, l), time.Minute); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if n := failing.Load(); n <= 40 {
		t.Fatalf("the retrieval ran %d times, want the 40 failures and more", n)
	}
	lines := logs.with("worker "+proc+": claiming", "inventory service unavailable")
	if len(lines) != 2 {
		t.Fatalf("%d warning lines, want 2 (the first, then the count):\n%s", len(lines), strings.Join(lines, "\n"))
	}
	m := regexp.MustCompile(`\(repeated (\d+) times in [0-9.]+m?s\)$`).FindStringSubmatch(lines[1])
	if m == nil || strings.Contains(lines[0], "repeated") {
		t.Fatalf("want the warning, then its count; got:\n%s", strings.Join(lines, "\n"))
	}
	// Each failed claim ran the retrieval once: 40 failures, one logged.
	if n, _ := strconv.Atoi(m[1]); n != 39 {
		t.Errorf("the count says %d repeats, want 39", n)
	}
}
