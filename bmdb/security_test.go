package bmdb

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/lib/pq"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// withPassword returns dsn with user:password in it (the test server trusts
// every local connection, so the password is accepted and ignored).
func withPassword(t *testing.T, dsn, user, password string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("test DSN is not a URL: %v", err)
	}
	u.User = url.UserPassword(user, password)
	return u.String()
}

// No log line (at the most verbose level bmdb uses) and no error carries the
// DSN's password. Not parallel: it redirects klog.
func TestNoPasswordInLogsOrErrors(t *testing.T) {
	const password = "s3cret-Pw-42"
	var logs syncBuffer
	var flags flag.FlagSet
	klog.InitFlags(&flags)
	for k, v := range map[string]string{"v": "2", "logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		if err := flags.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	klog.SetOutput(&logs)
	defer func() {
		klog.Flush()
		flags.Set("v", "0")
		flags.Set("logtostderr", "true")
		klog.SetOutput(os.Stderr)
	}()

	dsn := withPassword(t, testdb.New(t), "postgres", password)
	ctx := context.Background()
	c, err := Open(ctx, Config{DSN: dsn, ComponentName: "test", SessionInterval: testInterval})
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.StartSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	_, err = s.Work(ctx, "install", retrieveAll()) // nothing to do
	errs = append(errs, err)
	errs = append(errs, s.Close(ctx), c.Close())
	for _, bad := range []string{
		"postgres://bmdb:" + password + "@127.0.0.1:1/bmdb?sslmode=disable",   // unreachable
		"postgres://bmdb:" + password + "@127.0.0.1:notaport/bmdb",            // malformed URL
		"host=127.0.0.1 port=1 password=" + password + " sslmode=disable",     // key=value, unreachable
		"host=127.0.0.1 password='" + password + "' sslmode=nonsense",         // key=value, malformed
		"postgres://bmdb:" + password + "@127.0.0.1:1/bmdb?sslmode=verify-ca", // TLS to nowhere
	} {
		_, err := Open(ctx, Config{DSN: bad, ComponentName: "test"})
		if err == nil {
			t.Errorf("Open(%s) succeeded", redactDSN(bad))
		}
		errs = append(errs, err)
	}
	klog.Flush()
	for _, err := range errs {
		if err != nil && strings.Contains(err.Error(), password) {
			t.Errorf("error reveals the password: %v", err)
		}
	}
	out := logs.String()
	if strings.Contains(out, password) {
		t.Errorf("log reveals the password:\n%s", out)
	}
	if !strings.Contains(out, " at postgres://postgres:xxxxx@") {
		t.Errorf("the connection log line is missing, so the test saw no log:\n%s", out)
	}
}

// A TLS DSN reaches the driver unchanged: against this plain-text server,
// sslmode=verify-full fails the way lib/pq fails without TLS.
func TestTLSDSNPassedThrough(t *testing.T) {
	t.Parallel()
	dsn := testdb.New(t)
	u, _ := url.Parse(dsn)
	q := u.Query()
	q.Set("sslmode", "verify-full")
	u.RawQuery = q.Encode()
	_, err := Open(context.Background(), Config{DSN: u.String(), ComponentName: "test"})
	if err == nil || !strings.Contains(err.Error(), "SSL is not enabled on the server") {
		t.Fatalf("Open with sslmode=verify-full = %v, want lib/pq's TLS refusal", err)
	}
	if got := redactDSN("postgres://u:p@db:5432/bmdb?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem"); got != "postgres://u:xxxxx@db:5432/bmdb?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem" {
		t.Errorf("redactDSN changed the TLS options: %s", got)
	}
}

// docs/roles.sql works: a worker role with DML only runs a claim cycle and
// cannot change the schema; an operator role reads the views and nothing else.
func TestLeastPrivilegeRoles(t *testing.T) { leastPrivilegeRoles(t, false) }

// leastPrivilegeRoles runs the roles test, on CockroachDB's path if
// cockroachPath.
func leastPrivilegeRoles(t *testing.T, cockroachPath bool) {
	t.Parallel()
	testdb.New(t) // connects, so that testdb.Cockroach() knows
	file := "../docs/roles.sql"
	if testdb.Cockroach() {
		file = "../docs/roles-cockroachdb.sql"
	}
	script, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	suffix := fmt.Sprintf("_%d_%d", os.Getpid(), rand.N(1_000_000))
	worker, operator := "bmdb_worker"+suffix, "bmdb_operator"+suffix
	sqlText := strings.NewReplacer("bmdb_worker", worker, "bmdb_operator", operator).Replace(string(script))

	admin, err := sql.Open("postgres", testdb.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	// Registered before the database, so it runs after the database is gone
	// (and the grants with it).
	t.Cleanup(func() {
		for _, role := range []string{worker, operator} {
			admin.Exec("DROP ROLE IF EXISTS " + pq.QuoteIdentifier(role))
		}
	})
	dsn := testdb.New(t)
	owner, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	if _, err := owner.Exec(sqlText); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	ctx := context.Background()

	cfg := Config{DSN: withPassword(t, dsn, worker, "worker-password"), ComponentName: "worker", SkipMigrations: true}
	if cockroachPath {
		cockroachMode(&cfg)
	}
	c, err := Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open as the worker role: %v", err)
	}
	defer c.Close()
	s, err := c.StartSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if err := s.Transact(ctx, func(tx *Tx) error {
		_, err := tx.CreateMachines(ctx, 1)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	w, err := s.Work(ctx, "install", retrieveIdle("install"))
	if err != nil {
		t.Fatalf("Work as the worker role: %v", err)
	}
	if err := w.Fail(ctx, &testBackoff, "x"); err != nil {
		t.Fatalf("Fail as the worker role: %v", err)
	}
	if _, err := c.CollectGarbage(ctx); err != nil {
		t.Fatalf("GC as the worker role: %v", err)
	}
	if _, err := c.DB().Exec("CREATE TABLE sneaky (id INT)"); sqlState(err) != "42501" {
		t.Errorf("worker role ran DDL: %v", err)
	}
	if _, err := c.DB().Exec("TRUNCATE work_history"); sqlState(err) != "42501" {
		t.Errorf("worker role truncated history: %v", err)
	}

	op, err := sql.Open("postgres", withPassword(t, dsn, operator, "operator-password"))
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	for _, view := range []string{"live_sessions", "current_work", "active_backoffs", "readable_history", "machine_overview"} {
		var n int
		if err := op.QueryRow("SELECT count(*) FROM " + view).Scan(&n); err != nil {
			t.Errorf("operator role cannot read %s: %v", view, err)
		}
	}
	for _, stmt := range []string{"SELECT count(*) FROM sessions", "DELETE FROM work_backoff", "INSERT INTO machines DEFAULT VALUES"} {
		if _, err := op.Exec(stmt); sqlState(err) != "42501" {
			t.Errorf("operator role: %s = %v, want permission denied", stmt, err)
		}
	}
}

// Every SQL statement in hand-written code is a constant: no SQL built by
// string formatting or concatenation from input. Identifiers, which cannot
// be parameters (CREATE DATABASE in test helpers), may be concatenated only
// through pq.QuoteIdentifier.
func TestSQLIsParameterized(t *testing.T) {
	t.Parallel()
	root := ".."
	packages := map[string][]*ast.File{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() && rel != "." && (rel == "model" || rel == filepath.Join("internal", "store") || d.Name() == "pipelinedb" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir // generated by sqlc, or tools
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		packages[filepath.Dir(path)] = append(packages[filepath.Dir(path)], f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, files := range packages {
		consts := packageConsts(files)
		for _, f := range files {
			checked++
			checkSQLCalls(t, fset, f, consts)
		}
	}
	if checked < 10 {
		t.Fatalf("checked only %d files", checked)
	}
}

// packageConsts returns the names of the constants declared in files.
func packageConsts(files []*ast.File) map[string]bool {
	consts := map[string]bool{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			if g, ok := n.(*ast.GenDecl); ok && g.Tok == token.CONST {
				for _, spec := range g.Specs {
					for _, name := range spec.(*ast.ValueSpec).Names {
						consts[name.Name] = true
					}
				}
			}
			return true
		})
	}
	return consts
}

// forwarders are the functions that pass on a query they were given rather
// than build one, each called only with constant text: the driver wrapper
// (internal/dbconn's netconn.go) and its statement cache (stmtcache.go)
// forward database/sql's queries to lib/pq, the transaction's view
// (internal/txn's tx.go) forwards store's and the application's to the
// transaction, crdbTx.Exec (internal/txn's attempt.go) runs crdb's
// SAVEPOINT statements, ensureTable (package migrations' lock.go) runs
// the CREATE TABLE it is handed, and querySetting (internal/dbconn's
// pins.go) the settings statement it is handed; execSplit (faults.go)
// the bench's waitUntil and poller.wait (matrix.go) poll the constant
// query they are given, its rtcount.go is a driver wrapper counting the
// round trips of the queries it forwards, the chaos harness's
// commitTimes (reclaim.go) runs the constant query it is given, cockroach
// mode's full-scan guardrail (fullscan.go) asks for the plan of a bmdb
// statement it forwards (explain), and
// cockroach mode's emulator (crdbmode's emulator.go, test tooling) passes
// every query on and runs the statements of migration files, a probe of
// a session row by its parsed UUID and BEGIN with constant options, and
// its lock at fetch (locking.go) the lock models it derives from bmdb's
// own statements' text, with their parameters (and its ddl.go the
// statements of migration scripts, execScript, and the constant catalog
// queries it is handed, queryInt); package migrations' driver.go runs
// the statements of migration files (Run).
var forwarders = map[string]bool{
	"netconn.go:*": true, "stmtcache.go:*": true, "tx.go:*": true, "attempt.go:Exec": true, "lock.go:ensureTable": true, "pins.go:querySetting": true, "emulator.go:*": true,
	"procs.go:waitUntil": true, "matrix.go:wait": true, "rtcount.go:*": true, "reclaim.go:commitTimes": true, "fullscan.go:explain": true, "locking.go:lockAtFetch": true, "ddl.go:execScript": true, "ddl.go:queryInt": true, "driver.go:Run": true,
}

// sqlMethods maps database/sql methods to the index of their query
// argument (pgx's, in the bench, take a context first).
var sqlMethods = map[string]int{
	"Exec": 0, "Query": 0, "QueryRow": 0, "Prepare": 0,
	"ExecContext": 1, "QueryContext": 1, "QueryRowContext": 1, "PrepareContext": 1,
}

// checkSQLCalls reports every database/sql call in f whose query is not
// constant.
func checkSQLCalls(t *testing.T, fset *token.FileSet, f *ast.File, consts map[string]bool) {
	imports := map[string]bool{} // package names: pkg.Prepare is a function, not a method
	for _, imp := range f.Imports {
		path := strings.Trim(imp.Path.Value, `"`)
		name := path[strings.LastIndex(path, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		imports[name] = true
	}
	file := filepath.Base(fset.Position(f.Pos()).Filename)
	if forwarders[file+":*"] {
		return
	}
	var fn string // the enclosing function
	ast.Inspect(f, func(n ast.Node) bool {
		if d, ok := n.(*ast.FuncDecl); ok {
			fn = d.Name.Name
		}
		call, ok := n.(*ast.CallExpr)
		if !ok || forwarders[file+":"+fn] {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if pkg, ok := sel.X.(*ast.Ident); ok && imports[pkg.Name] {
			return true
		}
		if prep, ok := sel.X.(*ast.CallExpr); ok {
			if ps, ok := prep.Fun.(*ast.SelectorExpr); ok && (ps.Sel.Name == "StmtContext" || ps.Sel.Name == "Stmt") {
				return true // a prepared statement's call takes arguments, not a query
			}
		}
		i, ok := sqlMethods[sel.Sel.Name]
		if !ok || len(call.Args) <= i {
			return true
		}
		if id, isCtx := call.Args[0].(*ast.Ident); i == 0 && len(call.Args) > 1 && isCtx && id.Name == "ctx" {
			i = 1 // pgx's Exec, Query and QueryRow take the context first
		}
		if !constantString(call.Args[i], consts) {
			t.Errorf("%s: %s's query is not a constant string", fset.Position(call.Pos()), sel.Sel.Name)
		}
		return true
	})
}

// constantString reports whether e is a string literal, a constant, a
// pq.QuoteIdentifier call, or a concatenation of those.
func constantString(e ast.Expr, consts map[string]bool) bool {
	switch e := e.(type) {
	case *ast.BasicLit:
		return e.Kind == token.STRING
	case *ast.Ident:
		return consts[e.Name]
	case *ast.BinaryExpr:
		return e.Op == token.ADD && constantString(e.X, consts) && constantString(e.Y, consts)
	case *ast.ParenExpr:
		return constantString(e.X, consts)
	case *ast.CallExpr:
		sel, ok := e.Fun.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		pkg, ok := sel.X.(*ast.Ident)
		return ok && pkg.Name == "pq" && sel.Sel.Name == "QuoteIdentifier"
	}
	return false
}

// A context that is already done fails every call before anything is
// written.
func TestContextAlreadyDone(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open()
	s := e.session(c)
	m := e.machine()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Open(done, e.config()); !errors.Is(err, context.Canceled) {
		t.Errorf("Open = %v", err)
	}
	if _, err := c.StartSession(done); !errors.Is(err, context.Canceled) {
		t.Errorf("StartSession = %v", err)
	}
	if _, err := s.Work(done, "install", retrieveAll(m)); !errors.Is(err, context.Canceled) {
		t.Errorf("Work = %v", err)
	}
	w, err := s.Work(context.Background(), "install", retrieveAll(m))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Finish(done, tagCommit(m)); !errors.Is(err, context.Canceled) {
		t.Errorf("Finish = %v", err)
	}
	if err := w.Fail(done, &testBackoff, "x"); !errors.Is(err, context.Canceled) {
		t.Errorf("Fail = %v", err)
	}
	if _, err := c.CollectGarbage(done); !errors.Is(err, context.Canceled) {
		t.Errorf("CollectGarbage = %v", err)
	}
	if n := e.count("SELECT count(*) FROM sessions"); n != 1 {
		t.Errorf("%d sessions, want only the live one", n)
	}
	if got := e.events(m, s); !slicesEqual(got, "install:Started@1") {
		t.Errorf("history = %v", got)
	}
	// The Work is still open: the failed calls changed nothing.
	if err := w.Finish(context.Background(), tagCommit(m)); err != nil {
		t.Errorf("Finish after the failed calls: %v", err)
	}
}
