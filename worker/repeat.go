package worker

import (
	"fmt"
	"time"

	"k8s.io/klog/v2"
)

// A loop polls: a warning about a poll (a claim, a session start, a count
// of the work left that failed) comes back on every poll while its cause
// lasts. repeated logs such a warning once, then counts it: the count is
// logged with the warning when another one (or a success) replaces it, and
// every repeatedEvery while it goes on, as
//
//	worker install: claiming: ... (repeated 125 times in 30s)
//
// so the log says how long the cause lasted without a line per poll.
type repeated struct {
	msg    string    // the warning logged last ("": none, or its cause ended)
	logged time.Time // when msg, or its count, was last logged
	n      int       // times msg came again since then, not logged
	last   time.Time // the last of those times
}

// repeatedEvery is how often the count of a warning that goes on is logged.
const repeatedEvery = 30 * time.Second

// warn logs msg as a warning, or counts it if it is the last one again.
func (r *repeated) warn(msg string) {
	for _, line := range r.note(msg, time.Now()) {
		klog.WarningDepth(1, line)
	}
}

// ok says that the cause of the last warning ended (a poll succeeded): it
// logs that warning's count, if it came again, and forgets it, so that it
// is logged at once if it comes back.
func (r *repeated) ok() {
	for _, line := range r.clear() {
		klog.WarningDepth(1, line)
	}
}

// note records msg at now and returns the lines to log: msg, if it is not
// the last warning (after the last one's count, if any), or the count, if
// repeatedEvery has passed since msg was last logged.
func (r *repeated) note(msg string, now time.Time) []string {
	if msg == r.msg {
		r.n, r.last = r.n+1, now
		if now.Sub(r.logged) < repeatedEvery {
			return nil
		}
		line := r.count()
		r.logged, r.n = now, 0
		return []string{line}
	}
	lines := r.clear()
	r.msg, r.logged = msg, now
	return append(lines, msg)
}

// clear forgets the last warning and returns its count's line, if it came
// again since it was last logged.
func (r *repeated) clear() []string {
	var lines []string
	if r.n > 0 {
		lines = append(lines, r.count())
	}
	*r = repeated{}
	return lines
}

// count is the line that says how often the last warning came again.
func (r *repeated) count() string {
	d := r.last.Sub(r.logged)
	if d >= time.Second {
		d = d.Round(time.Second)
	} else {
		d = d.Round(time.Millisecond)
	}
	return fmt.Sprintf("%s (repeated %d times in %v)", r.msg, r.n, d)
}
