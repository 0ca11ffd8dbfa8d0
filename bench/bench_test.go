package main

import (
	"context"
	"database/sql"
	"os"
	"sync"
	"testing"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/internal/store"
)

// The hot paths, for go test -bench and benchstat:
//
//	BMDB_TEST_DSN=postgres://... go test -run '^$' -bench . -count 10 | tee new.txt
//	benchstat old.txt new.txt

const testDatabase = "bmdb_bench_gotest"

var (
	setupOnce sync.Once
	setupDSN  string
	setupErr  error
)

// benchConn opens a Connection on a fresh database (made once per test
// binary) with the bench's tables, and a session that the test closes.
func benchConn(b *testing.B) (*bmdb.Connection, *bmdb.Session, string) {
	b.Helper()
	admin := adminDSN(b)
	ctx := context.Background()
	setupOnce.Do(func() { setupDSN, setupErr = freshDatabase(ctx, admin, testDatabase) })
	if setupErr != nil {
		b.Fatal(setupErr)
	}
	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: setupDSN, ComponentName: "bench-test"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	if _, err := conn.DB().ExecContext(ctx, benchSchema); err != nil {
		b.Fatal(err)
	}
	sess, err := conn.StartSession(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sess.Close(context.Background()) })
	return conn, sess, setupDSN
}

// adminDSN returns the server's DSN (BMDB_TEST_DSN, or BMDB_DSN), or skips
// b without one.
func adminDSN(b testing.TB) string {
	b.Helper()
	admin := os.Getenv("BMDB_TEST_DSN")
	if admin == "" {
		admin = os.Getenv("BMDB_DSN")
	}
	if admin == "" {
		b.Skip("set BMDB_TEST_DSN or BMDB_DSN to a PostgreSQL server to run the bench's tests and benchmarks (make bench starts one)")
	}
	return admin
}

// reportRetries adds serialization retries per op to b's output.
func reportRetries(b *testing.B, conn *bmdb.Connection, before bmdb.Stats) {
	b.ReportMetric(float64(conn.Stats().TxRetries-before.TxRetries)/float64(b.N), "retries/op")
}

// BenchmarkClaimFinish is one claim cycle: Work with the bench's retrieval
// (16 candidates, shuffled), then Finish deleting the pending tag.
func BenchmarkClaimFinish(b *testing.B) {
	conn, sess, _ := benchConn(b)
	ctx := context.Background()
	if err := seed(ctx, conn.DB(), b.N); err != nil {
		b.Fatal(err)
	}
	retrieve := retriever(ctx, "bench", pickShuffle, 16)
	before := conn.Stats()
	b.ResetTimer()
	for range b.N {
		w, err := sess.Work(ctx, "bench", retrieve)
		if err != nil {
			b.Fatal(err)
		}
		if err := w.Finish(ctx, finishCommit(ctx, w)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRetries(b, conn, before)
}

// BenchmarkTransactEmpty is Session.Transact's overhead: BEGIN, the session
// check, COMMIT.
func BenchmarkTransactEmpty(b *testing.B) {
	conn, sess, _ := benchConn(b)
	ctx := context.Background()
	before := conn.Stats()
	b.ResetTimer()
	for range b.N {
		if err := sess.Transact(ctx, func(*bmdb.Tx) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRetries(b, conn, before)
}

// BenchmarkHeartbeatPoke is the heartbeat's transaction (SessionHeartbeat in its
// own SERIALIZABLE transaction), which bmdb runs internally.
func BenchmarkHeartbeatPoke(b *testing.B) {
	conn, sess, _ := benchConn(b)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		tx, err := conn.DB().BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
		if err != nil {
			b.Fatal(err)
		}
		n, err := store.New(tx).SessionHeartbeat(ctx, sess.ID())
		if err != nil || n != 1 {
			b.Fatalf("poke: %d rows, %v", n, err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFloorCycle is the floor of a claim cycle: an insert and a delete,
// each in its own SERIALIZABLE transaction.
func BenchmarkFloorCycle(b *testing.B) {
	conn, _, dsn := benchConn(b)
	ctx := context.Background()
	if err := seed(ctx, conn.DB(), b.N); err != nil {
		b.Fatal(err)
	}
	ids, err := machineIDs(ctx, conn.DB())
	if err != nil {
		b.Fatal(err)
	}
	pool, err := openPool(dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	b.ResetTimer()
	for _, id := range ids {
		for _, step := range floorSteps {
			if _, err := execSerializable(ctx, pool, step(id, "floor")); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// TestMain drops the benchmarks' database afterwards.
func TestMain(m *testing.M) {
	code := m.Run()
	if setupDSN != "" {
		admin := os.Getenv("BMDB_TEST_DSN")
		if admin == "" {
			admin = os.Getenv("BMDB_DSN")
		}
		_ = dropDatabase(context.Background(), admin, testDatabase)
	}
	os.Exit(code)
}

// BenchmarkLoop is worker.Loop's default path: b.N machines through 32
// handlers, each committing its machine's own result.
func BenchmarkLoop(b *testing.B) {
	_, _, dsn := benchConn(b)
	b.ResetTimer()
	if _, _, err := loopOnce(context.Background(), dsn, b.N, 32, 1, false); err != nil {
		b.Fatal(err)
	}
}
