package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/migrations"
)

// The migrate command is package migrations' Migrator on the command line,
// over a pool of its own on --dsn (bmdb's driver wrapper: every call cut
// when --timeout ends). bmdbctl embeds bmdb's migrations, not an
// application's: --migrations DIR gives it an application's files (its
// repository's directory), so that up applies them and force and down
// know their versions; without them it knows of an application only what
// the database records.

func migrateCommand(fs *flag.FlagSet) runFunc {
	steps := fs.Int("steps", 1, "migrate down: how many migrations to revert")
	app := fs.String("app", "", "migrate force, down: the application whose schema to act on (default: bmdb's own)")
	dir := fs.String("migrations", "", "the --app application's migration files (a directory of NNNNNN_title.up.sql/.down.sql): up applies them after bmdb's, version shows their newest, force and down know their versions")
	return func(ctx context.Context, c *common, args []string) error {
		if len(args) == 0 {
			return usagef("migrate needs one of up, down, version, force VERSION, lock, unlock")
		}
		sub, rest := args[0], args[1:]
		var version uint64
		switch sub {
		case "force":
			if len(rest) != 1 {
				return usagef("migrate force takes one VERSION, got %d arguments", len(rest))
			}
			var err error
			if version, err = strconv.ParseUint(rest[0], 10, 32); err != nil {
				return usagef("migrate force: VERSION %q is not a version number (such as 2; 0 means none applied)", rest[0])
			}
		case "up", "down", "version", "lock", "unlock":
			if len(rest) > 0 {
				return usagef("migrate %s takes no arguments, got %q", sub, rest)
			}
		default:
			return usagef("migrate %q: want up, down, version, force VERSION, lock or unlock", sub)
		}
		switch {
		case *dir != "" && *app == "":
			return usagef("--migrations needs --app: the name of the application whose files they are")
		case (sub == "lock" || sub == "unlock") && (*app != "" || *dir != ""):
			return usagef("migrate %s takes no --app or --migrations: the lease is one for every schema", sub)
		case (sub == "up" || sub == "version" || sub == "down") && *app != "" && *dir == "":
			return usagef("migrate %s --app %s needs --migrations DIR, the application's migration files: bmdbctl embeds only bmdb's", sub, *app)
		case sub == "down" && *steps < 1:
			return usagef("--steps is %d, must be positive", *steps)
		}
		cfg, err := migratorConfig(*app, *dir)
		if err != nil {
			return err
		}
		db, err := newPool(c)
		if err != nil {
			return err
		}
		defer db.Close()
		m, err := migrations.New(db, cfg)
		if err != nil {
			return err
		}
		schema := migrations.SchemaBmdb
		if *app != "" {
			schema = *app
		}
		switch sub {
		case "lock":
			return showMigrationLock(ctx, c, m)
		case "unlock":
			return clearMigrationLock(ctx, c, m)
		case "up":
			res, err := m.Up(ctx)
			if perr := printRan(c, res); err == nil {
				err = perr
			}
			if err != nil {
				return err
			}
		case "down":
			res, err := m.Down(ctx, schema, *steps)
			if perr := printRan(c, res); err == nil {
				err = perr
			}
			if err != nil {
				return err
			}
		case "force":
			before, err := m.Force(ctx, schema, uint(version))
			if err != nil {
				return err
			}
			return printForced(c, before, uint(version))
		}
		return printVersions(ctx, c, m)
	}
}

// migratorConfig returns the Migrator's Config, with the files in dir as
// the application app's if dir is set.
func migratorConfig(app, dir string) (*migrations.Config, error) {
	cfg := &migrations.Config{HolderInfo: runtimeInfo()}
	if dir != "" {
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return nil, usagef("--migrations %q is not a directory", dir)
		}
		a, err := migrations.NewApplication(app, os.DirFS(dir), ".")
		if err != nil {
			return nil, usagef("--app %s --migrations %s: %s", app, dir, trimInvalid(err))
		}
		cfg.Application = a
	}
	return cfg, nil
}

// migrateNetworkTimeout bounds connecting when the command's ctx does not
// (it always does: --timeout), and a connection whose peer stops
// answering (TCP keepalives and user timeout).
const migrateNetworkTimeout = 10 * time.Second

// newPool returns a pool on c's database for the Migrator, which connects
// when it first needs to (so that migrate force checks its VERSION
// first): bmdb's driver wrapper, without the session bounds of a
// Connection's pool (the Migrator sets its migration connection's own). A
// malformed DSN is a usage error naming --dsn.
func newPool(c *common) (*sql.DB, error) {
	connector, err := dbconn.NewConnector(c.dsn, migrateNetworkTimeout, dbconn.Settings{}, nil)
	if err != nil {
		return nil, usagef("--dsn (or $BMDB_DSN) is malformed: %s", strings.TrimPrefix(err.Error(), dbconn.ErrMalformedDSN.Error()+": "))
	}
	return sql.OpenDB(connector), nil
}

// printRan says what migrate up or down ran, before the versions: one line
// a migration (nothing with --json, whose output is the versions only).
func printRan(c *common, res *migrations.Result) error {
	if c.json || res == nil {
		return nil
	}
	for _, m := range res.Migrations {
		what := "bmdb's schema"
		if m.Schema != migrations.SchemaBmdb {
			what = "application " + m.Schema
		}
		if _, err := fmt.Fprintf(c.out, "ran %s (%s) in %v\n", m.Name, what, m.Duration.Round(time.Millisecond)); err != nil {
			return err
		}
	}
	for _, step := range res.CockroachSteps {
		if _, err := fmt.Fprintf(c.out, "applied CockroachDB's step %s\n", step); err != nil {
			return err
		}
	}
	return nil
}

// schemaRow is one line of migrate version: bmdb's schema, or an
// application's (Binary nil: bmdbctl does not have its migrations).
type schemaRow struct {
	Schema   string `json:"schema"`
	Database uint   `json:"database_version"`
	Binary   *uint  `json:"binary_version,omitempty"`
	Dirty    bool   `json:"dirty"`
	Table    string `json:"table"`
}

// printVersions prints the version of every schema in the database, and
// fails (exit status 1) if one is dirty, with what to repair.
func printVersions(ctx context.Context, c *common, m *migrations.Migrator) error {
	versions, err := m.Versions(ctx)
	if err != nil {
		return err
	}
	t := &table{header: []string{"SCHEMA", "TABLE", "DATABASE", "BINARY", "DIRTY"}}
	var dirty []error
	for _, v := range versions {
		r := schemaRow{Schema: v.Schema, Database: v.Database, Dirty: v.Dirty, Table: v.Table}
		binary := any("-") // an application bmdbctl has no files of
		if v.Binary != 0 {
			r.Binary, binary = &v.Binary, v.Binary
		}
		t.add(r, v.Schema, v.Table, v.Database, binary, v.Dirty)
		if v.Dirty {
			dirty = append(dirty, v.Err)
		}
	}
	if err := t.print(c.out, c.json); err != nil {
		return err
	}
	return errors.Join(dirty...)
}

// printForced says what migrate force did.
func printForced(c *common, before migrations.SchemaVersion, version uint) error {
	if c.json {
		return writeJSON(c.out, []any{struct {
			Schema      string `json:"schema"`
			Table       string `json:"table"`
			FromVersion uint   `json:"from_version"`
			FromDirty   bool   `json:"from_dirty"`
			Version     uint   `json:"version"`
		}{before.Schema, before.Table, before.Database, before.Dirty, version}})
	}
	state := "clean"
	if before.Dirty {
		state = "dirty"
	}
	what := "bmdb's schema"
	if before.Schema != migrations.SchemaBmdb {
		what = "application " + before.Schema
	}
	_, err := fmt.Fprintf(c.out, "forced %s (table %s) from version %d (%s) to version %d (clean); no migration ran: bmdbctl migrate up, or the next Open, migrates on from there\n",
		what, before.Table, before.Database, state, version)
	return err
}

// showMigrationLock prints the migration lock: who holds it, since when,
// and whether its lease is still live.
func showMigrationLock(ctx context.Context, c *common, m *migrations.Migrator) error {
	lock, err := m.ReadLock(ctx)
	if err != nil {
		return err
	}
	t := &table{header: []string{"HOLDER", "INFO", "ACQUIRED", "DEADLINE", "LIVE"}}
	if lock != nil {
		t.add(struct {
			Holder     uuid.UUID `json:"holder"`
			HolderInfo string    `json:"holder_info"`
			AcquiredAt time.Time `json:"acquired_at"`
			Deadline   time.Time `json:"deadline"`
			Live       bool      `json:"live"`
		}{lock.Holder, lock.HolderInfo, lock.AcquiredAt, lock.Deadline, lock.Live},
			lock.Holder, lock.HolderInfo, lock.AcquiredAt, lock.Deadline, lock.Live)
	}
	return t.print(c.out, c.json)
}

// clearMigrationLock deletes the migration lock (and a golang-migrate
// cockroachdb lock row older binaries left), live or not.
func clearMigrationLock(ctx context.Context, c *common, m *migrations.Migrator) error {
	cleared, err := m.ClearLock(ctx)
	if err != nil {
		return err
	}
	t := &table{header: []string{"CLEARED"}}
	t.add(struct {
		Cleared bool `json:"cleared"`
	}{cleared}, cleared)
	return t.print(c.out, c.json)
}
