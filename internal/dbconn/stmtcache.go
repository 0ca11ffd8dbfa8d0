package dbconn

import (
	"container/list"
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"github.com/lib/pq"
)

// lib/pq runs a statement with parameters that was not prepared in two
// round trips (parse and describe, then bind and execute; one with its
// binary_parameters option), and the server plans it anew each time. The
// statements of applications (retrievals, commit callbacks, Transact
// bodies) are of that kind, and they are most of a claim cycle's round
// trips. So each connection of a Connection's pool keeps the statements it
// runs again with parameters prepared, the most recently used first, up to
// Config.StatementCacheSize: a repeated statement takes one round trip and
// may reuse its plan, as pgx's statement cache does. A statement is
// prepared the second time the connection runs it, so that one-off
// statements (built with a varying number of parameters, say) run as
// before and churn nothing. Statements without parameters keep lib/pq's
// simple protocol (one round trip already).
//
// A prepared statement can go stale: its result columns changed under it
// (the server refuses to run it: "cached plan must not change result type")
// or it was deallocated (DEALLOCATE or DISCARD ALL, which drop them all).
// The statement (all of them, if deallocated) is then dropped from the
// cache. Outside a transaction the call is run again at once; inside one
// the transaction is aborted, and the error wraps ErrStaleStatement, which
// bmdb's transactions retry like a serialization failure. A statement
// that fails otherwise, for a reason its prepared form may hold (its
// parameter types, fixed when it was prepared, after an ALTER COLUMN
// TYPE, say), is dropped too and prepared anew on its next use; the error
// is returned as it is.

// ErrStaleStatement marks the failure of a cached prepared statement that
// went stale; the next call prepares the statement again, so the
// transaction that got it may be retried.
var ErrStaleStatement = errors.New("bmdb: cached prepared statement went stale (schema changed or statement deallocated)")

// Error codes of a stale prepared statement.
const (
	codeFeatureNotSupported   = "0A000" // with "cached plan must not change result type"
	codeInvalidStatementName  = "26000" // the statement was deallocated
	cachedPlanChangedFragment = "cached plan must not change result type"
)

// stmtCache is a connection's prepared statements by query text, least
// recently used last. Calls on a connection are serialised by database/sql,
// so it needs no lock.
type stmtCache struct {
	limit   int
	byQuery map[string]*list.Element // of *cachedStmt
	recency list.List                // most recently used first
	// retired are statements dropped from the cache and not yet closed:
	// they are closed between uses of the connection (ResetSession), not
	// in the middle of a caller's transaction.
	retired []driver.Stmt
	// seen are the texts of statements run once and not prepared, most
	// recent first, up to limit: run again, they are prepared.
	seen     map[string]*list.Element // of string
	seenList list.List
}

// cachedStmt is one entry of a stmtCache.
type cachedStmt struct {
	query string
	st    driver.Stmt
}

func newStmtCache(limit int) *stmtCache {
	if limit <= 0 {
		return nil
	}
	return &stmtCache{limit: limit, byQuery: map[string]*list.Element{}, seen: map[string]*list.Element{}}
}

// worthPreparing reports whether query should run prepared: it is cached,
// or this connection ran it before. A query seen for the first time is
// remembered (the least recently seen forgotten past limit) and runs
// unprepared.
func (c *stmtCache) worthPreparing(query string) bool {
	if _, ok := c.byQuery[query]; ok {
		return true
	}
	if e, ok := c.seen[query]; ok {
		c.seenList.Remove(e)
		delete(c.seen, query)
		return true
	}
	c.seen[query] = c.seenList.PushFront(query)
	if c.seenList.Len() > c.limit {
		oldest := c.seenList.Back()
		c.seenList.Remove(oldest)
		delete(c.seen, oldest.Value.(string))
	}
	return false
}

// get returns the statement prepared for query, or nil.
func (c *stmtCache) get(query string) driver.Stmt {
	e, ok := c.byQuery[query]
	if !ok {
		return nil
	}
	c.recency.MoveToFront(e)
	return e.Value.(*cachedStmt).st
}

// put adds st for query, retiring the least recently used statement if the
// cache is full.
func (c *stmtCache) put(query string, st driver.Stmt) {
	c.byQuery[query] = c.recency.PushFront(&cachedStmt{query: query, st: st})
	if c.recency.Len() > c.limit {
		c.drop(c.recency.Back().Value.(*cachedStmt).query)
	}
}

// drop removes query's statement and retires it.
func (c *stmtCache) drop(query string) {
	e, ok := c.byQuery[query]
	if !ok {
		return
	}
	delete(c.byQuery, query)
	c.recency.Remove(e)
	c.retired = append(c.retired, e.Value.(*cachedStmt).st)
}

// dropAll removes every statement and retires them.
func (c *stmtCache) dropAll() {
	for query := range c.byQuery {
		c.drop(query)
	}
}

// closeRetired closes the retired statements; it stops at the first error
// (the connection is then unusable, and so is what is left).
func (c *stmtCache) closeRetired() error {
	for len(c.retired) > 0 {
		st := c.retired[0]
		c.retired = c.retired[1:]
		if err := st.Close(); err != nil {
			return err
		}
	}
	return nil
}

// isStale reports whether err says a prepared statement went stale.
func isStale(err error) bool {
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) {
		return false
	}
	switch string(pqErr.Code) {
	case codeInvalidStatementName:
		return true
	case codeFeatureNotSupported:
		// The message may be translated (lc_messages); the routine that
		// raises it is PostgreSQL's plan cache.
		return pqErr.Routine == "RevalidateCachedQuery" || strings.Contains(pqErr.Message, cachedPlanChangedFragment)
	}
	return false
}

// keepsStatement reports whether a statement that failed with err may stay
// prepared: the error says nothing about its prepared form (a constraint
// violated, a serialization failure, a lock or a shutdown).
func keepsStatement(err error) bool {
	switch code := SQLState(err); {
	case code == "":
		return false
	case strings.HasPrefix(code, "23"), strings.HasPrefix(code, "40"),
		strings.HasPrefix(code, "55"), strings.HasPrefix(code, "57"), strings.HasPrefix(code, "08"):
		return true
	}
	return false
}

// cachedStatement returns the prepared statement of query on c, preparing
// it (bounded by ctx) if cache does not hold it.
func (c *conn) cachedStatement(cache *stmtCache, ctx context.Context, query string) (driver.Stmt, error) {
	if st := cache.get(query); st != nil {
		return st, nil
	}
	stop := c.nc.watch(ctx)
	defer stop()
	st, err := c.pq.PrepareContext(never, query)
	if err != nil {
		return nil, c.err(err)
	}
	cache.put(query, st)
	return st, nil
}

// staleError handles the failure of query's statement cached in cache: if
// err says the statement went stale, it drops it (every statement of both
// caches, if it was deallocated) and returns err marked with
// ErrStaleStatement; otherwise it drops it unless keepsStatement, and
// returns err as it is.
func (c *conn) staleError(cache *stmtCache, query string, err error) error {
	switch {
	case err == nil:
		return nil
	case isStale(err):
		if SQLState(err) == codeInvalidStatementName {
			c.own.dropAll()
			if c.cache != nil {
				c.cache.dropAll()
			}
		} else {
			cache.drop(query)
		}
		return fmt.Errorf("%w: %w", ErrStaleStatement, err)
	case !keepsStatement(err):
		cache.drop(query)
	}
	return err
}

// runCached runs query through its prepared statement in cache with run.
// Outside a transaction a stale statement is prepared again and run once
// more.
func runCached[T any](c *conn, cache *stmtCache, ctx context.Context, query string, run func(st driver.Stmt) (T, error)) (T, error) {
	for again := !c.inTx; ; again = false {
		st, err := c.cachedStatement(cache, ctx, query)
		if err != nil {
			var none T
			return none, err
		}
		res, err := run(st)
		if err = c.staleError(cache, query, c.err(err)); err == nil || !again || !errors.Is(err, ErrStaleStatement) {
			return res, err
		}
	}
}

// execCached runs query with args through its prepared statement in
// cache, bounded by ctx.
func (c *conn) execCached(cache *stmtCache, ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return runCached(c, cache, ctx, query, func(st driver.Stmt) (driver.Result, error) {
		stop := c.nc.watch(ctx)
		defer stop()
		return st.(driver.StmtExecContext).ExecContext(never, args)
	})
}

// queryCached is execCached for a query returning rows; ctx bounds the
// reading of the rows too.
func (c *conn) queryCached(cache *stmtCache, ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return runCached(c, cache, ctx, query, func(st driver.Stmt) (driver.Rows, error) {
		stop := c.nc.watch(ctx)
		r, err := st.(driver.StmtQueryContext).QueryContext(never, args)
		if err != nil {
			stop()
			return nil, err
		}
		return &rows{c: c, pq: r, stop: stop}, nil
	})
}

// retireIfStale handles the failure of one of bmdb's own statements,
// which database/sql prepared on the connection once: if the statement
// went stale, the connection is cut (closed, never pooled again) so that
// the transaction's retry runs on another connection, where database/sql
// prepares the statement anew; the error then wraps ErrStaleStatement.
func (c *conn) retireIfStale(err error) error {
	if err == nil || !isStale(err) {
		return err
	}
	c.nc.cut(ErrStaleStatement)
	return fmt.Errorf("%w: %w", ErrStaleStatement, err)
}
