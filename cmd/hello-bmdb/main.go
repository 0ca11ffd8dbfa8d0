// Command hello-bmdb is the README's first program: it opens bmdb (which
// migrates the schema), creates three machines, claims them for a process,
// does its "work", finishes each claim, and prints their history.
//
//	BMDB_DSN=postgres://... go run ./cmd/hello-bmdb
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/model"
)

func main() {
	if err := run(context.Background(), os.Getenv("BMDB_DSN")); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, dsn string) error {
	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: "hello"})
	if err != nil {
		return err
	}
	defer conn.Close()
	sess, err := conn.StartSession(ctx)
	if err != nil {
		return err
	}
	defer sess.Close(context.Background())

	// Three machines to work on.
	err = sess.Transact(ctx, func(tx *bmdb.Tx) error {
		_, err := tx.CreateMachines(ctx, 3)
		return err
	})
	if err != nil {
		return err
	}

	// Claim them for the process "say-hello": each claim is a row that no
	// other session can hold at the same time.
	retrieve := func(tx *bmdb.Tx) ([]uuid.UUID, error) {
		return tx.Queries().MachinesWithoutWork(ctx, model.MachinesWithoutWorkParams{Process: "say-hello", RowLimit: 16})
	}
	var works []*bmdb.Work
	for range 3 {
		w, err := sess.Work(ctx, "say-hello", retrieve)
		if err != nil {
			return err
		}
		works = append(works, w)
	}

	// Do the work under sess.Context(), which ends if the session does,
	// then finish: Finish commits only if this session still holds the
	// claim. (Fail would back off instead: w.Fail(ctx, &backoff, cause).)
	for _, w := range works {
		select {
		case <-time.After(10 * time.Millisecond): // the work
		case <-sess.Context().Done():
			return sess.Err()
		}
		err := w.Finish(ctx, func(tx *bmdb.Tx) error {
			return nil // your tag for the machine goes here, in the same transaction
		})
		if err != nil {
			return err
		}
		fmt.Printf("hello, machine %s (fencing token %d)\n", w.Machine(), w.FencingToken())
	}

	history, err := model.New(conn.DB()).WorkHistoryForMachine(ctx, works[0].Machine())
	if err != nil {
		return err
	}
	for _, h := range history {
		fmt.Println(h.At.Format(time.TimeOnly), h.Process, h.Event)
	}
	return nil
}
