package bmdb

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/testing/netproxy"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// The tests of strict fencing and liveness: a worker whose network
// swallows packets, a server that never answers, a worker stopped (SIGSTOP)
// inside a transaction, and a partition between a Finish's last statement
// and its COMMIT. Each asserts on rows, errors and timings.

// effectsTable records the effects that workers commit.
const effectsTable = "CREATE TABLE effects (machine_id UUID NOT NULL, session_id UUID NOT NULL)"

// proxied returns a proxy to the env's server, closed at cleanup, and the
// env's DSN through it with application_name set to app.
func (e *env) proxied(app string) (*netproxy.Proxy, string) {
	e.t.Helper()
	p, dsn := netproxy.ForDSN(e.t, e.dsn)
	return p, testdb.WithApplicationName(e.t, dsn, app)
}

// dbRemaining returns how long the session has left on the database clock
// (negative once expired).
func (e *env) dbRemaining(id uuid.UUID) time.Duration {
	e.t.Helper()
	var secs float64
	err := e.db.QueryRow("SELECT EXTRACT(EPOCH FROM deadline - clock_timestamp())::FLOAT8 FROM sessions WHERE session_id = $1", id).Scan(&secs)
	if err != nil {
		e.t.Fatal(err)
	}
	return time.Duration(secs * float64(time.Second))
}

// backends counts the server's connections with application_name app.
func (e *env) backends(app string) int {
	e.t.Helper()
	n, err := testdb.Connections(context.Background(), e.db, app)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// A partition that swallows packets: the session ends locally, by its own
// timer, no later than its deadline on the database clock; a Transact is
// bounded by its context; Close returns within the interval. (Before, the
// session lived on until a heartbeat query returned, which on a black hole
// is when the operating system gives up.)
func TestBlackHoleEndsSessionAndCalls(t *testing.T) {
	e := newEnv(t)
	p, dsn := e.proxied("blackholed")
	c := e.open(func(c *Config) { c.DSN = dsn })
	s := e.session(c)
	if err := s.Transact(context.Background(), func(*Tx) error { return nil }); err != nil {
		t.Fatalf("Transact before the partition: %v", err)
	}
	ended := make(chan time.Time, 1)
	context.AfterFunc(s.Context(), func() { ended <- time.Now() })

	p.Cut(true)
	// A heartbeat in flight at the cut may have extended the deadline
	// without the worker hearing of it: read the deadline once none can.
	time.Sleep(50 * time.Millisecond)
	// (Within half a round trip: the remaining time is read on the server,
	// the local clock when its answer arrives.)
	remaining := e.dbRemaining(s.ID())
	dbDeadline := time.Now().Add(remaining)

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	start := time.Now()
	err := s.Transact(ctx, func(*Tx) error { return nil })
	cancel()
	if took := time.Since(start); err == nil || took > 800*time.Millisecond {
		t.Fatalf("Transact with a 500ms context on a black hole: %v after %v", err, took)
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrSessionExpired) {
		t.Errorf("Transact error %v does not say why", err)
	}
	t.Logf("Transact on the black hole: %v after %v", err, time.Since(start))

	var at time.Time
	select {
	case at = <-ended:
	case <-time.After(3 * testInterval):
		t.Fatalf("session context alive %v after the partition", 3*testInterval)
	}
	late := at.Sub(dbDeadline)
	t.Logf("session context cancelled %v after its database deadline", late)
	if late > 100*time.Millisecond {
		t.Errorf("session context cancelled %v after its database deadline, want at most 100ms", late)
	}
	if !errors.Is(s.Err(), ErrSessionExpired) {
		t.Errorf("Err = %v, want ErrSessionExpired", s.Err())
	}
	waitDone(t, s, time.Second)

	start = time.Now()
	err = s.Close(context.Background())
	if took := time.Since(start); took > testInterval+200*time.Millisecond {
		t.Errorf("Close on a black hole took %v", took)
	}
	t.Logf("Close on the black hole: %v", err)
}

// Open honours its context against a server that accepts the connection
// and never answers.
func TestOpenSilentServer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	defer func() {
		ln.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err = Open(ctx, Config{DSN: "postgres://bmdb@" + ln.Addr().String() + "/bmdb?sslmode=disable", ComponentName: "test"})
	took := time.Since(start)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || took > 1500*time.Millisecond {
		t.Fatalf("Open on a silent server with a 1s context: %v after %v", err, took)
	}
	t.Logf("Open on a silent server: %v after %v", err, took)
}

// Child process modes: a worker that claims a machine and then stops
// inside a transaction, where the parent sends it SIGSTOP, and waits
// there until the parent, after SIGCONT, writes a line to its stdin.
const (
	childModeEnv    = "BMDB_TEST_CHILD"
	childDSNEnv     = "BMDB_TEST_CHILD_DSN"
	childMachineEnv = "BMDB_TEST_CHILD_MACHINE"
	// childCockroach, in the mode, runs the child in cockroach mode.
	childCockroach = "@cockroach"
	// childInterval is the child's session interval: twice testInterval,
	// since its start (a race-detector binary, Open, a session, a claim,
	// in cockroach mode too) on a loaded machine outlasted a 1 s lease.
	childInterval = 2 * testInterval
)

// runChild is a child process's main: it prints "session ID claim ID",
// then "inside" where it waits to be stopped (and for a line on stdin),
// then "result ERR". Its clock margin is env.config's (100 ms): a late
// heartbeat then has interval/2 - 100 ms before the session expires
// locally, not interval/2 - 500 ms, and the child's session must not
// expire on a loaded machine before it is stopped.
func runChild(mode string) int {
	ctx := context.Background()
	cfg := Config{DSN: os.Getenv(childDSNEnv), ComponentName: "stalled", SessionInterval: childInterval, SkipMigrations: true,
		MaxClockOffset: 100 * time.Millisecond}
	if m, ok := strings.CutSuffix(mode, childCockroach); ok {
		mode, cfg.WrapConnector = m, crdbmode.New(crdbmode.Settings{Enabled: true}, nil).Wrap
	}
	c, err := Open(ctx, cfg)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer c.Close()
	s, err := c.StartSession(ctx)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer s.Close(ctx)
	machine := uuid.MustParse(os.Getenv(childMachineEnv))
	w, err := s.Work(ctx, "install", retrieveAll(machine))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("session", s.ID(), "claim", w.ClaimID())
	var once sync.Once
	stall := func() {
		once.Do(func() {
			fmt.Println("inside")
			// The parent stops us here, then lets us go on: however late
			// its SIGSTOP comes, the stall lasts until then.
			_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		})
	}
	effect := func(tx *Tx) error {
		_, err := tx.DBTX().ExecContext(ctx, "INSERT INTO effects (machine_id, session_id) VALUES ($1, $2)", machine, s.ID())
		return err
	}
	inCallback := func(tx *Tx) error {
		if err := effect(tx); err != nil {
			return err
		}
		stall()
		return nil
	}
	switch mode {
	case "transact":
		err = s.Transact(ctx, inCallback)
	case "transact-before-commit":
		c.leaseHooks.BeforeCommit = func(uuid.UUID) { stall() }
		err = s.Transact(ctx, effect)
	case "finish":
		err = w.Finish(ctx, inCallback)
	case "finish-before-commit":
		c.leaseHooks.BeforeCommit = func(uuid.UUID) { stall() }
		err = w.Finish(ctx, effect)
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	fmt.Printf("result %v\n", err)
	return 0
}

// child is a running child process.
type child struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	lines    chan string
	session  uuid.UUID
	claim    uuid.UUID
	waitOnce sync.Once
}

// startChild starts a child process (runChild) in mode on dsn, claiming
// machine, and returns it once it holds its claim; cleanup kills it.
func startChild(t *testing.T, mode, dsn string, machine uuid.UUID) *child {
	t.Helper()
	for try := 1; ; try++ {
		ch, line := spawnChild(t, mode, dsn, machine)
		// A child whose own session expired before it held its claim (a
		// loaded machine delayed its heartbeats) has not reached what
		// the tests are about: start another, at most three times.
		if strings.HasPrefix(line, "error") && strings.Contains(line, ErrSessionExpired.Error()) && try < 3 {
			t.Logf("child %d: %s; starting another", try, line)
			ch.stop()
			continue
		}
		if _, err := fmt.Sscanf(line, "session %s claim %s", new(string), new(string)); err != nil {
			t.Fatalf("child said %q", line)
		}
		f := strings.Fields(line)
		ch.session, ch.claim = uuid.MustParse(f[1]), uuid.MustParse(f[3])
		return ch
	}
}

// spawnChild starts a child process and returns it with its first line.
func spawnChild(t *testing.T, mode, dsn string, machine uuid.UUID) (*child, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childModeEnv+"="+mode, childDSNEnv+"="+dsn, childMachineEnv+"="+machine.String())
	cmd.Stderr = io.Discard
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := &child{cmd: cmd, stdin: in, lines: make(chan string, 16)}
	t.Cleanup(ch.stop)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ch.lines <- sc.Text()
		}
		close(ch.lines)
	}()
	select {
	case line := <-ch.lines:
		return ch, line
	case <-time.After(10 * time.Second):
		t.Fatal("child said nothing for 10s, want \"session\"...")
	}
	return nil, ""
}

// stop ends the child process, stopped or not; it may run more than once.
func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGCONT)
	_ = c.cmd.Process.Kill()
	c.waitOnce.Do(func() { _ = c.cmd.Wait() })
}

// resume lets a stopped child go on from its stall.
func (c *child) resume(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
}

// next returns the child's next line, which must start with prefix.
func (c *child) next(t *testing.T, prefix string) string {
	t.Helper()
	select {
	case line, ok := <-c.lines:
		if !ok || !strings.HasPrefix(line, prefix) {
			t.Fatalf("child said %q (open %v), want %q...", line, ok, prefix)
		}
		return line
	case <-time.After(10 * time.Second):
		t.Fatalf("child said nothing for 10s, want %q...", prefix)
	}
	return ""
}

// A worker stopped inside a transaction of its session (in its callback,
// or after its last check, right before COMMIT) while its session expires
// and another session takes its claim over: when it resumes, the
// transaction fails and none of its writes commit. The takeover waits
// behind the stalled transaction for at most about an interval. The stalls
// after the last check run in cockroach mode too, where that check's
// lowering of the idle timeout changes nothing (bmdb does not rely on it
// on CockroachDB): the connection's own timeout, one interval from the
// stall, which began before the deadline, keeps the bound. (Before, a
// stalled Transact committed after the takeover about half of the time.)
func TestStalledTransactionCommitsNothingAfterTakeover(t *testing.T) {
	for _, mode := range []string{"transact", "transact-before-commit", "finish", "finish-before-commit",
		"transact-before-commit" + childCockroach, "finish-before-commit" + childCockroach} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			e.exec(effectsTable)
			m, spare := e.machine(), e.machine()
			// The session that takes over is ready before the stall, and
			// steady: its Open and StartSession are no part of the wait.
			s := e.session(e.open(steady))
			ch := startChild(t, mode, e.dsn, m)
			ch.next(t, "inside")
			inside := time.Now()
			probe := testdb.StartDelayProbe(t)
			if err := ch.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			eventually(t, 5*childInterval, "the stopped worker's session to expire", func() bool { return !e.aliveInDB(ch.session) })
			expired := time.Now()

			ctx, cancel := context.WithTimeout(context.Background(), 5*childInterval)
			defer cancel()
			w, err := s.Work(ctx, "install", retrieveAll(m))
			if err != nil {
				t.Fatalf("takeover from the stopped worker: %v", err)
			}
			waited := time.Since(expired)
			// The wait's margin beyond the interval: 300 ms, plus what a
			// Work and its Cancel (two transactions, the takeover is one)
			// cost by themselves now, plus 4 times the worst scheduling
			// delay seen since the stall. A takeover that waits for the
			// stalled worker itself waits until resume, past ctx.
			begun := time.Now()
			if w, err := s.Work(ctx, "install", retrieveAll(spare)); err != nil {
				t.Fatalf("Work of another machine: %v", err)
			} else if err := w.Cancel(ctx); err != nil {
				t.Fatalf("Cancel of another machine's Work: %v", err)
			}
			cost, late := time.Since(begun), probe.Stop()
			limit := childInterval + 300*time.Millisecond + cost + 4*late
			t.Logf("takeover done %v after the stalled session's deadline (limit %v: a Work and Cancel took %v, worst scheduling delay %v)",
				waited, limit, cost, late)
			if waited > limit {
				t.Errorf("takeover waited %v behind the stalled worker, want at most about the interval (%v), by %v", waited, childInterval, limit)
			}

			// The stall lasts longer than the lease, as the promise says:
			// the connection's idle timeout (one interval, from the last
			// statement, before "inside") has ended the transaction then.
			// Earlier, a stalled transaction of CockroachDB's that wrote
			// nothing the takeover touches may commit, serialized before it.
			time.Sleep(time.Until(inside.Add(childInterval + 100*time.Millisecond)))
			ch.resume(t)
			result := ch.next(t, "result")
			t.Logf("stalled worker: %s", result)
			if result == "result <nil>" {
				t.Errorf("the stalled transaction reported success after the takeover")
			}
			if n := e.count("SELECT count(*) FROM effects WHERE session_id = $1", ch.session); n != 0 {
				t.Errorf("the stalled worker committed %d effects after its claim was taken over", n)
			}
			if n := e.count("SELECT count(*) FROM work_history WHERE claim_id = $1 AND event = 'Abandoned'", ch.claim); n != 1 {
				t.Errorf("%d Abandoned rows for the stalled claim, want 1", n)
			}
			if err := w.Finish(context.Background(), noCommit); err != nil {
				t.Errorf("Finish of the new claim: %v", err)
			}
		})
	}
}

// A partition between a Finish's last statement and its COMMIT: the
// connection is left idle in a transaction that holds the claim, and the
// COMMIT waits in the black hole. The takeover does not wait for it beyond
// the deadline; the Finish fails when its session ends locally; and when the
// partition heals, the queued COMMIT commits nothing. (Before, the takeover
// waited out its context and the old Finish committed after the heal.)
func TestPartitionBeforeCommitFencesFinish(t *testing.T) {
	e := newEnv(t)
	e.exec(effectsTable)
	m := e.machine()
	p, dsn := e.proxied("partitioned")
	ca := e.open(func(c *Config) { c.DSN = dsn })
	sa := e.session(ca)
	wa, err := sa.Work(context.Background(), "install", retrieveAll(m))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	ca.leaseHooks.BeforeCommit = func(id uuid.UUID) {
		if id == sa.ID() {
			once.Do(func() { p.Cut(true) })
		}
	}
	finished := make(chan error, 1)
	start := time.Now()
	go func() {
		finished <- wa.Finish(context.Background(), func(tx *Tx) error {
			_, err := tx.DBTX().ExecContext(context.Background(), "INSERT INTO effects VALUES ($1, $2)", m, sa.ID())
			return err
		})
	}()
	eventually(t, 5*time.Second, "the partitioned session to expire", func() bool { return !e.aliveInDB(sa.ID()) })
	expired := time.Now()

	sb := e.session(e.open())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wb, err := sb.Work(ctx, "install", retrieveAll(m))
	if err != nil {
		t.Fatalf("takeover from the partitioned worker: %v", err)
	}
	waited := time.Since(expired)
	t.Logf("takeover done %v after the partitioned session's deadline", waited)
	if waited > testInterval {
		t.Errorf("takeover waited %v behind the partitioned Finish, want at most the interval", waited)
	}
	select {
	case err := <-finished:
		t.Logf("partitioned Finish: %v after %v", err, time.Since(start))
		if err == nil {
			t.Fatal("the partitioned Finish reported success")
		}
	case <-time.After(3 * testInterval):
		t.Fatal("the partitioned Finish did not return")
	}

	p.Heal()
	ca.Close() // its pool's idle connections, which the partition did not cut
	eventually(t, 5*time.Second, "the partitioned connections to go", func() bool { return e.backends("partitioned") == 0 })
	if n := e.count("SELECT count(*) FROM effects"); n != 0 {
		t.Errorf("the partitioned Finish committed its effect after the heal")
	}
	if err := wb.Finish(context.Background(), noCommit); err != nil {
		t.Errorf("Finish of the new claim: %v", err)
	}
	if got := e.events(m, sa, sb); !slicesEqual(got, "install:Started@1", "install:Abandoned@1", "install:Started@2", "install:Finished@2") {
		t.Errorf("history %v", got)
	}
}

// Every history row that ends a claim names it: Canceled by Close,
// Abandoned by Close after expiry, by GC and by a takeover.
func TestEndingHistoryRowsCarryClaimID(t *testing.T) {
	e := newEnv(t)
	c := e.open()
	ctx := context.Background()
	claim := func(s *Session) (uuid.UUID, *Work) {
		t.Helper()
		m := e.machine()
		w, err := s.Work(ctx, "install", retrieveAll(m))
		if err != nil {
			t.Fatal(err)
		}
		return m, w
	}
	ended := func(w *Work, event string) {
		t.Helper()
		if n := e.count("SELECT count(*) FROM work_history WHERE claim_id = $1 AND event = $2", w.ClaimID(), event); n != 1 {
			t.Errorf("%d %s rows with claim %s, want 1", n, event, w.ClaimID())
		}
	}

	closed := e.session(c)
	_, w := claim(closed)
	if err := closed.Close(ctx); err != nil {
		t.Fatal(err)
	}
	ended(w, "Canceled")

	expired := e.session(c)
	_, w = claim(expired)
	e.expireInDB(expired.ID(), time.Second)
	eventually(t, 3*testInterval, "the session to notice its expiry", func() bool { return expired.Err() != nil })
	if err := expired.Close(ctx); err != nil {
		t.Fatal(err)
	}
	ended(w, "Abandoned")

	collected := e.session(c)
	_, w = claim(collected)
	e.expireInDB(collected.ID(), time.Hour)
	if n, err := c.CollectGarbage(ctx); err != nil || n != 1 {
		t.Fatalf("CollectGarbage = %d, %v", n, err)
	}
	ended(w, "Abandoned")

	superseded := e.session(c)
	m, w := claim(superseded)
	e.expireInDB(superseded.ID(), time.Second)
	taker := e.session(e.open())
	if _, err := taker.Work(ctx, "install", retrieveAll(m)); err != nil {
		t.Fatal(err)
	}
	ended(w, "Abandoned")
	if n := e.count("SELECT count(*) FROM work_history WHERE event IN ('Canceled', 'Abandoned', 'Finished', 'Failed') AND claim_id IS NULL"); n != 0 {
		t.Errorf("%d ending history rows without a claim id", n)
	}
}

// Fencing tokens grow with every claim of a (machine, process), across a
// takeover and a new claim after Finish, and are recorded in history.
func TestFencingTokensGrow(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m := e.machine()
	// Steady sessions (the first is expired in the database below): the
	// tokens are the subject, not timing; 1 s lapsed beside three spinners.
	steady := func(c *Config) { c.SessionInterval = 10 * time.Second }
	first := e.session(e.open(steady))
	w1, err := first.Work(ctx, "install", retrieveAll(m))
	if err != nil {
		t.Fatal(err)
	}
	e.expireInDB(first.ID(), time.Second)
	second := e.session(e.open(steady))
	w2, err := second.Work(ctx, "install", retrieveAll(m))
	if err != nil {
		t.Fatal(err)
	}
	if err := w2.Finish(ctx, noCommit); err != nil {
		t.Fatal(err)
	}
	w3, err := second.Work(ctx, "install", retrieveAll(m))
	if err != nil {
		t.Fatal(err)
	}
	other, err := second.Work(ctx, "provide", retrieveAll(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tokens: %d, taken over: %d, again: %d; other process: %d", w1.FencingToken(), w2.FencingToken(), w3.FencingToken(), other.FencingToken())
	if !(0 < w1.FencingToken() && w1.FencingToken() < w2.FencingToken() && w2.FencingToken() < w3.FencingToken()) {
		t.Errorf("tokens %d, %d, %d do not grow", w1.FencingToken(), w2.FencingToken(), w3.FencingToken())
	}
	for _, w := range []*Work{w1, w2, w3, other} {
		var token sql.NullInt64
		if err := e.db.QueryRow("SELECT fencing_token FROM work_history WHERE claim_id = $1 AND event = 'Started'", w.ClaimID()).Scan(&token); err != nil || token.Int64 != w.FencingToken() {
			t.Errorf("history token of claim %s = %v, %v; want %d", w.ClaimID(), token, err, w.FencingToken())
		}
	}
}

// Close returns, within a few seconds, on a connection whose network
// swallows every packet: closing the pool's prepared statements (which
// database/sql does without a context) is bounded too.
func TestCloseOnABlackHole(t *testing.T) {
	e := newWorkEnv(t)
	p, dsn := e.proxied("black-holed-close")
	c := e.open(func(c *Config) { c.DSN = dsn })
	s := e.session(c)
	m := e.machine()
	w, err := s.Work(context.Background(), "install", retrieveAll(m))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Finish(context.Background(), tagCommit(m)); err != nil {
		t.Fatal(err)
	}
	p.Cut(true) // black hole: nothing comes back
	closed := make(chan error, 1)
	start := time.Now()
	go func() { closed <- c.Close() }()
	select {
	case <-closed:
		t.Logf("Close returned %v after the network went black", time.Since(start))
	case <-time.After(15 * time.Second):
		t.Fatal("Close did not return within 15 s on a black-holed network")
	}
}
