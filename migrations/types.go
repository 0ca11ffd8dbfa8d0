package migrations

import (
	"bytes"
	"io"
	"io/fs"
	"regexp"
	"strings"
)

// bmdb's files are safe to run again from any partial state (the
// bmdb:rerunnable marker), 000001 included, but for one kind of statement
// that neither engine runs twice as written, and that they make idempotent
// differently: CREATE TYPE. CockroachDB has CREATE TYPE IF NOT EXISTS;
// PostgreSQL (15 and later alike) does not, and neither does sqlc, which
// reads the same files with PostgreSQL's grammar, so the files say CREATE
// TYPE and golang-migrate is served each of bmdb's up files with its CREATE
// TYPE statements rewritten for the engine:
//
//	CockroachDB: CREATE TYPE IF NOT EXISTS name AS ...;
//	PostgreSQL:  DO $bmdb$ BEGIN CREATE TYPE name AS ...; EXCEPTION WHEN duplicate_object THEN NULL; END $bmdb$;
//
// Only bmdb's own files are rewritten (an application's are run as
// written), and only a statement that starts a line with CREATE TYPE and
// has no semicolon before its own.

// createType matches a CREATE TYPE statement; its group is what follows
// CREATE TYPE, up to the semicolon.
var createType = regexp.MustCompile(`(?im)^CREATE\s+TYPE\s+([^;]*);`)

// idempotentTypes returns an up file's text with its CREATE TYPE
// statements in the engine's idempotent form.
func idempotentTypes(body string, cockroach bool) string {
	return createType.ReplaceAllStringFunc(body, func(stmt string) string {
		rest := createType.FindStringSubmatch(stmt)[1]
		if strings.HasPrefix(strings.ToUpper(rest), "IF NOT EXISTS") {
			return stmt
		}
		if cockroach {
			return "CREATE TYPE IF NOT EXISTS " + rest + ";"
		}
		return "DO $bmdb$ BEGIN CREATE TYPE " + rest + "; EXCEPTION WHEN duplicate_object THEN NULL; END $bmdb$;"
	})
}

// typesFS serves bmdb's files with idempotentTypes applied to its up
// files, for golang-migrate.
type typesFS struct {
	fs.FS
	cockroach bool
}

func (f typesFS) Open(name string) (fs.File, error) {
	file, err := f.FS.Open(name)
	if err != nil || !upFile.MatchString(name) {
		return file, err
	}
	defer file.Close()
	info, err := file.Stat()
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(file)
	if err != nil {
		return nil, err
	}
	text := []byte(idempotentTypes(string(body), f.cockroach))
	return &memFile{Reader: bytes.NewReader(text), info: sizedInfo{FileInfo: info, size: int64(len(text))}}, nil
}

// memFile is a file served from memory.
type memFile struct {
	*bytes.Reader
	info fs.FileInfo
}

func (f *memFile) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *memFile) Close() error               { return nil }

// sizedInfo is a file's information with another size.
type sizedInfo struct {
	fs.FileInfo
	size int64
}

func (i sizedInfo) Size() int64 { return i.size }
