package testdb

import (
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrNoServer is what a test that needs a database fails with when
// BMDB_TEST_DSN is not set and no PostgreSQL server is installed.
var ErrNoServer = errors.New("testdb: " + EnvDSN + " is not set and no PostgreSQL server is installed " +
	"(initdb and pg_ctl, in a directory on PATH or in " + debianBinDirs + "): install one (apt-get install postgresql on Debian) " +
	"or point " + EnvDSN + " at a PostgreSQL or CockroachDB server")

// debianBinDirs is where Debian's postgresql packages install the server,
// one directory per major version.
const debianBinDirs = "/usr/lib/postgresql/*/bin"

// serverScript makes, starts, watches and removes the server: see its
// opening comment.
//
//go:embed server.sh
var serverScript string

// server is the PostgreSQL a test binary started for itself because
// BMDB_TEST_DSN was not set. Its watchdog, a shell running serverScript,
// stops it and removes its directory once the binary closes lifeline or
// exits, however.
type server struct {
	dsn      string
	dir      string        // the cluster's directory, removed by the watchdog
	lifeline *os.File      // the pipe's only write end: closing it ends the server
	watchdog *exec.Cmd     // serverScript, started by start, waited for by stop
	took     time.Duration // from start to a server accepting connections
}

// The test binary's own server: started once, by the first test that
// needs a database, and stopped by Run.
var (
	ownOnce sync.Once
	own     *server
	ownErr  error
)

// findDSN returns BMDB_TEST_DSN if set, and otherwise the DSN of the test
// binary's own server, starting it on the first call.
func findDSN() (string, error) {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		return dsn, nil
	}
	ownOnce.Do(func() {
		var initdb, pgCtl string
		if initdb, pgCtl, ownErr = findBinaries(os.Getenv("PATH"), debianBinDirs); ownErr != nil {
			return
		}
		own, ownErr = start(initdb, pgCtl)
	})
	if ownErr != nil {
		return "", ownErr
	}
	return own.dsn, nil
}

// findBinaries returns the paths of initdb and pg_ctl: those of the first
// directory on path holding both, else those of the newest version among
// the directories matching glob holding both, else ErrNoServer.
func findBinaries(path, glob string) (initdb, pgCtl string, err error) {
	dirs, _ := filepath.Glob(glob)
	slices.SortFunc(dirs, func(a, b string) int { return majorVersion(b) - majorVersion(a) })
	for _, dir := range append(filepath.SplitList(path), dirs...) {
		if dir == "" {
			continue
		}
		initdb, pgCtl = filepath.Join(dir, "initdb"), filepath.Join(dir, "pg_ctl")
		if isExecutable(initdb) && isExecutable(pgCtl) {
			return initdb, pgCtl, nil
		}
	}
	return "", "", ErrNoServer
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// majorVersion is N of a .../N/bin directory (9 for 9.6), or -1.
func majorVersion(bindir string) int {
	v := filepath.Base(filepath.Dir(bindir))
	major, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(major)
	if err != nil {
		return -1
	}
	return n
}

// start runs the watchdog, which makes and starts the server, and waits
// for its report.
func start(initdb, pgCtl string) (*server, error) {
	begin := time.Now()
	cmd := exec.Command("sh")
	if err := detach(cmd); err != nil {
		return nil, err
	}
	ports, err := freePorts(5)
	if err != nil {
		return nil, fmt.Errorf("testdb: finding a free port for PostgreSQL: %w", err)
	}
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("testdb: %w", err)
	}
	reportR, reportW, err := os.Pipe()
	if err != nil {
		lifeR.Close()
		lifeW.Close()
		return nil, fmt.Errorf("testdb: %w", err)
	}
	cmd.Args = append([]string{"sh", "-c", serverScript, "server.sh", initdb, pgCtl}, ports...)
	// Files, not writers: exec starts no goroutine to copy them, and the
	// watchdog never holds the binary's stdout or stderr, which go test
	// would wait for it to close.
	cmd.Stdin, cmd.Stdout = lifeR, reportW
	err = cmd.Start()
	lifeR.Close()
	reportW.Close()
	if err != nil {
		lifeW.Close()
		reportR.Close()
		return nil, fmt.Errorf("testdb: starting PostgreSQL: %w", err)
	}
	report, err := io.ReadAll(reportR) // until the script closes its stdout
	reportR.Close()
	s := &server{lifeline: lifeW, watchdog: cmd}
	line, rest, _ := strings.Cut(string(report), "\n")
	fields := strings.SplitN(line, " ", 3)
	if err != nil || len(fields) != 3 || fields[0] != "ready" {
		s.stop()
		why := strings.TrimSpace(strings.TrimPrefix(line, "error: ") + "\n" + rest)
		if err != nil {
			why = err.Error()
		}
		return nil, fmt.Errorf("testdb: starting PostgreSQL (%s) for the tests, as %s is not set: %s", filepath.Dir(initdb), EnvDSN, why)
	}
	s.dsn = "postgres://postgres@127.0.0.1:" + fields[1] + "/postgres?sslmode=disable"
	s.dir = fields[2]
	s.took = time.Since(begin)
	return s, nil
}

// freePorts returns n ports of 127.0.0.1 that were free a moment ago.
func freePorts(n int) ([]string, error) {
	var ports []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	return ports, nil
}

// stop closes the lifeline and waits for the watchdog to stop the server
// and remove its directory. It is for Run: a binary that dies without
// calling it leaves the same work to the watchdog.
func (s *server) stop() error {
	if s == nil {
		return nil
	}
	s.lifeline.Close()
	if err := s.watchdog.Wait(); err != nil {
		return fmt.Errorf("testdb: stopping the tests' PostgreSQL: %w", err)
	}
	return nil
}
