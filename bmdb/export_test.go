package bmdb

import "github.com/bmdb-dev/bmdb/internal/testing/testdb"

// NewExampleDatabase gives examples (package bmdb_test) a fresh database.
func NewExampleDatabase() (dsn string, drop func()) { return testdb.NewForExample() }
