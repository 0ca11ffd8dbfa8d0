package bmdb_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/model"
)

// A component claims a machine for a process, works on it, and finishes:
// what Finish commits takes effect atomically with the end of the claim,
// and history keeps both events.
func Example() {
	dsn, drop := bmdb.NewExampleDatabase()
	defer drop()
	ctx := context.Background()

	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: "os-installer", SessionInterval: 2 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	sess, err := conn.StartSession(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sess.Close(ctx)

	// One machine to work on.
	err = sess.Transact(ctx, func(tx *bmdb.Tx) error {
		_, err := tx.CreateMachines(ctx, 1)
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	// Machines with no claim or backoff for the process; an application
	// joins its own tag tables instead (see the README).
	retrieve := func(tx *bmdb.Tx) ([]uuid.UUID, error) {
		return tx.Queries().MachinesWithoutWork(ctx, model.MachinesWithoutWorkParams{Process: "install-os", RowLimit: 16})
	}
	work, err := sess.Work(ctx, "install-os", retrieve)
	if err != nil {
		fmt.Println(err)
		return
	}
	// While the claim is held, nobody else gets the machine.
	_, err = sess.Work(ctx, "install-os", retrieve)
	fmt.Println("second claim:", errors.Is(err, bmdb.ErrNothingToDo))

	// ... install the OS here, under sess.Context() ...
	err = work.Finish(ctx, func(tx *bmdb.Tx) error {
		return nil // the application's tag, e.g. "OS installed", goes here
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	history, err := model.New(conn.DB()).WorkHistoryForMachine(ctx, work.Machine())
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, h := range history {
		fmt.Println(h.Process, h.Event)
	}
	fmt.Println("ending again:", errors.Is(work.Cancel(ctx), bmdb.ErrWorkDone))
	// Output:
	// second claim: true
	// install-os Started
	// install-os Finished
	// ending again: true
}

// installer stands for a system outside the database (a BMC, an OS
// installer's API, an object store) that keeps, per machine, the highest
// fencing token it has seen and refuses requests carrying a lower one.
type installer struct {
	mu      sync.Mutex
	highest map[uuid.UUID]int64
}

var errStaleToken = errors.New("installer: stale fencing token")

func (in *installer) install(machine uuid.UUID, token int64, image string) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if token < in.highest[machine] {
		return fmt.Errorf("%w %d < %d: not installing %s", errStaleToken, token, in.highest[machine], image)
	}
	in.highest[machine] = token
	return nil
}

// Side effects outside the database are fenced with the claim's token: a
// worker that lost its claim (it stalled, its session expired, another
// took the machine over) may still be running, but the external system
// refuses it once it has seen the newer claim's token.
func ExampleWork_FencingToken() {
	dsn, drop := bmdb.NewExampleDatabase()
	defer drop()
	ctx := context.Background()
	open := func(name string) (*bmdb.Connection, *bmdb.Session) {
		conn, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: name, SessionInterval: time.Second})
		if err != nil {
			panic(err)
		}
		sess, err := conn.StartSession(ctx)
		if err != nil {
			panic(err)
		}
		return conn, sess
	}
	oldConn, old := open("installer-a")
	defer oldConn.Close()
	newConn, next := open("installer-b")
	defer newConn.Close()
	defer next.Close(ctx)

	var machine uuid.UUID
	_ = old.Transact(ctx, func(tx *bmdb.Tx) error {
		ids, err := tx.CreateMachines(ctx, 1)
		if err == nil {
			machine = ids[0]
		}
		return err
	})
	only := func(*bmdb.Tx) ([]uuid.UUID, error) { return []uuid.UUID{machine}, nil }
	ext := &installer{highest: map[uuid.UUID]int64{}}

	stale, err := old.Work(ctx, "install-os", only)
	if err != nil {
		panic(err)
	}
	// The first worker goes quiet long enough for its session to end
	// (simulated by closing it), and the second takes the machine over.
	_ = old.Close(ctx)
	fresh, err := next.Work(ctx, "install-os", only)
	if err != nil {
		panic(err)
	}
	fmt.Println("newer token is larger:", fresh.FencingToken() > stale.FencingToken())
	fmt.Println("new claim installs:", ext.install(machine, fresh.FencingToken(), "debian-12"))
	err = ext.install(machine, stale.FencingToken(), "debian-11")
	fmt.Println("old claim refused:", errors.Is(err, errStaleToken))
	// Output:
	// newer token is larger: true
	// new claim installs: <nil>
	// old claim refused: true
}
