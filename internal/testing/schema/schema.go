// Package schema brings a test database to bmdb's schema, for the
// packages below bmdb whose tests need it (their TestMain:
// os.Exit(testdb.Run(m, schema.Up))). It is not in testdb because
// migrations' own tests use testdb.
package schema

import (
	"context"
	"database/sql"

	_ "github.com/lib/pq" // the "postgres" driver

	"github.com/bmdb-dev/bmdb/migrations"
)

// Up applies bmdb's migrations to the database at dsn.
func Up(ctx context.Context, dsn string) error {
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	mig, err := migrations.New(db, nil)
	if err != nil {
		return err
	}
	_, err = mig.Up(ctx)
	return err
}
