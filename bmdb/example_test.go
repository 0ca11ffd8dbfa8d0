package bmdb_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/model"
)

// A component claims a machine for a process, works on it, and finishes:
// the tag that records the result commits atomically with the end of the
// claim, and history keeps both events.
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

	// Seed one machine that is provided and has its agent running.
	err = sess.Transact(ctx, func(tx *bmdb.Tx) error {
		q := tx.Queries()
		id, err := q.MachineCreate(ctx)
		if err != nil {
			return err
		}
		if err := q.MachineProvidedInsert(ctx, model.MachineProvidedInsertParams{MachineID: id, Provider: "dc1"}); err != nil {
			return err
		}
		return q.MachineAgentStartedInsert(ctx, model.MachineAgentStartedInsertParams{MachineID: id, AgentVersion: "v1"})
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	retrieve := func(tx *bmdb.Tx) ([]uuid.UUID, error) {
		return tx.Queries().MachinesNeedingOSInstall(ctx, 16)
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
		return tx.Queries().MachineOSInstalledInsert(ctx, model.MachineOSInstalledInsertParams{MachineID: work.Machine(), OsImage: "debian-12"})
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
