package testdb

import (
	"context"
	"database/sql"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	os.Exit(Run(m, func(ctx context.Context, dsn string) error {
		db, err := sql.Open("postgres", dsn)
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.ExecContext(ctx, "CREATE TABLE migrated (id INT PRIMARY KEY)")
		return err
	}))
}
