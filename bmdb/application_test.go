package bmdb

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
	"github.com/bmdb-dev/bmdb/migrations"
	"github.com/bmdb-dev/bmdb/model"
)

// pipelineApp is the example application, read from its directory (its
// package imports bmdb, so this package's tests cannot import it).
func pipelineApp() *migrations.Application {
	return &migrations.Application{Name: "pipeline", Migrations: os.DirFS("../cmd/worker-example/pipeline/migrations")}
}

// appFS returns an application's migrations: files maps names (without
// .up.sql) to their up statements.
func appFS(files map[string]string) fstest.MapFS {
	fs := fstest.MapFS{}
	for name, up := range files {
		fs[name+".up.sql"] = &fstest.MapFile{Data: []byte(up)}
		fs[name+".down.sql"] = &fstest.MapFile{Data: []byte("SELECT 1;")}
	}
	return fs
}

// appVersion reads an application's version table.
func appVersion(t *testing.T, e *env, name string) migrations.SchemaVersion {
	t.Helper()
	return schemaVersion(t, e.dsn, name)
}

// An application's migrations run after bmdb's, on a fresh database, and
// record their own version; its tables may reference bmdb's.
func TestApplicationOnFreshDatabase(t *testing.T) {
	t.Parallel()
	e := &env{t: t, dsn: testdb.NewEmpty(t)}
	e.db = openRaw(t, e.dsn)
	e.q = model.New(e.db)
	c := e.open(func(c *Config) { c.Application = pipelineApp() })
	s := e.session(c)
	ctx := context.Background()
	var id [1]string
	err := s.Transact(ctx, func(tx *Tx) error {
		ids, err := tx.CreateMachines(ctx, 1)
		if err != nil {
			return err
		}
		id[0] = ids[0].String()
		_, err = tx.DBTX().ExecContext(ctx, "INSERT INTO machine_provided (machine_id, provider) VALUES ($1, 'dc')", ids[0])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if v := appVersion(t, e, "pipeline"); v.Database != 2 || v.Dirty {
		t.Errorf("pipeline version %+v, want 2 (its latest)", v)
	}
	if n := e.count("SELECT count(*) FROM app_machine_stages WHERE stage = 'provided'"); n != 1 {
		t.Errorf("%d provided machines in app_machine_stages, want 1", n)
	}
	if _, err := e.db.Exec("INSERT INTO machine_provided (machine_id, provider) VALUES (gen_random_uuid(), 'dc')"); sqlState(err) != codeForeignKeyViolation {
		t.Errorf("a tag of an unknown machine: %v, want the foreign key to machines to refuse it", err)
	}
	// Opening again, or with migrations off, changes nothing.
	e.open(func(c *Config) { c.Application = pipelineApp(); c.SkipMigrations = true })
}

// The example's tag tables and rows, as bmdb's migrations before version
// 12 created them (000002 and 000005's machine_status, verbatim).
const todaysExampleSchema = `
CREATE TABLE machine_provided (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    provider TEXT NOT NULL,
    provided_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE machine_agent_started (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    agent_version TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE machine_os_installed (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    os_image TEXT NOT NULL,
    installed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE VIEW machine_status AS
SELECT m.machine_id, m.machine_created_at,
       CASE
           WHEN o.machine_id IS NOT NULL THEN 'os-installed'
           WHEN a.machine_id IS NOT NULL THEN 'agent-started'
           WHEN p.machine_id IS NOT NULL THEN 'provided'
           ELSE 'new'
       END AS stage,
       (SELECT count(*) FROM work w JOIN sessions s ON s.session_id = w.session_id
        WHERE w.machine_id = m.machine_id AND s.deadline > now()) AS live_claims,
       (SELECT count(*) FROM work_backoff b
        WHERE b.machine_id = m.machine_id AND b.until > now()) AS active_backoffs
FROM machines m
LEFT JOIN machine_provided p ON p.machine_id = m.machine_id
LEFT JOIN machine_agent_started a ON a.machine_id = m.machine_id
LEFT JOIN machine_os_installed o ON o.machine_id = m.machine_id;
INSERT INTO machines DEFAULT VALUES;
INSERT INTO machines DEFAULT VALUES;
INSERT INTO machine_provided (machine_id, provider) SELECT machine_id, 'dc-old' FROM machines;
INSERT INTO machine_agent_started (machine_id, agent_version) SELECT machine_id, 'v0' FROM machines LIMIT 1;
`

// A database migrated by bmdb before version 12, whose example tables bmdb
// itself created and filled, opens with the example as an application: the
// tables and their rows stay, the application's version starts at its
// latest, and the stage views replace machine_status.
func TestApplicationOnTodaysDatabase(t *testing.T) {
	t.Parallel()
	e := &env{t: t, dsn: testdb.NewEmpty(t)}
	e.db = openRaw(t, e.dsn)
	e.q = model.New(e.db)
	migrateBmdbTo(t, e.dsn, 11)
	e.exec(todaysExampleSchema)

	e.open(func(c *Config) { c.Application = pipelineApp() })
	if n := e.count("SELECT count(*) FROM machine_provided WHERE provider = 'dc-old'"); n != 2 {
		t.Errorf("%d of the 2 provided rows kept", n)
	}
	if n := e.count("SELECT count(*) FROM app_machine_stages WHERE stage = 'agent-started'"); n != 1 {
		t.Errorf("%d machines at agent-started, want 1", n)
	}
	if n := e.count("SELECT count(*) FROM information_schema.tables WHERE table_name = 'machine_status'"); n != 0 {
		t.Errorf("machine_status is still there")
	}
	if n := e.count("SELECT count(*) FROM machine_overview"); n != 2 {
		t.Errorf("machine_overview has %d machines, want 2", n)
	}
	if v := appVersion(t, e, "pipeline"); v.Database != 2 {
		t.Errorf("pipeline version %+v, want 2 (its latest)", v)
	}
}

// An application's migrations follow the rolling-upgrade rule of bmdb's:
// a binary opens a newer application schema only if every newer migration
// declared it compatible in bmdb_app_schema_compat, and refuses a dirty
// one.
func TestApplicationRollingUpgrade(t *testing.T) {
	e := newEnv(t)
	v1 := map[string]string{"000001_racks": "CREATE TABLE racked (machine_id UUID PRIMARY KEY REFERENCES machines);"}
	v2 := map[string]string{
		"000001_racks": v1["000001_racks"],
		"000002_rack_name": `ALTER TABLE racked ADD COLUMN rack TEXT;
INSERT INTO bmdb_app_schema_compat (application, version, oldest_compatible) VALUES ('racks', 2, 1);`,
	}
	v3 := map[string]string{
		"000001_racks":     v1["000001_racks"],
		"000002_rack_name": v2["000002_rack_name"],
		"000003_drop_racked": `ALTER TABLE racked RENAME TO racked_old;
INSERT INTO bmdb_app_schema_compat (application, version, oldest_compatible) VALUES ('racks', 3, 3);`,
	}
	app := func(files map[string]string) func(*Config) {
		return func(c *Config) { c.Application = &migrations.Application{Name: "racks", Migrations: appFS(files)} }
	}
	open := func(files map[string]string, skip bool) error {
		cfg := e.config()
		app(files)(&cfg)
		cfg.SkipMigrations = skip
		c, err := Open(context.Background(), cfg)
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := open(v2, false); err != nil {
		t.Fatalf("v2 on a fresh database: %v", err)
	}
	if v := appVersion(t, e, "racks"); v.Database != 2 {
		t.Fatalf("racks at %+v, want 2", v)
	}
	for _, skip := range []bool{false, true} {
		if err := open(v1, skip); err != nil {
			t.Errorf("v1 binary on a v2 schema that declares it compatible (SkipMigrations %v): %v", skip, err)
		}
	}
	if err := open(v3, false); err != nil {
		t.Fatalf("v3: %v", err)
	}
	for _, files := range []map[string]string{v1, v2} {
		err := open(files, true)
		var verr *migrations.SchemaVersionError
		if !errors.Is(err, migrations.ErrSchemaTooNew) || !errors.As(err, &verr) || verr.Schema != "racks" || !strings.Contains(err.Error(), "application racks") {
			t.Errorf("old binary on a v3 schema = %v, want ErrSchemaTooNew naming the application", err)
		}
	}
	e.exec("UPDATE racks_schema_migrations SET dirty = true")
	if err := open(v3, false); !errors.Is(err, migrations.ErrSchemaDirty) || !strings.Contains(err.Error(), "racks_schema_migrations") {
		t.Errorf("a dirty application schema = %v, want ErrSchemaDirty naming racks_schema_migrations", err)
	}
}

// An application's file marked bmdb:rerunnable that did not finish is run
// again by Open, as bmdb's own are; with migrations off, Open refuses it
// and says that a migrating Open runs it again.
func TestOpenRecoversRerunnableApplicationFile(t *testing.T) {
	e := newEnv(t)
	files := map[string]string{
		"000001_racks": "CREATE TABLE racks (id INT8 PRIMARY KEY);",
		"000002_slots": "-- bmdb:rerunnable\nCREATE TABLE IF NOT EXISTS rack_slots (rack INT8 NOT NULL, slot INT8 NOT NULL);\n" +
			"INSERT INTO racks (id) VALUES (1) ON CONFLICT DO NOTHING;",
	}
	app := func(c *Config) { c.Application = &migrations.Application{Name: "racks", Migrations: appFS(files)} }
	e.open(app)
	// 000002 stopped after its first statement.
	e.exec("DELETE FROM racks; UPDATE racks_schema_migrations SET dirty = true")
	cfg := e.config()
	app(&cfg)
	cfg.SkipMigrations = true
	if _, err := Open(context.Background(), cfg); !errors.Is(err, migrations.ErrSchemaDirty) || !strings.Contains(err.Error(), "runs it again") {
		t.Errorf("Open without migrations of a dirty, re-runnable application file = %v", err)
	}
	e.open(app)
	if v := appVersion(t, e, "racks"); v.Database != 2 || v.Dirty || e.count("SELECT count(*) FROM racks") != 1 {
		t.Errorf("after Open: %+v, %d racks; want 2, clean, the file run again", v, e.count("SELECT count(*) FROM racks"))
	}
}

// A bad Application is refused before anything is touched.
func TestApplicationRejectsBadConfig(t *testing.T) {
	t.Parallel()
	for _, app := range []*migrations.Application{
		{Name: "", Migrations: fstest.MapFS{}},
		{Name: "Bad-Name", Migrations: fstest.MapFS{}},
		{Name: "drop table x", Migrations: fstest.MapFS{}},
		{Name: "bmdb", Migrations: fstest.MapFS{}},
		{Name: "ok", Migrations: nil},
	} {
		_, err := Open(context.Background(), Config{DSN: "postgres://nowhere/db", ComponentName: "x", Application: app})
		if !errors.Is(err, ErrInvalidArgument) || !errors.Is(err, migrations.ErrInvalidArgument) || !strings.Contains(err.Error(), "Config.Application") {
			t.Errorf("Application %+v: %v, want ErrInvalidArgument naming Config.Application", app, err)
		}
	}
}

// The query surface of callbacks is read-only, by construction: package
// model is generated from queries/ only, every statement there is a
// SELECT, and bmdb's own statements are generated into internal/store,
// which code outside this module cannot import. So tx.Queries() and
// model.New(tx.DBTX()) offer no way to end another session's claim or
// delete a session: that does not compile. This test keeps the property:
// it fails if a write statement is added to queries/, or if model grows a
// method that queries/ does not define.
func TestCallbackQueriesAreReadOnly(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../queries/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no queries: %v", err)
	}
	write := regexp.MustCompile(`(?i)\b(INSERT|UPDATE|DELETE|UPSERT|TRUNCATE|ALTER|CREATE|DROP|FOR\s+(UPDATE|SHARE|KEY\s+SHARE|NO\s+KEY\s+UPDATE))\b`)
	defined := map[string]bool{}
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, stmt := range strings.Split(string(text), "-- name: ")[1:] {
			n := strings.Fields(stmt)[0]
			defined[n] = true
			var code []string
			for _, line := range strings.Split(stmt, "\n")[1:] {
				if !strings.HasPrefix(strings.TrimSpace(line), "--") {
					code = append(code, line)
				}
			}
			if w := write.FindString(strings.Join(code, "\n")); w != "" {
				t.Errorf("%s: %s is not read-only (%s)", filepath.Base(f), n, w)
			}
		}
	}
	methods := reflect.TypeFor[*model.Queries]()
	for i := range methods.NumMethod() {
		m := methods.Method(i).Name
		if m == "WithTx" {
			continue
		}
		if !defined[m] {
			t.Errorf("model.Queries.%s is not a read-only query of queries/", m)
		}
	}
	for _, forbidden := range []string{"WorkClaimMany", "WorkFinishMany", "WorkEndMany", "WorkEndSession", "SessionDelete", "SessionHeartbeat", "WorkBackoffUpsert", "WorkAbandonOfSessions"} {
		if _, ok := methods.MethodByName(forbidden); ok {
			t.Errorf("callbacks can reach bmdb's %s", forbidden)
		}
	}
}
