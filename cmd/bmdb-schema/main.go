// Command bmdb-schema writes bmdb's schema, the up migrations of the bmdb
// version it is built from in order (migrations.Schema), to standard
// output. An application's sqlc configuration lists that file before the
// application's own migrations. The application's go.mod lists the
// command as a tool (go mod edit -tool
// github.com/bmdb-dev/bmdb/cmd/bmdb-schema, which also keeps go mod tidy
// from dropping bmdb before any code imports it), and
//
//	go tool bmdb-schema > bmdb_schema.sql
//
// prints the schema of the bmdb version the application requires; commit
// the file and regenerate it when upgrading bmdb (examples/burnin does
// both, and its test checks that the committed copy is current).
package main

import (
	"fmt"
	"os"

	"github.com/bmdb-dev/bmdb/migrations"
)

func main() {
	if len(os.Args) > 1 {
		fmt.Fprintln(os.Stderr, "usage: bmdb-schema > bmdb_schema.sql (takes no arguments)")
		os.Exit(2)
	}
	schema, err := migrations.Schema()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bmdb-schema:", err)
		os.Exit(1)
	}
	if _, err := os.Stdout.WriteString(schema); err != nil {
		fmt.Fprintln(os.Stderr, "bmdb-schema: writing the schema:", err)
		os.Exit(1)
	}
}
