package crdbmode_test

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

func TestMain(m *testing.M) {
	os.Exit(testdb.Run(m, func(context.Context, string) error { return nil }))
}

// emulated returns one connection to a new empty database through an
// Emulator with s, closed at cleanup.
func emulated(t *testing.T, s crdbmode.Settings) *sql.Conn {
	t.Helper()
	s.Enabled = true
	connector, err := dbconn.NewConnector(testdb.NewEmpty(t), 10*time.Second, dbconn.Settings{}, crdbmode.New(s, nil).Wrap)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(connector)
	t.Cleanup(func() { db.Close() })
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// The migration patterns CockroachDB refuses in one transaction are
// refused in a script of several statements where the emulated version
// runs it as one (23.2; 24.x; 25.x with the role's autocommit_before_ddl
// off), and nothing of the script commits; they pass one commit per
// statement (25.x, or SET autocommit_before_ddl = on), and sent one
// statement per Exec on every version.
func TestScriptsPerVersion(t *testing.T) {
	t.Parallel()
	on, off := true, false
	const (
		partialIndex = "ALTER TABLE t ADD COLUMN IF NOT EXISTS slot INT8;\n" +
			"CREATE UNIQUE INDEX IF NOT EXISTS t_slot_idx ON t (id, slot) WHERE slot IS NOT NULL;"
		sameConstraint = "ALTER TABLE t DROP CONSTRAINT IF EXISTS t_id_check;\n" +
			"ALTER TABLE t ADD CONSTRAINT t_id_check CHECK (id >= 0);"
	)
	for _, tc := range []struct {
		name   string
		s      crdbmode.Settings
		set    string // run first on the connection
		oneTxn bool   // a script runs as one transaction
	}{
		{"23.2", crdbmode.Settings{Version: crdbmode.Version{Major: 23, Minor: 2}}, "", true},
		{"24.1", crdbmode.Settings{Version: crdbmode.Version{Major: 24, Minor: 1}}, "", true},
		{"24.1, SET autocommit_before_ddl = on", crdbmode.Settings{Version: crdbmode.Version{Major: 24, Minor: 1}}, "SET autocommit_before_ddl = on", false},
		{"25.2", crdbmode.Settings{}, "", false},
		{"25.2, role off", crdbmode.Settings{AutocommitBeforeDDL: &off}, "", true},
		{"25.2, role off, SET on", crdbmode.Settings{AutocommitBeforeDDL: &off}, "SET autocommit_before_ddl = on", false},
		{"24.3, role on", crdbmode.Settings{Version: crdbmode.Version{Major: 24, Minor: 3}, AutocommitBeforeDDL: &on}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			conn := emulated(t, tc.s)
			exec := func(q string) error { _, err := conn.ExecContext(ctx, q); return err }
			count := func(q string) int {
				var n int
				if err := conn.QueryRowContext(ctx, q).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			for _, q := range []string{tc.set, "CREATE TABLE t (id INT8 PRIMARY KEY)", "ALTER TABLE t ADD CONSTRAINT t_id_check CHECK (id > 0)"} {
				if q != "" {
					if err := exec(q); err != nil {
						t.Fatalf("%s: %v", q, err)
					}
				}
			}
			slotColumn := "SELECT count(*) FROM information_schema.columns WHERE table_name = 't' AND column_name = 'slot'"
			strictCheck := "SELECT count(*) FROM pg_constraint WHERE conname = 't_id_check' AND pg_get_constraintdef(oid) LIKE '%> 0%'"

			err := exec(partialIndex)
			switch {
			case tc.oneTxn && (dbconn.SQLState(err) != "0A000" || !strings.Contains(err.Error(), `cannot create partial index on column "slot"`) || !strings.Contains(err.Error(), "which is not public")):
				t.Errorf("partial index on a column added in the same script = %v, want 0A000, not public", err)
			case tc.oneTxn && count(slotColumn) != 0:
				t.Errorf("the refused script's ADD COLUMN committed")
			case !tc.oneTxn && err != nil:
				t.Errorf("partial index on a column added in the same script, one commit per statement: %v", err)
			}
			err = exec(sameConstraint)
			switch {
			case tc.oneTxn && (dbconn.SQLState(err) != "42710" || !strings.Contains(err.Error(), `duplicate constraint name: "t_id_check"`)):
				t.Errorf("a constraint dropped and added again in one script = %v, want 42710", err)
			case tc.oneTxn && count(strictCheck) != 1:
				t.Errorf("the refused script's DROP CONSTRAINT committed")
			case !tc.oneTxn && err != nil:
				t.Errorf("a constraint dropped and added again, one commit per statement: %v", err)
			}

			// One statement per Exec: each its own transaction, on every version.
			for _, script := range []string{partialIndex, sameConstraint} {
				for _, q := range strings.SplitAfter(script, ";\n") {
					if err := exec(q); err != nil {
						t.Errorf("%s, alone: %v", strings.TrimSpace(q), err)
					}
				}
			}
			if count(slotColumn) != 1 || count("SELECT count(*) FROM pg_indexes WHERE indexname = 't_slot_idx'") != 1 || count(strictCheck) != 0 {
				t.Errorf("the statements run one by one did not all take effect")
			}
			// Once the column is there, the script adds nothing the index
			// could not use, on every version.
			if err := exec(partialIndex); err != nil {
				t.Errorf("the partial-index script with its column in place: %v", err)
			}
		})
	}
}

// SET autocommit_before_ddl is refused as an unknown setting before 24.1,
// and kept in a placeholder where the version has it.
func TestSetAutocommitBeforeDDL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		version crdbmode.Version
		ok      bool
	}{
		{crdbmode.Version{Major: 23, Minor: 2}, false},
		{crdbmode.Version{Major: 24, Minor: 1}, true},
		{crdbmode.Version{Major: 25, Minor: 2}, true},
	} {
		conn := emulated(t, crdbmode.Settings{Version: tc.version})
		_, err := conn.ExecContext(ctx, "SET autocommit_before_ddl = on")
		switch {
		case !tc.ok && (dbconn.SQLState(err) != "42704" || !strings.Contains(err.Error(), `unrecognized configuration parameter "autocommit_before_ddl"`)):
			t.Errorf("%v: SET autocommit_before_ddl = %v, want 42704", tc.version, err)
		case tc.ok && err != nil:
			t.Errorf("%v: SET autocommit_before_ddl: %v", tc.version, err)
		case tc.ok:
			var v string
			if err := conn.QueryRowContext(ctx, "SELECT current_setting($1)", "autocommit_before_ddl").Scan(&v); err != nil || v != "on" {
				t.Errorf("%v: current_setting after SET = %q, %v", tc.version, v, err)
			}
		}
	}
}

// autocommit=on|off sets the role's default, where the version has one.
func TestFromEnvAutocommit(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want string // "on", "off", "" (the version's), or "error"
	}{
		{"version=25.2,autocommit=off", "off"},
		{"version=24.1,autocommit=on", "on"},
		{"version=25.1", ""},
		{"version=23.2,autocommit=on", "error"},
		{"autocommit=maybe", "error"},
	} {
		t.Setenv(crdbmode.EnvVar, tc.env)
		s, err := crdbmode.FromEnv()
		got := ""
		switch {
		case err != nil:
			got = "error"
		case s.AutocommitBeforeDDL != nil && *s.AutocommitBeforeDDL:
			got = "on"
		case s.AutocommitBeforeDDL != nil:
			got = "off"
		}
		if got != tc.want {
			t.Errorf("%s=%s: autocommit %q (%v), want %q", crdbmode.EnvVar, tc.env, got, err, tc.want)
		}
	}
}
