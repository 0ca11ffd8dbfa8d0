package migrations

import (
	"io/fs"
	"strings"
	"testing"
)

// Schema holds every up migration once, in version order, and no down
// migration.
func TestSchema(t *testing.T) {
	schema, err := Schema()
	if err != nil {
		t.Fatal(err)
	}
	ups, err := fs.Glob(FS, "*.up.sql")
	if err != nil || len(ups) == 0 {
		t.Fatalf("no up migrations embedded: %v", err)
	}
	at := 0
	for _, name := range ups {
		i := strings.Index(schema, "\n-- migrations/"+name+"\n")
		if i < at {
			t.Fatalf("%s missing or out of order in the schema", name)
		}
		at = i
	}
	if n := strings.Count(schema, "\n-- migrations/"); n != len(ups) {
		t.Errorf("schema has %d files, want the %d up migrations", n, len(ups))
	}
	if strings.Contains(schema, ".down.sql") {
		t.Error("schema includes a down migration")
	}
	if again, _ := Schema(); again != schema {
		t.Error("Schema is not deterministic")
	}
}
