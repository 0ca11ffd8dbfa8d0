package crdbmode

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

// Migrations, per CockroachDB version. A script of several statements sent
// in one Exec outside a transaction (what golang-migrate's cockroachdb
// driver does with a whole migration file) is one implicit transaction on
// CockroachDB, and CockroachDB refuses some schema changes that depend on
// an earlier one of the same transaction. Which of them bmdb's files meet:
//
//   - a partial index whose WHERE names a column added earlier in the
//     transaction: "cannot create partial index on column ... which is
//     not public", SQLSTATE 0A000 (cockroach#83593, open since 22.1;
//     migration 000015 does this);
//   - a constraint dropped and added again under the same name in one
//     transaction: "duplicate constraint name", SQLSTATE 42710
//     (cockroach#55184, open; reported on 20.1, not confirmed on 23.2 and
//     later, emulated as the worst case; migration 000014 does this, its
//     down file always, its up file when run again).
//
// So the emulation runs such a script as one PostgreSQL transaction that
// refuses those two patterns, and nothing of it commits, on every version
// without autocommit_before_ddl (23.2), with it off (24.x's default, or a
// role's ALTER ROLE ... SET autocommit_before_ddl = off on 25.x), and one
// statement after the other, each committed on its own, with it on (25.x's
// default, or a session's SET). That the setting, documented for explicit
// transactions, splits an implicit multi-statement one that way is the
// model bmdb's migrations were first written against; it is not confirmed
// by CockroachDB's documentation, and bmdb no longer depends on it: it
// sends each statement of a migration on its own.
//
// SET autocommit_before_ddl is taken where the version has the setting
// (24.1 and later) and refused with CockroachDB's error for a setting it
// does not know (42704) where not; its value is kept in a placeholder, as
// the other CockroachDB settings are (settingNames).
//
// Settings.MigrationFailAfter stops a migration between two statements:
// a script of several statements, or the statements one connection runs
// one by one between its version table's dirty mark and the clean one
// (a migration run statement by statement).

// HasAutocommitBeforeDDL reports whether v has the session setting
// autocommit_before_ddl (cockroach#118440, in 24.1 and later).
func (v Version) HasAutocommitBeforeDDL() bool { return v.AtLeast(24, 1) }

// AutocommitBeforeDDLDefault is v's default of autocommit_before_ddl: on
// from 25.1 (CockroachDB's docs, "on by default in v25.1+"), off before.
func (v Version) AutocommitBeforeDDLDefault() bool { return v.AtLeast(25, 1) }

// ddlState is the migration emulation's state of one connection.
// database/sql serialises a connection's calls.
type ddlState struct {
	autocommit *bool // the session's SET autocommit_before_ddl; nil: the role's default
	migrating  bool  // between a version table's dirty mark and its clean mark
	ran        int   // statements of the migration in progress run so far
}

// autocommitBeforeDDL is c's autocommit_before_ddl: the session's value,
// else the emulated role's (Settings.AutocommitBeforeDDL), else the
// version's default; off where the version has no such setting.
func (c *conn) autocommitBeforeDDL() bool {
	v := c.e.s.Version
	switch {
	case !v.HasAutocommitBeforeDDL():
		return false
	case c.ddl.autocommit != nil:
		return *c.ddl.autocommit
	case c.e.s.AutocommitBeforeDDL != nil:
		return *c.e.s.AutocommitBeforeDDL
	}
	return v.AutocommitBeforeDDLDefault()
}

// setAutocommit matches SET autocommit_before_ddl; its group is the value.
var setAutocommit = regexp.MustCompile(`(?i)^SET\s+(?:SESSION\s+)?autocommit_before_ddl\s*(?:=|\s+TO)\s*'?(on|off|true|false)'?\s*;?$`)

// The placeholder's SET statements.
const (
	setAutocommitOn  = "SET " + placeholderPrefix + "autocommit_before_ddl = 'on'"
	setAutocommitOff = "SET " + placeholderPrefix + "autocommit_before_ddl = 'off'"
)

// setSession handles SET autocommit_before_ddl: done reports that q was
// one.
func (c *conn) setSession(ctx context.Context, q string) (done bool, err error) {
	m := setAutocommit.FindStringSubmatch(q)
	if m == nil {
		return false, nil
	}
	if !c.e.s.Version.HasAutocommitBeforeDDL() {
		return true, &pq.Error{Severity: "ERROR", Code: pqerror.Code(codeUndefinedObject),
			Message: `unrecognized configuration parameter "autocommit_before_ddl"`}
	}
	on := strings.EqualFold(m[1], "on") || strings.EqualFold(m[1], "true")
	if on {
		_, err = c.pq.ExecContext(ctx, setAutocommitOn, nil)
	} else {
		_, err = c.pq.ExecContext(ctx, setAutocommitOff, nil)
	}
	if err != nil {
		return true, err
	}
	c.ddl.autocommit = &on
	return true, nil
}

// versionMark matches a write of a golang-migrate version table's row,
// whose second argument is the dirty flag.
var versionMark = regexp.MustCompile(`(?is)^INSERT\s+INTO\s+"?[a-z0-9_]*schema_migrations"?\s*\(\s*version\s*,\s*dirty\s*\)`)

// noteVersionMark follows, inside a transaction, the version table's marks:
// a migration starts running on c at the dirty mark, and ends at the clean
// one.
func (c *conn) noteVersionMark(q string, args []driver.NamedValue) {
	if len(args) != 2 || !versionMark.MatchString(q) {
		return
	}
	dirty, _ := args[1].Value.(bool)
	c.ddl.migrating, c.ddl.ran = dirty, 0
}

// script runs q, a statement or a script of several outside a transaction,
// if the emulation takes it: a script of several statements, a statement
// of a migration in progress, and CockroachDB's CREATE TYPE IF NOT EXISTS.
// done reports that it did (err is the outcome); otherwise q is to run as
// it is.
func (c *conn) script(ctx context.Context, q string) (done bool, err error) {
	stmts := splitStatements(q)
	switch {
	case len(stmts) > 1:
		return true, c.execScript(ctx, stmts, 0)
	case len(stmts) == 1 && c.ddl.migrating:
		return true, c.execScript(ctx, stmts, c.ddl.ran)
	case len(stmts) == 1 && createTypeIfNotExists.MatchString(stmts[0]):
		return true, c.execScript(ctx, stmts, 0)
	}
	return false, nil
}

// execScript runs stmts, the statements of a migration after done of its
// statements ran: one after the other, each committed on its own, when
// autocommit_before_ddl is on, and as one transaction refusing what
// CockroachDB refuses in one otherwise. It fails between two statements
// when Settings.MigrationFailAfter asks.
func (c *conn) execScript(ctx context.Context, stmts []string, done int) error {
	oneTxn := len(stmts) > 1 && !c.autocommitBeforeDDL()
	var txn *ddlTxn
	if oneTxn {
		if _, err := c.pq.ExecContext(ctx, "BEGIN", nil); err != nil {
			return err
		}
		txn = &ddlTxn{added: map[string]bool{}, dropped: map[string]bool{}}
	}
	fail := func(err error) error {
		if oneTxn {
			_, _ = c.pq.ExecContext(ctx, "ROLLBACK", nil)
		}
		return err
	}
	for i, st := range stmts {
		if n := c.e.failAfter.Load(); int(n) == done+i && n > 0 && c.e.failAfter.CompareAndSwap(n, 0) {
			c.e.count(MigrationFailures)
			what := "which stay applied"
			if oneTxn {
				what = "and nothing of its transaction commits"
			}
			return fail(injected(codeAdminShutdown, fmt.Sprintf(
				"migration stopped after %d of its statements, %s (injected: its node drained, or its connection was cut)", done+i, what)))
		}
		if strings.Contains(st, spreadCheckMark) {
			continue // CockroachDB's own DDL
		}
		st = createTypeIfNotExists.ReplaceAllString(st, "${1}DO $$crdb$$ BEGIN CREATE TYPE ${2}; EXCEPTION WHEN duplicate_object THEN NULL; END $$crdb$$")
		if txn != nil {
			if err := c.checkDDL(ctx, txn, st); err != nil {
				return fail(err)
			}
		}
		if _, err := c.pq.ExecContext(ctx, st, nil); err != nil {
			return fail(err)
		}
		if c.ddl.migrating {
			c.ddl.ran++
		}
	}
	if oneTxn {
		if _, err := c.pq.ExecContext(ctx, "COMMIT", nil); err != nil {
			return err
		}
	}
	return nil
}

// createTypeIfNotExists is CockroachDB's CREATE TYPE IF NOT EXISTS, which
// PostgreSQL lacks: the emulation runs it as PostgreSQL's equivalent.
var createTypeIfNotExists = regexp.MustCompile(`(?is)(^|\n)CREATE\s+TYPE\s+IF\s+NOT\s+EXISTS\s+(.*)$`)

// ddlTxn is what one emulated transaction changed that CockroachDB's later
// statements of it cannot build on: columns it added (table.column) and
// constraints it dropped (table.constraint).
type ddlTxn struct {
	added, dropped map[string]bool
}

// What the DDL rules read of a statement.
var (
	ddlIdent         = `("[^"]+"|[A-Za-z_][A-Za-z0-9_$]*)`
	ddlAlterTable    = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?` + ddlIdent + `\s+(.*)$`)
	ddlDropCons      = regexp.MustCompile(`(?is)^DROP\s+CONSTRAINT\s+(?:IF\s+EXISTS\s+)?` + ddlIdent)
	ddlAddCons       = regexp.MustCompile(`(?is)^ADD\s+CONSTRAINT\s+` + ddlIdent)
	ddlAddColumn     = regexp.MustCompile(`(?is)^ADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?` + ddlIdent)
	ddlCreateIndex   = regexp.MustCompile(`(?is)^CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:CONCURRENTLY\s+)?(IF\s+NOT\s+EXISTS\s+)?(?:` + ddlIdent + `\s+)?ON\s+(?:ONLY\s+)?` + ddlIdent + `(.*)$`)
	ddlWhere         = regexp.MustCompile(`(?is)\)\s*WHERE\s+(.*)$`)
	ddlNotColumns    = map[string]bool{"constraint": true, "primary": true, "foreign": true, "unique": true, "check": true, "exclude": true}
	ddlLeadingRemark = regexp.MustCompile(`^(?:\s*--[^\n]*\n)*\s*`)
)

// checkDDL refuses st, the next statement of txn, if CockroachDB would
// refuse it there; otherwise it notes what st changes that CockroachDB's
// later statements of txn cannot build on. It reads the catalog before st
// runs: an ADD COLUMN IF NOT EXISTS of a column that exists adds nothing.
func (c *conn) checkDDL(ctx context.Context, txn *ddlTxn, st string) error {
	st = ddlLeadingRemark.ReplaceAllString(st, "")
	if m := ddlAlterTable.FindStringSubmatch(st); m != nil {
		table := ddlName(m[1])
		for _, sub := range subcommands(m[2]) {
			switch {
			case ddlDropCons.MatchString(sub):
				name := ddlName(ddlDropCons.FindStringSubmatch(sub)[1])
				n, err := c.queryInt(ctx, "SELECT count(*) FROM pg_constraint WHERE conrelid = to_regclass($1) AND conname = $2", table, name)
				if err != nil {
					return err
				}
				if n > 0 {
					txn.dropped[table+"."+name] = true
				}
			case ddlAddCons.MatchString(sub):
				name := ddlName(ddlAddCons.FindStringSubmatch(sub)[1])
				if txn.dropped[table+"."+name] {
					return &pq.Error{Severity: "ERROR", Code: pqerror.Code(codeDuplicateObject),
						Message: fmt.Sprintf("duplicate constraint name: %q", name),
						Hint:    "emulated (cockroach mode): a constraint dropped and added again under the same name in one transaction, cockroach#55184"}
				}
			case ddlAddColumn.MatchString(sub):
				col := ddlName(ddlAddColumn.FindStringSubmatch(sub)[1])
				if ddlNotColumns[col] {
					continue
				}
				n, err := c.queryInt(ctx, "SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1 AND column_name = $2", table, col)
				if err != nil {
					return err
				}
				if n == 0 {
					txn.added[table+"."+col] = true
				}
			}
		}
		return nil
	}
	m := ddlCreateIndex.FindStringSubmatch(st)
	if m == nil {
		return nil
	}
	ifNotExists, index, table := m[1] != "", ddlName(m[2]), ddlName(m[3])
	where := ddlWhere.FindStringSubmatch(m[4])
	if where == nil {
		return nil
	}
	if ifNotExists && index != "" {
		n, err := c.queryInt(ctx, "SELECT count(*) FROM pg_class WHERE oid = to_regclass($1)", index)
		if err != nil || n > 0 {
			return err // it exists: nothing is created
		}
	}
	for key := range txn.added {
		t, col, _ := strings.Cut(key, ".")
		if t != table || !mentions(where[1], col) {
			continue
		}
		attnum, err := c.queryInt(ctx, "SELECT attnum FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2", table, col)
		if err != nil {
			return err
		}
		return &pq.Error{Severity: "ERROR", Code: pqerror.Code(codeFeatureNotSupported),
			Message: fmt.Sprintf("cannot create partial index on column %q (%d) which is not public", col, attnum),
			Hint:    "emulated (cockroach mode): a partial index on a column added earlier in the same transaction, cockroach#83593"}
	}
	return nil
}

// subcommands splits what follows ALTER TABLE name at its top-level commas.
func subcommands(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, ch := range s {
		switch ch {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(strings.TrimRight(strings.TrimSpace(s[start:]), ";")))
}

// ddlName is an identifier as the catalog stores it.
func ddlName(ident string) string {
	if strings.HasPrefix(ident, `"`) {
		return strings.Trim(ident, `"`)
	}
	return strings.ToLower(ident)
}

// mentions reports whether expr names the column col.
func mentions(expr, col string) bool {
	re := regexp.MustCompile(`(?i)(^|[^A-Za-z0-9_$"])"?` + regexp.QuoteMeta(col) + `"?($|[^A-Za-z0-9_$])`)
	return re.MatchString(expr)
}

// queryInt runs a catalog query of one integer on c, inside its emulated
// transaction.
func (c *conn) queryInt(ctx context.Context, q string, args ...string) (int64, error) {
	nv := make([]driver.NamedValue, len(args))
	for i, a := range args {
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
	}
	rows, err := c.pq.QueryContext(ctx, q, nv)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	dest := make([]driver.Value, 1)
	if err := rows.Next(dest); err != nil {
		if errors.Is(err, io.EOF) {
			return 0, nil
		}
		return 0, err
	}
	n, _ := dest[0].(int64)
	return n, nil
}

// SQLSTATEs of the migration emulation.
const (
	codeUndefinedObject     = "42704" // a setting the version does not have
	codeDuplicateObject     = "42710"
	codeFeatureNotSupported = "0A000"
	codeAdminShutdown       = "57P01"
)
