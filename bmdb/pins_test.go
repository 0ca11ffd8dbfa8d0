package bmdb

import (
	"context"
	"testing"

	"github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// setting reads a session setting inside one of s's transactions, "" if
// the server does not have it.
func setting(t *testing.T, s *Session, name string) string {
	t.Helper()
	var value string
	err := s.Transact(context.Background(), func(tx *Tx) error {
		return tx.DBTX().QueryRowContext(context.Background(), "SELECT COALESCE(current_setting($1, true), '')", name).Scan(&value)
	})
	if err != nil {
		t.Fatal(err)
	}
	return value
}

// An operator's default of enable_shared_locking_for_serializable = on
// (for a role, a database or the cluster) would make every session check a
// shared lock that the session's own heartbeat waits for; bmdb pins it off
// on every connection to CockroachDB. In cockroach mode the setting is
// emulated by the placeholder crdb.enable_shared_locking_for_serializable,
// which PostgreSQL keeps per database. On plain PostgreSQL nothing is
// pinned. (Before, nothing was pinned anywhere.)
func TestCockroachPinsSharedLockingOff(t *testing.T) {
	e := newEnv(t)
	name := "crdb.enable_shared_locking_for_serializable"
	if testdb.Cockroach() {
		name = "enable_shared_locking_for_serializable"
	} else {
		var db string
		if err := e.db.QueryRow("SELECT current_database()").Scan(&db); err != nil {
			t.Fatal(err)
		}
		// The operator's default, for every new connection to the database.
		e.exec("ALTER DATABASE " + pq.QuoteIdentifier(db) + " SET " + name + " = 'on'")
	}
	crdb := e.session(e.open(cockroachMode))
	if got := setting(t, crdb, name); got != "off" {
		t.Errorf("%s = %q on a cockroach-mode connection, want off", name, got)
	}
	for _, pinned := range []string{"enable_durable_locking_for_serializable", "optimizer_use_lock_op_for_serializable"} {
		if !testdb.Cockroach() {
			pinned = "crdb." + pinned
		}
		if got := setting(t, crdb, pinned); got != "off" {
			t.Errorf("%s = %q on a cockroach-mode connection, want off", pinned, got)
		}
	}
	if testdb.Cockroach() || testdb.CockroachMode() {
		return
	}
	plain := e.session(e.open())
	if got := setting(t, plain, name); got != "on" {
		t.Errorf("%s = %q on a PostgreSQL connection, want the database's on, untouched", name, got)
	}
}
