package dbconn

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"net/url"
	"reflect"
	"sync"
	"time"

	"github.com/lib/pq"
)

// The pool's connections are lib/pq's, reached through a dialer and a
// driver wrapper of bmdb's, because lib/pq bounds no network read by a
// context: it does not watch the context during BEGIN or the start-up
// handshake, it has no socket deadlines, and its cancel request travels the
// same path as the call it cancels. On a network that swallows packets a
// call would hang until the operating system gives up, minutes later.
//
// So every call into the driver registers its context with the connection's
// socket, and when that context ends the socket is cut: its deadline is set
// in the past, the blocked read or write returns at once, and the
// connection is marked bad so that database/sql closes it instead of
// pooling it. lib/pq is handed contexts that never end, so it sends no
// cancel requests of its own (they would outlive the call). The server
// notices the closed socket and rolls back what was open; a statement still
// running there is bounded by client_connection_check_interval, lock_timeout
// and idle_in_transaction_session_timeout, which Settings sets.

// Settings are the server-side bounds set on each new connection, and
// what its statement cache keeps. Zero leaves a setting at the server's
// (or role's) default.
type Settings struct {
	// LockTimeout bounds a statement's wait for a row lock.
	LockTimeout time.Duration
	// IdleInTransaction ends a transaction (and its connection) left idle
	// this long, so that a stalled or partitioned client cannot hold locks
	// past its lease.
	IdleInTransaction time.Duration
	// ConnectionCheck is PostgreSQL's client_connection_check_interval:
	// how often a running statement checks that its client is still there.
	ConnectionCheck time.Duration
	// StmtCacheSize is how many statements with parameters each connection
	// keeps prepared (stmtcache.go); 0: none.
	StmtCacheSize int
	// PinCockroach pins, on CockroachDB, the session settings bmdb relies
	// on (pins.go).
	PinCockroach bool
}

// ErrMalformedDSN is wrapped by NewConnector's errors: the DSN does not
// parse. The message does not contain the DSN's password.
var ErrMalformedDSN = errors.New("bmdb: malformed DSN")

// Connector opens a pool's connections. It implements driver.Connector.
// Its methods are safe for concurrent use.
type Connector struct {
	pq       driver.Connector // lib/pq's, or what wraps it
	dialer   *dialer
	timeout  time.Duration // bounds connecting when ctx has no deadline
	settings Settings
	pins     pinState
}

// NewConnector parses dsn for a pool whose connections are bounded as
// described above. If wrap is not nil, lib/pq's connector is wrapped with
// it (a test's stand-in for another server: bmdb.Config.WrapConnector):
// what it returns must be lib/pq's connections, or forward every call to
// them. Errors wrap ErrMalformedDSN.
func NewConnector(dsn string, networkTimeout time.Duration, settings Settings, wrap func(driver.Connector) driver.Connector) (*Connector, error) {
	p, err := pq.NewConnector(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformedDSN, RedactError(stripURLError(err), dsn))
	}
	d := newDialer(networkTimeout)
	p.Dialer(d)
	var inner driver.Connector = p
	if wrap != nil {
		inner = wrap(p)
	}
	return &Connector{pq: inner, dialer: d, timeout: networkTimeout, settings: settings}, nil
}

// Driver implements driver.Connector.
func (c *Connector) Driver() driver.Driver { return c.pq.Driver() }

// dialSlot carries, through lib/pq's Connect, the context bounding the
// connection attempt to the dialer, and the dialed socket back.
type dialSlot struct {
	ctx   context.Context
	conn  *netConn
	watch func() bool // stops cutting conn when ctx ends
}

type dialSlotKey struct{}

// Connect implements driver.Connector: it dials, runs lib/pq's start-up
// handshake and applies the settings, all bounded by ctx (or by the
// connector's timeout when ctx has no deadline, as for database/sql's
// background openers).
func (c *Connector) Connect(ctx context.Context) (driver.Conn, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	slot := &dialSlot{ctx: ctx}
	defer func() {
		if slot.watch != nil {
			slot.watch()
		}
	}()
	raw, err := c.pq.Connect(context.WithValue(ctx, dialSlotKey{}, slot))
	if err != nil {
		return nil, ContextError(ctx, cut(slot.conn, err))
	}
	pc, ok := raw.(PQConn)
	if !ok {
		raw.Close()
		return nil, errors.New("bmdb: the wrapped connector's connections are not lib/pq's")
	}
	cn := &conn{pq: pc, nc: slot.conn, cache: newStmtCache(c.settings.StmtCacheSize), own: newStmtCache(ownStatements)}
	if cn.nc == nil { // not dialed by our dialer: cannot happen
		pc.Close()
		return nil, errors.New("bmdb: connection was not dialed by bmdb's dialer")
	}
	if err := c.apply(ctx, pc); err != nil {
		cn.Close()
		return nil, ContextError(ctx, cut(cn.nc, err))
	}
	return cn, nil
}

// Statements applying Settings: constant text, values as parameters.
const (
	setTimeoutsSQL  = "SELECT set_config('lock_timeout', $1, false), set_config('idle_in_transaction_session_timeout', $2, false)"
	setConnCheckSQL = "SELECT set_config('client_connection_check_interval', $1, false)"
)

// apply sets c's settings on a new connection.
func (c *Connector) apply(ctx context.Context, pc PQConn) error {
	s := c.settings
	if s.LockTimeout > 0 || s.IdleInTransaction > 0 {
		args := []driver.NamedValue{
			{Ordinal: 1, Value: settingValue(s.LockTimeout)},
			{Ordinal: 2, Value: settingValue(s.IdleInTransaction)},
		}
		if _, err := pc.ExecContext(context.Background(), setTimeoutsSQL, args); err != nil {
			return fmt.Errorf("bmdb: setting lock and idle timeouts: %w", err)
		}
	}
	if s.ConnectionCheck > 0 {
		// PostgreSQL 14 and later only; CockroachDB has no such setting.
		args := []driver.NamedValue{{Ordinal: 1, Value: settingValue(s.ConnectionCheck)}}
		if _, err := pc.ExecContext(context.Background(), setConnCheckSQL, args); err != nil && SQLState(err) != codeUndefinedVar {
			return fmt.Errorf("bmdb: setting client_connection_check_interval: %w", err)
		}
	}
	return c.pin(ctx, pc)
}

// settingValue renders d as a time setting both engines parse ("0" leaves
// the bound off).
func settingValue(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	return fmt.Sprintf("%dms", max(d.Milliseconds(), 1))
}

// dialer dials TCP with keepalives and, where the platform has it, a TCP
// user timeout, so that even a call without deadline notices a dead peer.
// It implements pq.Dialer and pq.DialerContext.
type dialer struct {
	net.Dialer
}

func newDialer(timeout time.Duration) *dialer {
	idle := max(timeout/3, time.Second)
	return &dialer{net.Dialer{
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: idle, Interval: idle, Count: 3},
		Control:         userTimeoutControl(timeout),
	}}
}

// Dial implements pq.Dialer.
func (d *dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

// DialTimeout implements pq.Dialer.
func (d *dialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.DialContext(ctx, network, address)
}

// DialContext implements pq.DialerContext. Within Connect, the socket is
// cut when Connect's context ends, which bounds lib/pq's handshake.
func (d *dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := d.Dialer.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	nc := &netConn{Conn: c}
	if slot, ok := ctx.Value(dialSlotKey{}).(*dialSlot); ok {
		if slot.watch != nil { // lib/pq moved on to another host
			slot.watch()
		}
		slot.conn, slot.watch = nc, nc.watch(slot.ctx)
	}
	return nc, nil
}

// netConn is a socket that can be cut: once cut, every read and write fails
// at once, and it stays so.
type netConn struct {
	net.Conn

	mu    sync.Mutex
	cause error // why it was cut; nil while usable
}

// longAgo is a deadline in the past.
var longAgo = time.Unix(1, 0)

// watch cuts c when ctx ends, until the returned function is called.
func (c *netConn) watch(ctx context.Context) (stop func() bool) {
	if ctx.Done() == nil {
		return func() bool { return true }
	}
	return context.AfterFunc(ctx, func() { c.cut(context.Cause(ctx)) })
}

// cut makes every pending and later read and write of c fail.
func (c *netConn) cut(cause error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cause == nil {
		c.cause = cause
		_ = c.Conn.SetDeadline(longAgo)
	}
}

// cutCause returns why c was cut, or nil.
func (c *netConn) cutCause() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cause
}

// SetDeadline, SetReadDeadline and SetWriteDeadline (lib/pq's
// connect_timeout) have no effect once c is cut.
func (c *netConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cause != nil {
		return nil
	}
	return c.Conn.SetDeadline(t)
}

func (c *netConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cause != nil {
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *netConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cause != nil {
		return nil
	}
	return c.Conn.SetWriteDeadline(t)
}

// CutError reports a call whose connection the wrapper cut because the
// call's context ended (Cause: its cause, e.g. context.DeadlineExceeded or
// an error wrapping ErrSessionExpired); Err is what the driver reported.
// The connection is closed, never reused. errors.Is matches both.
type CutError struct {
	Cause error
	Err   error
}

func (e *CutError) Error() string {
	return fmt.Sprintf("bmdb: connection cut (%v): %v", e.Cause, e.Err)
}

// Unwrap returns Cause and Err.
func (e *CutError) Unwrap() []error { return []error{e.Cause, e.Err} }

// abandoned wraps err in an *CutError if nc was cut.
func cut(nc *netConn, err error) error {
	if err == nil || nc == nil {
		return err
	}
	if cause := nc.cutCause(); cause != nil {
		var already *CutError
		if errors.As(err, &already) {
			return err
		}
		return &CutError{Cause: cause, Err: err}
	}
	return err
}

// PQConn is what bmdb uses of lib/pq's connection: the connections of a
// connector that bmdb.Config.WrapConnector returns must implement it.
type PQConn interface {
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

// conn wraps lib/pq's connection: each call is bounded by its context
// through nc.
type conn struct {
	pq    PQConn
	nc    *netConn
	cache *stmtCache // nil: statements with parameters are not kept prepared
	own   *stmtCache // bmdb's own statements (Own), prepared from their first use

	// inTx is set between BeginTx and the end of the transaction (calls on
	// one connection are serialised by database/sql).
	inTx bool
}

var (
	_ driver.Conn               = (*conn)(nil)
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
	_ driver.ExecerContext      = (*conn)(nil)
	_ driver.QueryerContext     = (*conn)(nil)
	_ driver.Pinger             = (*conn)(nil)
	_ driver.SessionResetter    = (*conn)(nil)
	_ driver.Validator          = (*conn)(nil)
	_ driver.NamedValueChecker  = (*conn)(nil)
)

// never is the context lib/pq gets: one that never ends, so that it starts
// no cancel request; bmdb's watch bounds the call instead.
var never = context.Background()

func (c *conn) err(err error) error { return cut(c.nc, err) }

// Prepare implements driver.Conn.
func (c *conn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// PrepareContext implements driver.ConnPrepareContext.
func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	stop := c.nc.watch(ctx)
	defer stop()
	st, err := c.pq.PrepareContext(never, query)
	if err != nil {
		return nil, c.err(err)
	}
	return &stmt{c: c, pq: st, query: query}, nil
}

// Close implements driver.Conn. A connection that is not cut gets a
// second to say goodbye; a cut one closes at once.
func (c *conn) Close() error {
	_ = c.nc.SetDeadline(time.Now().Add(time.Second))
	return c.pq.Close()
}

// Begin implements driver.Conn.
func (c *conn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx implements driver.ConnBeginTx. ctx bounds the whole transaction,
// COMMIT included.
func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	stop := c.nc.watch(ctx)
	t, err := c.pq.BeginTx(never, opts)
	if err != nil {
		stop()
		return nil, c.err(err)
	}
	c.inTx = true
	return &tx{c: c, pq: t, stop: stop}, nil
}

// ExecContext implements driver.ExecerContext.
func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if len(args) > 0 && isOwn(ctx) {
		return c.execCached(c.own, ctx, query, args)
	}
	if c.cache != nil && len(args) > 0 && c.cache.worthPreparing(query) {
		return c.execCached(c.cache, ctx, query, args)
	}
	stop := c.nc.watch(ctx)
	defer stop()
	res, err := c.pq.ExecContext(never, query, args)
	return res, c.err(err)
}

// QueryContext implements driver.QueryerContext. ctx bounds the call and
// the reading of its rows.
func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if len(args) > 0 && isOwn(ctx) {
		return c.queryCached(c.own, ctx, query, args)
	}
	if c.cache != nil && len(args) > 0 && c.cache.worthPreparing(query) {
		return c.queryCached(c.cache, ctx, query, args)
	}
	stop := c.nc.watch(ctx)
	r, err := c.pq.QueryContext(never, query, args)
	if err != nil {
		stop()
		return nil, c.err(err)
	}
	return &rows{c: c, pq: r, stop: stop}, nil
}

// Ping implements driver.Pinger.
func (c *conn) Ping(ctx context.Context) error {
	stop := c.nc.watch(ctx)
	defer stop()
	return c.err(c.pq.Ping(never))
}

// ResetSession implements driver.SessionResetter: a cut connection is bad.
// Statements retired from the cache are closed here, between uses.
func (c *conn) ResetSession(ctx context.Context) error {
	if c.nc.cutCause() != nil {
		return driver.ErrBadConn
	}
	for _, cache := range []*stmtCache{c.own, c.cache} {
		if cache != nil && len(cache.retired) > 0 {
			stop := c.nc.watch(ctx)
			err := cache.closeRetired()
			stop()
			if err != nil {
				return driver.ErrBadConn
			}
		}
	}
	return c.pq.ResetSession(ctx)
}

// IsValid implements driver.Validator: a cut connection is not pooled.
func (c *conn) IsValid() bool { return c.nc.cutCause() == nil && c.pq.IsValid() }

// CheckNamedValue implements driver.NamedValueChecker.
func (c *conn) CheckNamedValue(nv *driver.NamedValue) error { return c.pq.CheckNamedValue(nv) }

// tx is a transaction of conn; the context of BeginTx bounds it until it
// ends.
type tx struct {
	c    *conn
	pq   driver.Tx
	stop func() bool
}

// Commit implements driver.Tx.
func (t *tx) Commit() error {
	defer t.end()
	return t.c.err(t.pq.Commit())
}

// Rollback implements driver.Tx.
func (t *tx) Rollback() error {
	defer t.end()
	return t.c.err(t.pq.Rollback())
}

func (t *tx) end() {
	t.c.inTx = false
	t.stop()
}

// stmt is a prepared statement of conn.
type stmt struct {
	c     *conn
	pq    driver.Stmt
	query string
}

var (
	_ driver.StmtExecContext  = (*stmt)(nil)
	_ driver.StmtQueryContext = (*stmt)(nil)
)

// stmtCloseTimeout bounds closing a statement, which database/sql calls
// without a context (closing a pool's prepared statements, say): a server
// that does not answer in time gets its connection cut.
const stmtCloseTimeout = time.Second

// Close implements driver.Stmt.
func (s *stmt) Close() error {
	ctx, cancel := context.WithTimeoutCause(context.Background(), stmtCloseTimeout, errStmtCloseTimeout)
	defer cancel()
	stop := s.c.nc.watch(ctx)
	defer stop()
	return s.c.err(s.pq.Close())
}

// errStmtCloseTimeout is the cause of a connection cut because closing a
// statement on it took longer than stmtCloseTimeout.
var errStmtCloseTimeout = errors.New("bmdb: closing a prepared statement took too long")

// NumInput implements driver.Stmt.
func (s *stmt) NumInput() int { return s.pq.NumInput() }

// Exec implements driver.Stmt.
func (s *stmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.ExecContext(context.Background(), namedValues(args))
}

// Query implements driver.Stmt.
func (s *stmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.QueryContext(context.Background(), namedValues(args))
}

// ExecContext implements driver.StmtExecContext.
func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	stop := s.c.nc.watch(ctx)
	defer stop()
	res, err := s.pq.(driver.StmtExecContext).ExecContext(never, args)
	return res, s.c.retireIfStale(s.c.err(err))
}

// QueryContext implements driver.StmtQueryContext.
func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	stop := s.c.nc.watch(ctx)
	r, err := s.pq.(driver.StmtQueryContext).QueryContext(never, args)
	if err != nil {
		stop()
		return nil, s.c.retireIfStale(s.c.err(err))
	}
	return &rows{c: s.c, pq: r, stop: stop}, nil
}

func namedValues(args []driver.Value) []driver.NamedValue {
	nv := make([]driver.NamedValue, len(args))
	for i, v := range args {
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return nv
}

// rows are a query's results, read under the query's context until closed.
type rows struct {
	c    *conn
	pq   driver.Rows
	stop func() bool
	once sync.Once
}

var (
	_ driver.RowsNextResultSet              = (*rows)(nil)
	_ driver.RowsColumnTypeScanType         = (*rows)(nil)
	_ driver.RowsColumnTypeDatabaseTypeName = (*rows)(nil)
)

// Columns implements driver.Rows.
func (r *rows) Columns() []string { return r.pq.Columns() }

// Close implements driver.Rows.
func (r *rows) Close() error {
	err := r.c.err(r.pq.Close())
	r.once.Do(func() { r.stop() })
	return err
}

// Next implements driver.Rows.
func (r *rows) Next(dest []driver.Value) error { return r.c.err(r.pq.Next(dest)) }

// HasNextResultSet implements driver.RowsNextResultSet.
func (r *rows) HasNextResultSet() bool {
	m, ok := r.pq.(driver.RowsNextResultSet)
	return ok && m.HasNextResultSet()
}

// NextResultSet implements driver.RowsNextResultSet.
func (r *rows) NextResultSet() error {
	m, ok := r.pq.(driver.RowsNextResultSet)
	if !ok {
		return errors.New("bmdb: no further result set")
	}
	return r.c.err(m.NextResultSet())
}

// ColumnTypeScanType implements driver.RowsColumnTypeScanType.
func (r *rows) ColumnTypeScanType(i int) reflect.Type {
	if m, ok := r.pq.(driver.RowsColumnTypeScanType); ok {
		return m.ColumnTypeScanType(i)
	}
	return reflect.TypeFor[any]()
}

// ColumnTypeDatabaseTypeName implements driver.RowsColumnTypeDatabaseTypeName.
func (r *rows) ColumnTypeDatabaseTypeName(i int) string {
	if m, ok := r.pq.(driver.RowsColumnTypeDatabaseTypeName); ok {
		return m.ColumnTypeDatabaseTypeName(i)
	}
	return ""
}

// stripURLError unwraps a *url.Error, whose message quotes the whole URL,
// password included.
func stripURLError(err error) error {
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		return urlErr.Err
	}
	return err
}

// OpenPool returns a pool over c that has connected once within ctx. Its
// errors do not contain dsn's password.
func OpenPool(ctx context.Context, c driver.Connector, dsn string) (*sql.DB, error) {
	db := sql.OpenDB(c)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("bmdb: connecting to %s: %w", RedactDSN(dsn), RedactError(ContextError(ctx, err), dsn))
	}
	return db, nil
}
