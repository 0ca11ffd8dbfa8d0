package migrations

import (
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strings"
)

// Application is an application's own schema on top of bmdb's: its tag
// tables, views and indexes, as golang-migrate files that a Migrator (and
// bmdb.Open, given it as bmdb.Config.Application) applies after bmdb's own
// migrations, under the same lease and the same rules.
//
// Its versions are recorded in a table of its own, <Name>_schema_migrations,
// so they are numbered independently of bmdb's (000001, 000002, ...). A
// file marked "-- bmdb:rerunnable" that did not finish is run again, as
// bmdb's own are (see the package documentation); otherwise a Migrator
// refuses a dirty application schema, and one newer than its files unless
// every newer migration declared, in bmdb_app_schema_compat, that the
// binary's version still works (the rolling-upgrade rule bmdb's own
// migrations follow in bmdb_schema_compat):
//
//	INSERT INTO bmdb_app_schema_compat (application, version, oldest_compatible)
//	VALUES ('pipeline', 2, 1);
//
// An application's migrations may reference bmdb's tables (a foreign key to
// machines, a view joining work or work_backoff), since bmdb's are applied
// first; generate its sqlc package against both schemas (see the README's
// "Your own pipeline").
type Application struct {
	// Name names the application in its version table and in
	// bmdb_app_schema_compat: a lower-case letter, then up to 39 lower-case
	// letters, digits or underscores. Required.
	Name string
	// Migrations holds the application's migration files at its root,
	// named NNNNNN_title.up.sql and NNNNNN_title.down.sql, usually an
	// embed.FS. Required.
	Migrations fs.FS
}

// NewApplication returns the Application named name whose migrations are
// the files in directory dir of fsys, usually an embed.FS of the
// application's package:
//
//	//go:embed migrations/*.sql
//	var migrationFiles embed.FS
//
//	app, err := migrations.NewApplication("burnin", migrationFiles, "migrations")
//
// It checks what a Migrator would refuse later, with an error wrapping
// ErrInvalidArgument that names the problem: an invalid name, a missing
// directory, a directory without any NNNNNN_title.up.sql file, or a .sql
// file whose name golang-migrate would not parse. dir "." is fsys itself.
func NewApplication(name string, fsys fs.FS, dir string) (*Application, error) {
	switch {
	case !applicationName.MatchString(name):
		return nil, invalidArgument("NewApplication: name %q must be a lower-case letter followed by up to 39 lower-case letters, digits or underscores", name)
	case name == SchemaBmdb:
		return nil, invalidArgument("NewApplication: name %q is bmdb's own", name)
	case fsys == nil:
		return nil, invalidArgument("NewApplication(%q): fsys is nil", name)
	}
	sub, err := fs.Sub(fsys, dir)
	if err != nil {
		return nil, invalidArgument("NewApplication(%q): directory %q: %v", name, dir, err)
	}
	entries, err := fs.ReadDir(sub, ".")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, invalidArgument("NewApplication(%q): no directory %q in its file system (is it embedded? //go:embed %s/*.sql)", name, dir, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("migrations: NewApplication(%q): reading directory %q: %w", name, dir, err)
	}
	ups := 0
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".sql") {
			continue
		}
		if !migrationFile.MatchString(n) {
			return nil, invalidArgument("NewApplication(%q): %s/%s is not named NNNNNN_title.up.sql or NNNNNN_title.down.sql", name, dir, n)
		}
		if strings.HasSuffix(n, ".up.sql") {
			ups++
		}
	}
	if ups == 0 {
		return nil, invalidArgument("NewApplication(%q): directory %q has no NNNNNN_title.up.sql migration", name, dir)
	}
	return &Application{Name: name, Migrations: sub}, nil
}

// migrationFile is the name of a migration file golang-migrate parses.
var migrationFile = regexp.MustCompile(`^[0-9]+_[^/]+\.(up|down)\.sql$`)

// applicationName is what Application.Name must look like, so that it
// makes a valid table name unquoted on both engines.
var applicationName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,39}$`)

// Validate reports, with an error wrapping ErrInvalidArgument that names
// the field, whether a is unusable: an invalid Name, bmdb's own name, or nil
// Migrations. (NewApplication checks the files as well.) bmdb.Open calls it
// for bmdb.Config.Application.
func (a *Application) Validate() error {
	switch {
	case a == nil:
		return invalidArgument("Application is nil")
	case !applicationName.MatchString(a.Name):
		return invalidArgument("Application.Name %q must be a lower-case letter followed by up to 39 lower-case letters, digits or underscores", a.Name)
	case a.Name == SchemaBmdb:
		return invalidArgument("Application.Name %q is bmdb's own", a.Name)
	case a.Migrations == nil:
		return invalidArgument("Application.Migrations is nil")
	}
	return nil
}
