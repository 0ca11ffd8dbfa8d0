package main

import (
	"context"
	"database/sql/driver"
	"errors"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lib/pq"
)

// What a process's database connections do, counted on the client: round
// trips and statements. A round trip is one request the client sends and
// then waits for the server to answer.
//
//   - lib/pq (bmdb, the floors): a driver.Connector wrapper under
//     database/sql (bmdb.Config.WrapConnector for bmdb) counts every call
//     into lib/pq with the round trips lib/pq's protocol takes for it:
//     BEGIN, COMMIT, ROLLBACK, Prepare, a prepared statement's Exec or
//     Query, a statement's Close, Ping, and a statement without parameters
//     (simple protocol) one each; a statement with parameters that is not
//     prepared two (parse and describe, then bind and execute), one with
//     lib/pq's binary_parameters. Rows come with their statement's answer.
//     TestRoundTripModel checks this against the bytes on the socket, and
//     the floors, whose dialer is the bench's, count both in every run.
//   - pgx (River): the socket itself (DialFunc), where a round trip starts
//     with each write that follows a read (pgx pipelines a batch in one),
//     after the connection's start-up; statements through a pgx tracer.
//
// Connection start-ups are not counted as round trips.

// rtCounter counts one process's round trips and statements. Safe for
// concurrent use.
type rtCounter struct {
	binary     bool         // lib/pq's binary_parameters: a statement with parameters takes one round trip
	roundTrips atomic.Int64 // by lib/pq's protocol (lib/pq), or on the socket (pgx)
	socket     atomic.Int64 // on the socket, where the bench dialed it (floors, pgx)

	mu         sync.Mutex
	statements map[string]int64 // guarded by mu: statements run, by label (statementLabel)
}

func newRTCounter(dsn string) *rtCounter {
	return &rtCounter{binary: strings.Contains(dsn, "binary_parameters=yes"), statements: map[string]int64{}}
}

// rtSnapshot is what an rtCounter has counted.
type rtSnapshot struct {
	RoundTrips int64            `json:"round_trips"`
	Socket     int64            `json:"socket_round_trips"`
	Statements map[string]int64 `json:"statements,omitempty"`
}

func (c *rtCounter) snapshot() rtSnapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return rtSnapshot{RoundTrips: c.roundTrips.Load(), Socket: c.socket.Load(), Statements: maps.Clone(c.statements)}
}

// since returns what was counted between before and s.
func (s rtSnapshot) since(before rtSnapshot) rtSnapshot {
	out := rtSnapshot{RoundTrips: s.RoundTrips - before.RoundTrips, Socket: s.Socket - before.Socket, Statements: map[string]int64{}}
	for k, v := range s.Statements {
		if d := v - before.Statements[k]; d != 0 {
			out.Statements[k] = d
		}
	}
	return out
}

// statement counts one statement of query, and rt round trips.
func (c *rtCounter) statement(query string, rt int64) {
	c.roundTrips.Add(rt)
	label := statementLabel(query)
	c.mu.Lock()
	c.statements[label]++
	c.mu.Unlock()
}

// benchLabels names the bench's own statements in the statement counts.
var benchLabels = map[string]string{
	retrieveSQL:           "retrieval (application)",
	retrieveLeanSQL:       "retrieval (application)",
	commitSQL:             "delete pending tag (application)",
	commitManySQL:         "delete pending tags (application)",
	floorStepSQL:          "floor end+claim",
	riverPendingDeleteSQL: "delete pending row (application)",
	pgStatFlushSQL:        "pg_stat_force_next_flush",
}

// statementLabel names a statement in the statement counts and the
// sampler's tallies: its sqlc name (bmdb's and River's queries start with
// "-- name: X"), the bench's label for its own, BEGIN, COMMIT and the
// like, or its first words.
func statementLabel(query string) string {
	if l, ok := benchLabels[query]; ok {
		return l
	}
	if m := sqlcName.FindStringSubmatch(query); m != nil {
		return m[1]
	}
	q := strings.TrimSpace(spaces.ReplaceAllString(query, " "))
	if w, _, _ := strings.Cut(q, " "); slices.Contains([]string{"BEGIN", "COMMIT", "ROLLBACK", "START", "SAVEPOINT", "RELEASE"}, strings.ToUpper(w)) {
		return strings.ToUpper(w)
	}
	if q == "" {
		return "(empty)"
	}
	if len(q) > 48 {
		q = q[:48] + "…"
	}
	return q
}

// pgStatFlushSQL makes this backend flush its pending statistics as soon
// as the statement is done (PostgreSQL 15): idle backends otherwise flush
// theirs up to 10 s late, into another run's window of pg_stat_database.
// It reads a relation (pg_class) because a backend with no relation's
// statistics pending keeps its transaction counts to itself, forced or
// not, until it has some (or exits).
const pgStatFlushSQL = `SELECT pg_stat_force_next_flush() FROM pg_class LIMIT 1`

// Labels of the calls that are not statements.
const (
	labelBegin    = "BEGIN"
	labelCommit   = "COMMIT"
	labelRollback = "ROLLBACK"
	labelPing     = "(ping)"
)

// wrap returns inner counting through c: the connector of a lib/pq pool
// (bmdb.Config.WrapConnector's signature).
func (c *rtCounter) wrap(inner driver.Connector) driver.Connector {
	return &countingConnector{inner: inner, c: c}
}

// pqConn is what the bench and bmdb use of lib/pq's connection.
type pqConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
	driver.NamedValueChecker
}

type countingConnector struct {
	inner driver.Connector
	c     *rtCounter
}

// socketSlotKey carries, through lib/pq's Connect, a slot for the socket
// the bench's dialer (socketDialer) dials.
type socketSlotKey struct{}

// Connect implements driver.Connector.
func (k *countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	var sock *countingNetConn
	raw, err := k.inner.Connect(context.WithValue(ctx, socketSlotKey{}, &sock))
	if err != nil {
		return nil, err
	}
	pc, ok := raw.(pqConn)
	if !ok {
		raw.Close()
		return nil, errors.New("bench: the wrapped connector's connections are not lib/pq's")
	}
	if sock != nil {
		sock.started()
	}
	return &countingConn{pq: pc, c: k.c}, nil
}

// Driver implements driver.Connector.
func (k *countingConnector) Driver() driver.Driver { return k.inner.Driver() }

// countingConn is a lib/pq connection whose calls are counted. Calls on one
// connection are serialised by database/sql.
type countingConn struct {
	pq pqConn
	c  *rtCounter
}

var _ pqConn = (*countingConn)(nil)

// unprepared is the round trips of a statement that is not prepared.
func (cc *countingConn) unprepared(args []driver.NamedValue) int64 {
	if len(args) == 0 || cc.c.binary {
		return 1
	}
	return 2
}

func (cc *countingConn) Prepare(query string) (driver.Stmt, error) {
	return cc.PrepareContext(context.Background(), query)
}

func (cc *countingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	cc.c.statement("(prepare) "+statementLabel(query), 1)
	st, err := cc.pq.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &countingStmt{pq: st, c: cc.c, query: query}, nil
}

func (cc *countingConn) Close() error { return cc.pq.Close() } // Terminate: no answer

func (cc *countingConn) Begin() (driver.Tx, error) {
	return cc.BeginTx(context.Background(), driver.TxOptions{})
}

func (cc *countingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	cc.c.statement(labelBegin, 1)
	t, err := cc.pq.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &countingTx{pq: t, c: cc.c}, nil
}

func (cc *countingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	cc.c.statement(query, cc.unprepared(args))
	return cc.pq.ExecContext(ctx, query, args)
}

func (cc *countingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	cc.c.statement(query, cc.unprepared(args))
	return cc.pq.QueryContext(ctx, query, args)
}

func (cc *countingConn) Ping(ctx context.Context) error {
	cc.c.statement(labelPing, 1)
	return cc.pq.Ping(ctx)
}

func (cc *countingConn) ResetSession(ctx context.Context) error { return cc.pq.ResetSession(ctx) }

func (cc *countingConn) IsValid() bool { return cc.pq.IsValid() }

func (cc *countingConn) CheckNamedValue(nv *driver.NamedValue) error {
	return cc.pq.CheckNamedValue(nv)
}

// countingTx counts COMMIT and ROLLBACK.
type countingTx struct {
	pq driver.Tx
	c  *rtCounter
}

func (t *countingTx) Commit() error {
	t.c.statement(labelCommit, 1)
	return t.pq.Commit()
}

func (t *countingTx) Rollback() error {
	t.c.statement(labelRollback, 1)
	return t.pq.Rollback()
}

// countingStmt is a prepared statement whose runs are counted.
type countingStmt struct {
	pq    driver.Stmt
	c     *rtCounter
	query string
}

var (
	_ driver.StmtExecContext  = (*countingStmt)(nil)
	_ driver.StmtQueryContext = (*countingStmt)(nil)
)

func (s *countingStmt) Close() error {
	s.c.statement("(close) "+statementLabel(s.query), 1)
	return s.pq.Close()
}

func (s *countingStmt) NumInput() int { return s.pq.NumInput() }

func (s *countingStmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.ExecContext(context.Background(), named(args))
}

func (s *countingStmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.QueryContext(context.Background(), named(args))
}

func named(args []driver.Value) []driver.NamedValue {
	nv := make([]driver.NamedValue, len(args))
	for i, v := range args {
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return nv
}

func (s *countingStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.c.statement(s.query, 1)
	return s.pq.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (s *countingStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.c.statement(s.query, 1)
	return s.pq.(driver.StmtQueryContext).QueryContext(ctx, args)
}

// socketDialer dials TCP (or a Unix socket) for lib/pq and counts the round
// trips of each connection on its socket (countingNetConn). It implements
// pq.Dialer and pq.DialerContext.
type socketDialer struct {
	c *rtCounter
	d net.Dialer
}

var _ pq.DialerContext = (*socketDialer)(nil)

func (d *socketDialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

func (d *socketDialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.DialContext(ctx, network, address)
}

func (d *socketDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	nc, err := d.d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	cn := &countingNetConn{Conn: nc, c: d.c}
	if slot, ok := ctx.Value(socketSlotKey{}).(**countingNetConn); ok {
		*slot = cn
	}
	return cn, nil
}

// pgxDial is a pgconn.DialFunc that counts each connection's round trips
// on its socket, into both of c's counts (pgx's are only counted there);
// pgxStarted marks the end of its start-up.
func (c *rtCounter) pgxDial(ctx context.Context, network, address string) (net.Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return &countingNetConn{Conn: nc, c: c, both: true}, nil
}

// pgxStarted is a pgxpool.Config.AfterConnect: from now on the
// connection's round trips count.
func pgxStarted(_ context.Context, conn *pgx.Conn) error {
	if cn, ok := conn.PgConn().Conn().(*countingNetConn); ok {
		cn.started()
	}
	return nil
}

// countingNetConn counts round trips on a socket: a write that follows a
// read (or the first write) starts one. Reads and writes may come from
// different goroutines (pgx reads in the background while it writes a
// large batch).
type countingNetConn struct {
	net.Conn
	c    *rtCounter
	both bool // count into c.roundTrips too (pgx)

	mu       sync.Mutex
	answered bool // guarded by mu: the server wrote since the client's last write
	wrote    bool // guarded by mu: the client has written
	counting bool // guarded by mu: the start-up is over
}

// started marks the end of the connection's start-up.
func (cn *countingNetConn) started() {
	cn.mu.Lock()
	cn.counting = true
	cn.mu.Unlock()
}

func (cn *countingNetConn) Write(p []byte) (int, error) {
	n, err := cn.Conn.Write(p)
	if n > 0 && !isTerminate(p) {
		cn.mu.Lock()
		if (cn.answered || !cn.wrote) && cn.counting {
			cn.c.socket.Add(1)
			if cn.both {
				cn.c.roundTrips.Add(1)
			}
		}
		cn.answered, cn.wrote = false, true
		cn.mu.Unlock()
	}
	return n, err
}

// isTerminate reports whether p is the protocol's Terminate message, which
// closes a connection: the server does not answer it.
func isTerminate(p []byte) bool {
	return len(p) == 5 && p[0] == 'X' && p[1] == 0 && p[2] == 0 && p[3] == 0 && p[4] == 4
}

func (cn *countingNetConn) Read(p []byte) (int, error) {
	n, err := cn.Conn.Read(p)
	if n > 0 {
		cn.mu.Lock()
		cn.answered = true
		cn.mu.Unlock()
	}
	return n, err
}

// pgxTally counts pgx's statements (a pgx.QueryTracer and BatchTracer).
type pgxTally struct{ c *rtCounter }

var (
	_ pgx.QueryTracer = pgxTally{}
	_ pgx.BatchTracer = pgxTally{}
)

func (t pgxTally) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	t.c.statement(d.SQL, 0)
	return ctx
}

func (pgxTally) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (t pgxTally) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	t.c.statement("(batch)", 0)
	return ctx
}

func (t pgxTally) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	t.c.statement(d.SQL, 0)
}

func (pgxTally) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
