package chaos

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"
)

// A worker records every operation it invokes, and what came back, in a
// history file of its own (worker-N.history, appended to across
// restarts): one JSON record at the invocation and one at the return,
// each written with one write(2), so that a SIGKILL loses at most the
// return of the operations then in flight. Times are CLOCK_MONOTONIC,
// which every process of the host shares and a stall does not stop.

// Operation kinds of a history.
const (
	opClaim        = "claim"         // Session.WorkMany
	opFinish       = "finish"        // Work.Finish, whose commit writes one effect
	opFail         = "fail"          // Work.Fail
	opCancel       = "cancel"        // Work.Cancel
	opSessionStart = "session-start" // Connection.StartSession
	opSessionEnd   = "session-end"   // a session's Done, with its cause (Return only)
	opSched        = "sched"         // the worker's worst timer lateness over a window (sched.go): Call to Return, Late
	opPing         = "ping"          // a SELECT 1 round trip of the worker's (sched.go): Call to Return, Late
	opConnect      = "connect"       // the opening of the worker's probe connection (sched.go): Call to Return, Late
)

// Outcomes of an operation, as the client saw them.
const (
	outOK        = "ok"
	outLost      = "lost"      // ErrWorkLost: the database found the claim gone
	outExpired   = "expired"   // ErrSessionExpired or ErrSessionClosed
	outAmbiguous = "ambiguous" // ErrAmbiguousCommit
	outError     = "error"     // any other error: nothing is known
	outUnknown   = "unknown"   // no return recorded (the process was killed)
)

// claimed is one claim a claim operation returned.
type claimed struct {
	Machine uuid.UUID `json:"m"`
	Claim   uuid.UUID `json:"c"`
	Token   int64     `json:"t"`
}

// record is one line of a history file: an invocation (Kind set) or a
// return (Return set) of operation ID.
type record struct {
	ID      string    `json:"id"`
	Kind    string    `json:"k,omitempty"`
	Session uuid.UUID `json:"s,omitzero"`
	Machine uuid.UUID `json:"m,omitzero"`
	Claim   uuid.UUID `json:"c,omitzero"`
	Call    int64     `json:"i,omitempty"`
	Return  int64     `json:"r,omitempty"`
	Out     string    `json:"o,omitempty"`
	Err     string    `json:"e,omitempty"`
	Claims  []claimed `json:"cl,omitempty"`
	Late    int64     `json:"l,omitempty"` // opSched: the most the worker woke late in the window; opPing, opConnect: how long it took; nanoseconds
}

// monotonic returns CLOCK_MONOTONIC in nanoseconds.
func monotonic() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("chaos: clock_gettime: %v", err))
	}
	return ts.Nano()
}

// realtimeOffset returns CLOCK_REALTIME - CLOCK_MONOTONIC, which turns the
// database's timestamps (PostgreSQL runs on this host's clock) into the
// histories' times.
func realtimeOffset() int64 {
	var rt unix.Timespec
	m0 := monotonic()
	if err := unix.ClockGettime(unix.CLOCK_REALTIME, &rt); err != nil {
		panic(fmt.Sprintf("chaos: clock_gettime: %v", err))
	}
	return rt.Nano() - (m0+monotonic())/2
}

// recorder appends a worker process's records to its history file. Safe
// for concurrent use.
type recorder struct {
	f    *os.File
	pid  int
	next atomic.Int64
	mu   sync.Mutex // one write per record
}

func historyPath(logDir string, worker int) string {
	return filepath.Join(logDir, fmt.Sprintf("worker-%d.history", worker))
}

func newRecorder(path string) (*recorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("chaos: opening history: %w", err)
	}
	return &recorder{f: f, pid: os.Getpid()}, nil
}

func (r *recorder) close() error { return r.f.Close() }

func (r *recorder) write(rec record) {
	b, err := json.Marshal(rec)
	if err != nil {
		panic(err) // plain data: cannot happen
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.f.Write(append(b, '\n')); err != nil {
		panic(fmt.Sprintf("chaos: writing history: %v", err)) // the check would be wrong without it
	}
}

// nextID returns a new operation id.
func (r *recorder) nextID() string { return fmt.Sprintf("%d.%d", r.pid, r.next.Add(1)) }

// invoke records the invocation of an operation and returns its id.
func (r *recorder) invoke(rec record) string {
	rec.ID = r.nextID()
	rec.Call = monotonic()
	r.write(rec)
	return rec.ID
}

// returned records the return of operation id with outcome err.
func (r *recorder) returned(id string, err error, claims []claimed) {
	out, msg := outcome(err)
	r.write(record{ID: id, Return: monotonic(), Out: out, Err: msg, Claims: claims})
}

// sessionEnded records the end of session s (an operation with no call).
func (r *recorder) sessionEnded(s uuid.UUID, cause error) {
	out, msg := outcome(cause)
	r.write(record{ID: r.nextID(), Kind: opSessionEnd, Session: s, Return: monotonic(), Out: out, Err: msg})
}

// op is one operation of a history: an invocation and its return (Return
// 0 and Out outUnknown if none was recorded).
type op struct {
	record
	Worker int
}

// readHistories reads the history files of workers 0..n-1 in logDir and
// returns their operations, in order of invocation.
func readHistories(logDir string, n int) ([]*op, error) {
	var ops []*op
	for w := range n {
		f, err := os.Open(historyPath(logDir, w))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("chaos: reading history: %w", err)
		}
		byID := map[string]*op{}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var rec record
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
				if strings.TrimSpace(sc.Text()) == "" {
					continue
				}
				f.Close()
				return nil, fmt.Errorf("chaos: history of worker %d: %w", w, err)
			}
			if o := byID[rec.ID]; o != nil && rec.Kind == "" {
				o.Return, o.Out, o.Err, o.Claims = rec.Return, rec.Out, rec.Err, rec.Claims
				if rec.Session != uuid.Nil {
					o.Session = rec.Session
				}
				continue
			}
			o := &op{record: rec, Worker: w}
			if o.Out == "" {
				o.Out = outUnknown
			}
			if o.Kind == opSessionEnd {
				o.Call = o.Return
			}
			byID[rec.ID] = o
			ops = append(ops, o)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("chaos: reading history of worker %d: %w", w, err)
		}
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	return ops, nil
}
