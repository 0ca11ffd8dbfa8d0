package migrations

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// childDSNEnv, when set, makes the test binary a migrator that takes the
// lock on the database it names and waits to be killed.
const childDSNEnv = "BMDB_TEST_MIGRATOR_DSN"

func TestMain(m *testing.M) {
	if dsn := os.Getenv(childDSNEnv); dsn != "" {
		os.Exit(runMigratorChild(dsn))
	}
	os.Exit(testdb.Run(m, func(ctx context.Context, dsn string) error {
		db, err := sql.Open("postgres", dsn)
		if err != nil {
			return err
		}
		defer db.Close()
		m, err := New(db, &Config{HolderInfo: "testdb"})
		if err != nil {
			return err
		}
		_, err = m.Up(ctx)
		return err
	}))
}

// openRaw opens a plain pool on dsn, closed at cleanup.
func openRaw(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// shortLease shortens the migration lease for the duration of a test
// that does not run in parallel.
func shortLease(t *testing.T, d time.Duration) {
	old := setLease(d)
	t.Cleanup(func() { setLease(old) })
}

// A migrator killed while holding the lock delays the next migration by
// at most one lease: nobody has to delete anything by hand. (Before the
// lease, every later Open failed until someone deleted golang-migrate's
// schema_lock row.)
func TestCockroachMigratorKilledWhileHoldingLock(t *testing.T) {
	shortLease(t, time.Second)
	dsn := testdb.NewEmpty(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childDSNEnv+"="+dsn)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	said := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		said <- strings.TrimSpace(line)
	}()
	select {
	case line := <-said:
		if line != "locked" {
			t.Fatalf("migrator said %q, want locked", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("migrator said nothing for 10s")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	m := migrator(t, dsn, nil, crdbmode.Settings{Enabled: true})
	lock, err := m.ReadLock(context.Background())
	if err != nil || lock == nil || !lock.Live {
		t.Fatalf("ReadLock after the kill = %+v, %v; want the dead migrator's live lease", lock, err)
	}

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("Up after a migrator died holding the lock: %v", err)
	}
	took := time.Since(start)
	// What the migrations themselves take on this machine now: Up on an
	// empty database of its own, with no lock to wait for.
	fresh := migrator(t, testdb.NewEmpty(t), nil, crdbmode.Settings{Enabled: true})
	start = time.Now()
	if _, err := fresh.Up(ctx); err != nil {
		t.Fatal(err)
	}
	migrating := time.Since(start)
	t.Logf("Up after the killed migrator took %v, Up with no lock to wait for %v (lease %v)", took, migrating, lease())
	if took > migrating+2*lease()+time.Second {
		t.Errorf("Up waited %v for a dead migrator's lock (migrating takes %v, the lease is %v)", took-migrating, migrating, lease())
	}
}

// runMigratorChild takes the migration lock as a migrator does, says
// "locked", and waits to be killed.
func runMigratorChild(dsn string) int {
	setLease(time.Second)
	ctx := context.Background()
	conn, err := dbconn.NewConnector(dsn, time.Second, dbconn.Settings{}, nil)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	db := sql.OpenDB(conn)
	if _, err := acquireMigrationLock(ctx, db, "doomed migrator"); err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("locked")
	select {}
}

// ClearLock removes a lease and a driver lock row; with none it reports
// nothing cleared.
func TestClearLock(t *testing.T) {
	t.Parallel()
	dsn := testdb.New(t)
	db := openRaw(t, dsn)
	ctx := context.Background()
	m := migrator(t, dsn, nil, crdbmode.Settings{})
	if cleared, err := m.ClearLock(ctx); err != nil || cleared {
		t.Fatalf("ClearLock with no lock = %v, %v", cleared, err)
	}
	lock, err := acquireMigrationLock(ctx, db, "stuck")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.release()
	if cleared, err := m.ClearLock(ctx); err != nil || !cleared {
		t.Fatalf("ClearLock = %v, %v", cleared, err)
	}
	if l, err := m.ReadLock(ctx); err != nil || l != nil {
		t.Fatalf("lock after clearing: %+v, %v", l, err)
	}
}
