package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/bmdb-dev/bmdb/bmdb"
)

// TestFloorsExactlyOnce runs each floor as two "processes" (two
// floorChilds, their own pools) of four workers over the same items, until
// none is pending, and checks that each item was ended exactly once (one
// Finished history row, and for floor-batch one Started row), that no claim
// or pending tag is left, that the processes' items add up, and that their
// round trips by lib/pq's protocol are those on their sockets.
func TestFloorsExactlyOnce(t *testing.T) {
	const m = 400
	admin := adminDSN(t)
	ctx := context.Background()
	dsn, err := freshDatabase(ctx, admin, "bmdb_bench_gotest_floors")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dropDatabase(context.Background(), admin, "bmdb_bench_gotest_floors") })
	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: "bench-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	db := conn.DB()
	if _, err := db.ExecContext(ctx, benchSchema); err != nil {
		t.Fatal(err)
	}
	for _, sys := range []string{sysFloorItem, sysFloorBatch} {
		t.Run(sys, func(t *testing.T) {
			if err := seed(ctx, db, m); err != nil {
				t.Fatal(err)
			}
			var floors []*floorChild
			var counters []*rtCounter
			for i := range 2 {
				rt := newRTCounter(dsn)
				f, err := newFloorChild(ctx, childConfig{
					System: sys, DSN: dsn, Name: fmt.Sprintf("test-%s-%d", sys, i), Workers: 4,
					PollMin: time.Millisecond, PollMax: 16 * time.Millisecond,
				}, rt)
				if err != nil {
					t.Fatal(err)
				}
				floors, counters = append(floors, f), append(counters, rt)
			}
			before := []rtSnapshot{counters[0].snapshot(), counters[1].snapshot()}
			for _, f := range floors {
				if err := f.start(ctx); err != nil {
					t.Fatal(err)
				}
			}
			deadline := time.Now().Add(time.Minute)
			for {
				var left int
				if err := db.QueryRowContext(ctx, `SELECT count(*) FROM bench_pending`).Scan(&left); err != nil {
					t.Fatal(err)
				}
				if left == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d items still pending after a minute", left, m)
				}
				time.Sleep(5 * time.Millisecond)
			}
			var items int64
			for i, f := range floors {
				var res childResult
				if err := f.stop(&res); err != nil {
					t.Fatalf("process %d: %v", i, err)
				}
				items += res.Items
				got := counters[i].snapshot().since(before[i])
				if got.RoundTrips != got.Socket || got.RoundTrips < 3*res.Items {
					t.Errorf("process %d: %d items, %d round trips by lib/pq's protocol, %d on the socket",
						i, res.Items, got.RoundTrips, got.Socket)
				}
			}
			c, ok, err := checkFloor(ctx, db, m, sys == sysFloorBatch)
			if err != nil {
				t.Fatal(err)
			}
			if !ok || items != m {
				t.Errorf("%d items worked of %d; %s", items, m, c)
			}
		})
	}
}
