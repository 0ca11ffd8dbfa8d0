// Package bmdbtest holds the test set-up of packages that use bmdb (testdb
// cannot import bmdb, whose own tests use testdb).
package bmdbtest

import (
	"context"
	"os"
	"testing"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// Main runs a package's tests (call it from TestMain) with databases that
// bmdb.Open migrated; see testdb.Run.
func Main(m *testing.M) { os.Exit(testdb.Run(m, Migrate)) }

// Migrate brings the database at dsn to bmdb's schema the way components
// do: by opening it.
func Migrate(ctx context.Context, dsn string) error {
	c, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: "testdb"})
	if err != nil {
		return err
	}
	return c.Close()
}
