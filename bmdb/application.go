package bmdb

import (
	"io/fs"
	"regexp"
)

// Application is an application's own schema on top of bmdb's: its tag
// tables, views and indexes, as golang-migrate files that Open applies
// after bmdb's own migrations, under the same lock and the same rules.
//
// Its versions are recorded in a table of its own, <Name>_schema_migrations,
// so they are numbered independently of bmdb's (000001, 000002, ...). Open
// refuses a dirty application schema, and one newer than the binary unless
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

// applicationName is what Application.Name must look like, so that it
// makes a valid table name unquoted on both engines.
var applicationName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,39}$`)

// validate names the first invalid field of a.
func (a *Application) validate() error {
	switch {
	case !applicationName.MatchString(a.Name):
		return invalidArgument("Config.Application.Name %q must be a lower-case letter followed by up to 39 lower-case letters, digits or underscores", a.Name)
	case a.Name == bmdbSourceName:
		return invalidArgument("Config.Application.Name %q is bmdb's own", a.Name)
	case a.Migrations == nil:
		return invalidArgument("Config.Application.Migrations is nil")
	}
	return nil
}
