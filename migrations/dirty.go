package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	gomigrate "github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/lib/pq"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
)

// A version is dirty when its migration did not finish: the file failed
// half-way (on CockroachDB a file is applied one statement at a time), or
// the migrator was killed or cut off from the server in it. What the
// schema matches then depends on the file: a file marked rerunnableMarker
// is run again from the previous version, by Up as by a migrating Open;
// any other is refused with a *SchemaVersionError that lists what the file
// creates and which of it exists, so that an operator can tell which
// version the schema matches and force it (Migrator.Force, bmdbctl
// migrate force). A server finishes a statement whose client went away,
// so "the migration failed" does not mean "nothing of it took effect".

// rerunnableMarker, on a line of its own in an up file, says that every
// statement of the file is safe to run again from any partial state
// (see the package documentation).
const rerunnableMarker = "-- bmdb:rerunnable"

// recoverDirty migrates src up from v, a dirty version, under the lease:
// if v's up file is marked rerunnableMarker it forces the previous version
// and runs the file again, then the rest; otherwise it refuses, saying
// what to repair.
func (t *target) recoverDirty(ctx context.Context, src *source, v recorded) ([]Migration, error) {
	if src.fsys == nil || v.version > src.latest || !src.has(v.version) {
		return nil, dirtyError(ctx, t.db, src, v)
	}
	rerunnable, name, err := readRerunnable(src, v.version)
	if err != nil {
		return nil, err
	}
	if !rerunnable {
		return nil, dirtyError(ctx, t.db, src, v)
	}
	prev := src.previous(v.version)
	klog.Warningf("migrations: %s (table %s) is dirty at version %d (its migration did not finish); %s is safe to run again: forcing version %d and migrating up",
		src.describe(), src.table, v.version, name, prev)
	return t.run(ctx, src, func(m *gomigrate.Migrate) error {
		if err := m.Force(forceVersion(prev)); err != nil {
			return err
		}
		return m.Up()
	})
}

// forceVersion is golang-migrate's version for v: 0 is its "no version".
func forceVersion(v uint) int {
	if v == 0 {
		return -1
	}
	return int(v)
}

// has reports whether src has a file of version.
func (src *source) has(version uint) bool {
	for _, v := range src.versions {
		if v == version {
			return true
		}
	}
	return false
}

// previous returns the version before version in src (0: none).
func (src *source) previous(version uint) uint {
	prev := uint(0)
	for _, v := range src.versions {
		if v >= version {
			break
		}
		prev = v
	}
	return prev
}

// readUp returns version's up file in src, and its name.
func readUp(src *source, version uint) (string, string, error) {
	files, err := iofs.New(src.fsys, ".")
	if err != nil {
		return "", "", fmt.Errorf("migrations: reading the migrations of %s: %w", src.describe(), err)
	}
	defer files.Close()
	r, _, err := files.ReadUp(version)
	if err != nil {
		return "", "", fmt.Errorf("migrations: reading migration %d of %s: %w", version, src.describe(), err)
	}
	defer r.Close()
	body, err := io.ReadAll(r)
	if err != nil {
		return "", "", fmt.Errorf("migrations: reading migration %d of %s: %w", version, src.describe(), err)
	}
	return string(body), src.fileName(version, DirectionUp), nil
}

// readRerunnable reports whether version's up file in src carries
// rerunnableMarker, and names the file.
func readRerunnable(src *source, version uint) (bool, string, error) {
	body, name, err := readUp(src, version)
	if err != nil {
		return false, "", err
	}
	return isRerunnable(body), name, nil
}

// isRerunnable reports whether an up file's text carries rerunnableMarker
// on a line of its own.
func isRerunnable(body string) bool {
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), rerunnableMarker) {
			return true
		}
	}
	return false
}

// dirtyError returns the *SchemaVersionError of src dirty at v: with, if
// src has v's file, what the file creates and which of it exists on db.
// If that cannot be read, the error says so too (errors.As still finds
// the *SchemaVersionError).
func dirtyError(ctx context.Context, db *sql.DB, src *source, v recorded) error {
	verr := &SchemaVersionError{Err: ErrSchemaDirty, Schema: src.name, Table: src.table, Database: v.version, Binary: src.latest, Dirty: true}
	if src.fsys == nil || !src.has(v.version) {
		return verr
	}
	body, name, err := readUp(src, v.version)
	if err != nil {
		return fmt.Errorf("%w (%v)", verr, err)
	}
	verr.File, verr.Previous, verr.Rerunnable = name, src.previous(v.version), isRerunnable(body)
	if verr.Rerunnable {
		return verr
	}
	objects := createdObjects(body)
	for i := range objects {
		if objects[i].Exists, err = objectExists(ctx, db, objects[i]); err != nil {
			return fmt.Errorf("%w (looking for what %s creates: %v)", verr, name, dbconn.ContextError(ctx, err))
		}
	}
	verr.Objects = objects
	if verr.Objects == nil {
		verr.Objects = []SchemaObject{}
	}
	return verr
}

// What a migration file creates, statement by statement (after comments
// are removed and the text is cut at semicolons, which is enough for
// migration files: a semicolon inside a string or a function body only
// produces a fragment that matches nothing, or a wrong guess an operator
// sees listed).
var (
	sqlLineComment  = regexp.MustCompile(`--[^\n]*`)
	sqlBlockComment = regexp.MustCompile(`(?s)/\*.*?\*/`)

	ident      = `((?:"[^"]+"|[A-Za-z_][A-Za-z0-9_$]*)(?:\.(?:"[^"]+"|[A-Za-z_][A-Za-z0-9_$]*))?)`
	ifNotExist = `(?:IF\s+NOT\s+EXISTS\s+)?`
	creates    = []struct {
		kind string
		re   *regexp.Regexp
	}{
		{"table", regexp.MustCompile(`(?is)^CREATE\s+(?:(?:GLOBAL|LOCAL)\s+)?(?:UNLOGGED\s+)?TABLE\s+` + ifNotExist + ident)},
		{"view", regexp.MustCompile(`(?is)^CREATE\s+(?:OR\s+REPLACE\s+)?(?:MATERIALIZED\s+)?VIEW\s+` + ifNotExist + ident)},
		{"index", regexp.MustCompile(`(?is)^CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:CONCURRENTLY\s+)?` + ifNotExist + ident + `\s+ON\s`)},
		{"type", regexp.MustCompile(`(?is)^CREATE\s+TYPE\s+` + ifNotExist + ident)},
		{"sequence", regexp.MustCompile(`(?is)^CREATE\s+SEQUENCE\s+` + ifNotExist + ident)},
	}
	alterTable = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?` + ident + `\s+(.*)$`)
	addColumn  = regexp.MustCompile(`(?is)(?:^|,)\s*ADD\s+(?:COLUMN\s+)?` + ifNotExist + ident)
	// notColumns are what ADD takes besides a column.
	notColumns = map[string]bool{"constraint": true, "primary": true, "foreign": true, "unique": true, "check": true, "exclude": true}
)

// createdObjects lists the tables, views, indexes, types, sequences and
// columns that an up file creates, in the file's order.
func createdObjects(body string) []SchemaObject {
	text := sqlBlockComment.ReplaceAllString(sqlLineComment.ReplaceAllString(body, ""), "")
	var out []SchemaObject
	for _, stmt := range strings.Split(text, ";") {
		stmt = strings.TrimSpace(stmt)
		found := false
		for _, c := range creates {
			if m := c.re.FindStringSubmatch(stmt); m != nil {
				out = append(out, SchemaObject{Kind: c.kind, Name: m[1]})
				found = true
				break
			}
		}
		if found {
			continue
		}
		if m := alterTable.FindStringSubmatch(stmt); m != nil {
			for _, add := range addColumn.FindAllStringSubmatch(m[2], -1) {
				if !notColumns[strings.ToLower(add[1])] {
					out = append(out, SchemaObject{Kind: "column", Name: m[1] + "." + add[1]})
				}
			}
		}
	}
	return out
}

// splitName returns an identifier's parts as the server stores them:
// unquoted parts in lower case, quoted ones as written.
func splitName(name string) []string {
	var parts []string
	for name != "" {
		var part string
		if strings.HasPrefix(name, `"`) {
			end := strings.Index(name[1:], `"`) + 1
			part, name = name[1:end], name[end+1:]
		} else {
			i := strings.Index(name, ".")
			if i < 0 {
				i = len(name)
			}
			part, name = strings.ToLower(name[:i]), name[i:]
		}
		parts = append(parts, part)
		name = strings.TrimPrefix(name, ".")
	}
	return parts
}

// quoted returns parts as one quoted, qualified name.
func quoted(parts []string) string {
	q := make([]string, len(parts))
	for i, p := range parts {
		q[i] = pq.QuoteIdentifier(p)
	}
	return strings.Join(q, ".")
}

// objectExists reports whether o exists in db's current schema (or the
// schema its name gives). The statements run on PostgreSQL and
// CockroachDB alike.
func objectExists(ctx context.Context, db *sql.DB, o SchemaObject) (bool, error) {
	parts := splitName(o.Name)
	var ok bool
	var err error
	switch o.Kind {
	case "type":
		err = db.QueryRowContext(ctx, "SELECT to_regtype($1) IS NOT NULL", quoted(parts)).Scan(&ok)
	case "column":
		if len(parts) < 2 {
			return false, errors.New("column without a table: " + o.Name)
		}
		schema := sql.NullString{}
		if len(parts) == 3 {
			schema = sql.NullString{String: parts[0], Valid: true}
		}
		err = db.QueryRowContext(ctx, `SELECT count(*) > 0 FROM information_schema.columns
WHERE table_schema = COALESCE($1, current_schema()) AND table_name = $2 AND column_name = $3`,
			schema, parts[len(parts)-2], parts[len(parts)-1]).Scan(&ok)
	default:
		err = db.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", quoted(parts)).Scan(&ok)
	}
	return ok, err
}
