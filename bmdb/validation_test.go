package bmdb

import (
	"context"
	"database/sql/driver"
	"errors"
	"math"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

func TestOpenRejectsBadConfig(t *testing.T) {
	t.Parallel()
	good := Config{DSN: "postgres://u@127.0.0.1:1/db", ComponentName: "c"}
	for _, tc := range []struct {
		field string
		mod   func(*Config)
	}{
		{"Config.DSN", func(c *Config) { c.DSN = "" }},
		{"Config.ComponentName", func(c *Config) { c.ComponentName = "" }},
		{"Config.ComponentName", func(c *Config) { c.ComponentName = strings.Repeat("x", maxComponentNameLength+1) }},
		{"Config.ComponentName", func(c *Config) { c.ComponentName = "bad\x00name" }},
		{"Config.ComponentName", func(c *Config) { c.ComponentName = "\xff" }},
		{"Config.RuntimeInfo", func(c *Config) { c.RuntimeInfo = strings.Repeat("x", maxRuntimeInfoLength+1) }},
		{"Config.SessionInterval", func(c *Config) { c.SessionInterval = -time.Second }},
		{"Config.SessionInterval", func(c *Config) { c.SessionInterval = time.Millisecond }},
		{"Config.GCPeriod", func(c *Config) { c.GCPeriod = -1 }},
		{"Config.GCGracePeriod", func(c *Config) { c.GCGracePeriod = -1 }},
		{"Config.MaxTxAttempts", func(c *Config) { c.MaxTxAttempts = -1 }},
		{"Config.MaxBatchSize", func(c *Config) { c.MaxBatchSize = -1 }},
		{"Config.MaxBatchSize", func(c *Config) { c.MaxBatchSize = MaxWorkMany + 1 }},
		{"Config.MaxOpenConns", func(c *Config) { c.MaxOpenConns = -1 }},
		{"Config.MaxIdleConns", func(c *Config) { c.MaxIdleConns = -1 }},
		{"Config.DSN", func(c *Config) { c.DSN = "postgres://user:s3cret@host:notaport/db" }},
		{"Config.DSN", func(c *Config) { c.DSN = "host=localhost password=s3cret sslmode=bogus" }},
	} {
		cfg := good
		tc.mod(&cfg)
		_, err := Open(context.Background(), cfg)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Open(%s bad) = %v, want ErrInvalidArgument naming %s", tc.field, err, tc.field)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("error reveals the DSN password: %v", err)
		}
	}
}

// An unreachable database fails Open within ctx, without the password in
// the error.
func TestOpenUnreachableDatabase(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	// 127.0.0.1:1 refuses connections; 192.0.2.1 is never routed, but this
	// test sends nothing off the machine, so use a closed local port.
	_, err := Open(ctx, Config{DSN: "postgres://bmdb:s3cret@127.0.0.1:1/bmdb?sslmode=disable", ComponentName: "c"})
	if err == nil {
		t.Fatal("Open of an unreachable database succeeded")
	}
	if time.Since(start) > 3*time.Second {
		t.Errorf("Open took %v, longer than its context", time.Since(start))
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error reveals the DSN password: %v", err)
	}
	if !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("error does not say where it tried to connect: %v", err)
	}
}

// A DSN without sslmode, to a server without TLS, fails with lib/pq's
// "SSL is not enabled on the server" and a hint saying what to add.
func TestOpenSSLHint(t *testing.T) {
	t.Parallel()
	dsn := testdb.New(t)
	if testdb.Cockroach() {
		t.Skip("the CockroachDB test cluster's TLS setting is its own")
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Skipf("test DSN is not a URL: %v", err)
	}
	q := u.Query()
	q.Del("sslmode")
	u.RawQuery = q.Encode()
	_, err = Open(context.Background(), Config{DSN: u.String(), ComponentName: "c"})
	if !errors.Is(err, pq.ErrSSLNotSupported) || !strings.Contains(err.Error(), "add sslmode=disable to the DSN") {
		t.Fatalf("Open without sslmode = %v, want pq.ErrSSLNotSupported with a hint", err)
	}
}

// ValidateProcess is the one rule for process names: valid UTF-8, 1 to
// maxProcessLength bytes, no white space, no control characters. Each
// refusal wraps ErrInvalidArgument and says what is wrong.
func TestValidateProcess(t *testing.T) {
	for _, tc := range []struct {
		process string
		want    string // "" if valid, else a part of the error
	}{
		{"burn-in", ""},
		{"os_install.v2", ""},
		{"prüfung/α", ""},
		{strings.Repeat("p", maxProcessLength), ""},
		{"", "empty"},
		{strings.Repeat("p", maxProcessLength+1), "more than 128"},
		{"\xfe", "not valid UTF-8"},
		{"a\nb", "control character (U+000A) at byte 1"},
		{"nul\x00", "control character (U+0000)"},
		{"del\x7f", "control character (U+007F)"},
		{"c1\u0085", "control character (U+0085)"},
		{"tab\t", "control character (U+0009)"},
		{"a b", "white space (U+0020) at byte 1"},
		{"nbsp\u00a0x", "white space (U+00A0)"},
		{" lead", "white space"},
	} {
		err := ValidateProcess(tc.process)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("ValidateProcess(%q) = %v, want nil", tc.process, err)
		case tc.want != "" && (!errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("ValidateProcess(%q) = %v, want ErrInvalidArgument saying %q", tc.process, err, tc.want)
		}
	}
}

// Every bad argument of a Session method is refused with ErrInvalidArgument,
// before anything is written.
func TestSessionMethodsRejectBadInput(t *testing.T) {
	e := newWorkEnv(t)
	s := e.session(e.open())
	ctx := context.Background()
	m := e.machine()
	for _, process := range []string{"", strings.Repeat("p", maxProcessLength+1), "nul\x00", "\xfe", "a\nb", "a b"} {
		if _, err := s.Work(ctx, process, retrieveAll(m)); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "process") {
			t.Errorf("Work(%q) = %v, want ErrInvalidArgument", process, err)
		}
	}
	if _, err := s.Work(ctx, "install", nil); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "retrieve") {
		t.Errorf("Work(nil retrieve) = %v", err)
	}
	if err := s.Transact(ctx, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Transact(nil) = %v", err)
	}
	w, err := s.Work(ctx, strings.Repeat("p", maxProcessLength), retrieveAll(m))
	if err != nil {
		t.Fatalf("Work with a process name of the maximum length: %v", err)
	}
	if err := w.Finish(ctx, nil); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "commit") {
		t.Errorf("Finish(nil) = %v", err)
	}
	for _, b := range []Backoff{
		{Initial: 0, Maximum: time.Second, Exponent: 2},
		{Initial: -time.Second, Maximum: time.Second, Exponent: 2},
		{Initial: time.Second, Maximum: 0, Exponent: 2},
		{Initial: 2 * time.Second, Maximum: time.Second, Exponent: 2},
		{Initial: time.Second, Maximum: time.Second, Exponent: 0},
		{Initial: time.Second, Maximum: time.Second, Exponent: 0.5},
		{Initial: time.Second, Maximum: time.Second, Exponent: math.NaN()},
		{Initial: time.Second, Maximum: time.Second, Exponent: math.Inf(1)},
		{Initial: time.Second, Maximum: time.Second, Exponent: 2, Jitter: -0.1},
		{Initial: time.Second, Maximum: time.Second, Exponent: 2, Jitter: 1.5},
	} {
		if err := w.Fail(ctx, &b, "x"); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "Backoff.") {
			t.Errorf("Fail(%+v) = %v, want ErrInvalidArgument naming the field", b, err)
		}
	}
	// Nothing of the refused calls was written: the claim is still open.
	if got := e.events(m, s); len(got) != 1 {
		t.Errorf("history after refused calls = %v", got)
	}
	// An over-long cause is truncated at a UTF-8 boundary, not refused.
	cause := strings.Repeat("é", maxCauseLength) // 2 bytes each
	if err := w.Fail(ctx, &testBackoff, cause+"\x00"); err != nil {
		t.Fatalf("Fail with a long cause: %v", err)
	}
	var stored string
	if err := e.db.QueryRow("SELECT failed_cause FROM work_history WHERE event = 'Failed'").Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if len(stored) != maxCauseLength || !utf8.ValidString(stored) || !strings.HasPrefix(cause, stored) {
		t.Errorf("stored cause is %d bytes, valid=%v", len(stored), utf8.ValidString(stored))
	}
	var backoffCause string
	if err := e.db.QueryRow("SELECT cause FROM work_backoff").Scan(&backoffCause); err != nil || backoffCause != stored {
		t.Errorf("backoff cause differs from history's")
	}
}

// Calls on a closed Connection fail with ErrConnectionClosed.
func TestClosedConnection(t *testing.T) {
	e := newEnv(t)
	c := e.open()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := c.StartSession(context.Background()); !errors.Is(err, ErrConnectionClosed) {
		t.Errorf("StartSession after Close = %v", err)
	}
	if _, err := c.CollectGarbage(context.Background()); !errors.Is(err, ErrConnectionClosed) {
		t.Errorf("CollectGarbage after Close = %v", err)
	}
}

// countingConnector counts the connections its pool opens.
type countingConnector struct {
	driver.Connector
	n atomic.Int64
}

func (c *countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c.n.Add(1)
	return c.Connector.Connect(ctx)
}

// Config.WrapConnector wraps the pool's connector: every connection of the
// Connection's pool is opened through it.
func TestWrapConnector(t *testing.T) {
	e := newEnv(t)
	var wrapped *countingConnector
	c := e.open(func(cfg *Config) {
		cfg.WrapConnector = func(inner driver.Connector) driver.Connector {
			wrapped = &countingConnector{Connector: inner}
			return wrapped
		}
	})
	s := e.session(c)
	if err := s.Transact(context.Background(), func(*Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if wrapped == nil || wrapped.n.Load() == 0 {
		t.Fatal("the pool did not connect through the wrapper")
	}
}
