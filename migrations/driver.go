package migrations

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/golang-migrate/migrate/v4/database"
	"github.com/lib/pq"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/wait"
)

// golang-migrate decides what runs (the files, their order, the dirty
// mark around each); its database.Driver runs it. bmdb's driver is
// migrationDriver, the same on both engines but for how a file runs, over
// one connection taken from the pool for one run of golang-migrate and
// closed afterwards (its session settings are the migration's own):
//
//   - every statement is bounded by the caller's ctx (golang-migrate's own
//     drivers run theirs under context.Background());
//   - the connection waits for locks as long as ctx allows
//     (lock_timeout and idle_in_transaction_session_timeout 0, whatever
//     the pool's connections have);
//   - PostgreSQL runs a file in one Exec: one implicit transaction, all of
//     the file or none of it;
//   - CockroachDB runs each statement of a file in an Exec of its own,
//     each its own implicit transaction, with autocommit_before_ddl on
//     where the version has it (24.1 and later), an application's file as
//     bmdb's: why, in the package documentation ("How a file runs");
//   - no lock of golang-migrate's: the migration lease (lock.go) is held
//     around every run;
//   - it records what ran, for Up's and Down's Result.
//
// The version table is golang-migrate's: one row (version, dirty),
// written in a transaction of its own before a file runs (dirty) and
// after (clean).

// Statements of the migration connection: constant text.
const (
	// migrationSessionSQL lifts the pool's lock and idle timeouts for
	// the migration's connection: bmdb's pools bound them by the session
	// interval, and a migration waits for locks as long as its ctx allows.
	migrationSessionSQL = "SELECT set_config('lock_timeout', '0', false), set_config('idle_in_transaction_session_timeout', '0', false)"
	// autocommitBeforeDDLSQL asks CockroachDB to commit what precedes a
	// schema change in a transaction before it runs (24.1 and later; on
	// by default from 25.1). Each statement of a file being sent on its
	// own, this only matters for a file that opens a transaction itself.
	autocommitBeforeDDLSQL = "SET autocommit_before_ddl = on"
	// codeUndefinedObject is the error of a setting the server does not
	// have (CockroachDB before 24.1 for autocommit_before_ddl).
	codeUndefinedObject = "42704"
)

// migrationDriver is golang-migrate's database.Driver for one source, over
// one connection. It is used by one goroutine (golang-migrate's).
type migrationDriver struct {
	ctx       context.Context
	conn      *sql.Conn
	src       *source
	cockroach bool

	current int         // the version as last read or written (-1: none)
	target  int         // the version the migration in progress moves to (its dirty mark)
	file    string      // the file in progress, from Run; "" if none ran since the dirty mark
	started time.Time   // when the migration in progress was marked dirty
	done    []Migration // what finished, in order
}

var _ database.Driver = (*migrationDriver)(nil)

// openDriver takes a connection of db for src's migrations within ctx,
// sets its session up for migrating and makes sure src's version table
// exists. Close the driver when done: it closes the connection, which
// goes back to no pool.
func openDriver(ctx context.Context, db *sql.DB, src *source, cockroach bool) (*migrationDriver, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: taking a connection to migrate %s: %w", src.describe(), dbconn.ContextError(ctx, err))
	}
	d := &migrationDriver{ctx: ctx, conn: conn, src: src, cockroach: cockroach, current: database.NilVersion}
	if err := d.setUp(); err != nil {
		d.Close()
		return nil, fmt.Errorf("migrations: preparing to migrate %s: %w", src.describe(), dbconn.ContextError(ctx, err))
	}
	return d, nil
}

// setUp sets d's session up and creates the version table if missing.
func (d *migrationDriver) setUp() error {
	if _, err := d.conn.ExecContext(d.ctx, migrationSessionSQL); err != nil {
		return err
	}
	if d.cockroach {
		_, err := d.conn.ExecContext(d.ctx, autocommitBeforeDDLSQL)
		switch code := dbconn.SQLState(err); {
		case code == codeUndefinedObject:
			klog.V(2).Infof("migrations: this CockroachDB has no autocommit_before_ddl (before 24.1): each statement runs on its own anyway")
		case err != nil:
			return err
		}
	}
	_, err := d.conn.ExecContext(d.ctx, "CREATE TABLE IF NOT EXISTS "+pq.QuoteIdentifier(d.src.table)+" (version INT8 NOT NULL PRIMARY KEY, dirty BOOL NOT NULL)")
	return err
}

// Open implements database.Driver; golang-migrate does not call it for a
// driver it is given.
func (d *migrationDriver) Open(string) (database.Driver, error) {
	return nil, errors.New("migrations: the migration driver is not opened by URL")
}

// Close implements database.Driver: the connection is closed, not pooled
// (its session settings are the migration's).
func (d *migrationDriver) Close() error {
	err := d.conn.Raw(func(any) error { return driver.ErrBadConn })
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) {
		return nil
	}
	return err
}

// Lock implements database.Driver: the migration lease is held instead.
func (d *migrationDriver) Lock() error { return nil }

// Unlock implements database.Driver.
func (d *migrationDriver) Unlock() error { return nil }

// Drop implements database.Driver; bmdb never drops a database.
func (d *migrationDriver) Drop() error {
	return errors.New("migrations: dropping a database is not supported")
}

// Run implements database.Driver: it runs a migration file, as a whole on
// PostgreSQL, one statement after the other on CockroachDB.
func (d *migrationDriver) Run(r io.Reader) error {
	body, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	d.file = d.fileName()
	if !d.cockroach {
		if strings.TrimSpace(string(body)) == "" {
			return nil
		}
		if _, err := d.conn.ExecContext(d.ctx, string(body)); err != nil {
			return fmt.Errorf("%s: %w", d.file, dbconn.ContextError(d.ctx, err))
		}
		return nil
	}
	stmts := splitStatements(string(body))
	for i, st := range stmts {
		if _, err := d.conn.ExecContext(d.ctx, st.text); err != nil {
			return fmt.Errorf("%s: statement %d of %d, line %d (%s): %w", d.file, i+1, len(stmts), st.line, firstLine(st.text), dbconn.ContextError(d.ctx, err))
		}
	}
	return nil
}

// firstLine is a statement's first line, for errors.
func firstLine(text string) string {
	line, _, more := strings.Cut(text, "\n")
	if more || len(line) > 100 {
		line = strings.TrimSpace(line[:min(len(line), 100)]) + " ..."
	}
	return line
}

// fileName names the file of the migration in progress: the up file of
// its target, or the down file of the version it reverts.
func (d *migrationDriver) fileName() string {
	if d.up() {
		return d.src.fileName(uint(d.target), DirectionUp)
	}
	return d.src.fileName(uint(d.current), DirectionDown)
}

// up reports whether the migration in progress goes up.
func (d *migrationDriver) up() bool { return d.target > d.current }

// SetVersion implements database.Driver: it records version in the
// version table, in a transaction retried on serialization failures, and
// notes what finished.
func (d *migrationDriver) SetVersion(version int, dirty bool) error {
	err := d.inTx(func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(d.ctx, "DELETE FROM "+pq.QuoteIdentifier(d.src.table)); err != nil {
			return err
		}
		if version < 0 && !(version == database.NilVersion && dirty) {
			return nil
		}
		_, err := tx.ExecContext(d.ctx, "INSERT INTO "+pq.QuoteIdentifier(d.src.table)+" (version, dirty) VALUES ($1, $2)", version, dirty)
		return err
	})
	if err != nil {
		return fmt.Errorf("recording version %d (dirty %v) in %s: %w", version, dirty, d.src.table, dbconn.ContextError(d.ctx, err))
	}
	if dirty {
		d.target, d.file, d.started = version, "", time.Now()
		return nil
	}
	if d.file != "" && version == d.target {
		m := Migration{Schema: d.src.name, Version: uint(d.target), Name: d.file, Direction: DirectionUp, Duration: time.Since(d.started)}
		if !d.up() {
			m.Version, m.Direction = uint(d.current), DirectionDown
		}
		d.done = append(d.done, m)
	}
	d.current, d.file = version, ""
	return nil
}

// inTx runs fn in a transaction on d's connection, again after a
// serialization failure or a lock wait given up (CockroachDB's readers of
// the version table may push it), until ctx ends.
func (d *migrationDriver) inTx(fn func(*sql.Tx) error) error {
	for attempt := 1; ; attempt++ {
		tx, err := d.conn.BeginTx(d.ctx, nil)
		if err == nil {
			if err = fn(tx); err == nil {
				err = tx.Commit()
			} else {
				_ = tx.Rollback()
			}
		}
		if err == nil || !dbconn.IsRetryable(err) {
			return err
		}
		if werr := wait.Sleep(d.ctx, retryDelay(attempt)); werr != nil {
			return errors.Join(err, werr)
		}
	}
}

// Version implements database.Driver: the version table's row, or
// database.NilVersion if it has none.
func (d *migrationDriver) Version() (int, bool, error) {
	var v int64
	var dirty bool
	err := d.conn.QueryRowContext(d.ctx, "SELECT version, dirty FROM "+pq.QuoteIdentifier(d.src.table)+" LIMIT 1").Scan(&v, &dirty)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		d.current = database.NilVersion
		return database.NilVersion, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("reading the version in %s: %w", d.src.table, dbconn.ContextError(d.ctx, err))
	}
	d.current = int(v)
	return int(v), dirty, nil
}
