package migrations

import (
	"errors"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"
)

// NewApplication builds an Application from a directory of a file system
// (an embed.FS in an application) and refuses, naming the problem, what
// a Migrator would refuse later or what is surely a mistake.
func TestNewApplication(t *testing.T) {
	t.Parallel()
	good := fstest.MapFS{
		"migrations/000001_tags.up.sql":   {Data: []byte("CREATE TABLE t (x INT8);")},
		"migrations/000001_tags.down.sql": {Data: []byte("DROP TABLE t;")},
		"migrations/README.md":            {Data: []byte("not a migration, ignored")},
	}
	app, err := NewApplication("burnin", good, "migrations")
	if err != nil {
		t.Fatalf("NewApplication(good) = %v", err)
	}
	if app.Name != "burnin" {
		t.Errorf("Name = %q", app.Name)
	}
	if up, err := fs.ReadFile(app.Migrations, "000001_tags.up.sql"); err != nil || string(up) != "CREATE TABLE t (x INT8);" {
		t.Errorf("Migrations is not the directory's contents: %q, %v", up, err)
	}
	for _, tc := range []struct {
		name, dir string
		fsys      fs.FS
		want      string
	}{
		{"Bad-Name", "migrations", good, `name "Bad-Name" must be a lower-case letter`},
		{"bmdb", "migrations", good, "is bmdb's own"},
		{"burnin", "migrations", nil, "fsys is nil"},
		{"burnin", "migratons", good, `no directory "migratons"`},
		{"burnin", "../x", good, `directory "../x"`},
		{"burnin", ".", good, "has no NNNNNN_title.up.sql migration"},
		{"burnin", "migrations", fstest.MapFS{"migrations/000001_tags.down.sql": {}}, "has no NNNNNN_title.up.sql"},
		{"burnin", "migrations", fstest.MapFS{"migrations/tags.up.sql": {}}, "tags.up.sql is not named NNNNNN_title.up.sql"},
	} {
		_, err := NewApplication(tc.name, tc.fsys, tc.dir)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewApplication(%q, %q) = %v, want ErrInvalidArgument with %q", tc.name, tc.dir, err, tc.want)
		}
	}
}

// Validate names the field of an Application that is unusable.
func TestApplicationValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		app  *Application
		want string
	}{
		{nil, "Application is nil"},
		{&Application{Name: "", Migrations: fstest.MapFS{}}, `Application.Name ""`},
		{&Application{Name: "Bad-Name", Migrations: fstest.MapFS{}}, `Application.Name "Bad-Name" must be`},
		{&Application{Name: "drop table x", Migrations: fstest.MapFS{}}, `Application.Name "drop table x"`},
		{&Application{Name: strings.Repeat("a", 41), Migrations: fstest.MapFS{}}, "up to 39"},
		{&Application{Name: "bmdb", Migrations: fstest.MapFS{}}, "is bmdb's own"},
		{&Application{Name: "ok", Migrations: nil}, "Application.Migrations is nil"},
	} {
		if err := tc.app.Validate(); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidArgument with %q", tc.app, err, tc.want)
		}
	}
	if err := (&Application{Name: "racks_2", Migrations: fstest.MapFS{}}).Validate(); err != nil {
		t.Errorf("Validate of a good Application = %v", err)
	}
}
