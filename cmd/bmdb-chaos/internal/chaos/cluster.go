package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Cluster is a throwaway PostgreSQL cluster started by scripts/pg-start,
// which the harness may restart.
type Cluster struct {
	Dir     string // the cluster's directory (data in Dir/data)
	DSN     string // as printed by pg-start
	scripts string
	bindir  string
}

// PostgresBinDir returns the newest /usr/lib/postgresql/*/bin holding
// pg_ctl, or "" if there is none.
func PostgresBinDir() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionLess(dirs[i], dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "pg_ctl")); err == nil {
			return dirs[i]
		}
	}
	return ""
}

// versionLess orders /usr/lib/postgresql/N/bin paths by N.
func versionLess(a, b string) bool {
	va, vb := filepath.Base(filepath.Dir(a)), filepath.Base(filepath.Dir(b))
	if len(va) != len(vb) {
		return len(va) < len(vb)
	}
	return va < vb
}

// StartCluster runs repo/scripts/pg-start dir.
func StartCluster(ctx context.Context, repo, dir string) (*Cluster, error) {
	bindir := PostgresBinDir()
	if bindir == "" {
		return nil, fmt.Errorf("chaos: no PostgreSQL binaries in /usr/lib/postgresql/*/bin")
	}
	c := &Cluster{Dir: dir, scripts: filepath.Join(repo, "scripts"), bindir: bindir}
	out, err := run(ctx, filepath.Join(c.scripts, "pg-start"), dir)
	if err != nil {
		return nil, fmt.Errorf("chaos: pg-start: %w", err)
	}
	c.DSN = strings.TrimSpace(out)
	return c, nil
}

// Restart stops the server with a fast shutdown and starts it again with
// the same options (pg_ctl restart reuses postmaster.opts, hence the port).
func (c *Cluster) Restart(ctx context.Context) error {
	_, err := run(ctx, c.asPostgres(filepath.Join(c.bindir, "pg_ctl"),
		"-D", filepath.Join(c.Dir, "data"), "-l", filepath.Join(c.Dir, "server.log"),
		"-m", "fast", "-w", "-t", "60", "restart")...)
	if err != nil {
		return fmt.Errorf("chaos: restarting PostgreSQL: %w", err)
	}
	return nil
}

// Stop stops the cluster and removes its directory (scripts/pg-stop).
func (c *Cluster) Stop() error {
	_, err := run(context.Background(), filepath.Join(c.scripts, "pg-stop"), c.Dir)
	return err
}

// asPostgres prefixes argv with runuser when running as root, as pg-start
// does: PostgreSQL refuses to run as root.
func (c *Cluster) asPostgres(argv ...string) []string {
	if os.Getuid() == 0 {
		return append([]string{"runuser", "-u", "postgres", "--"}, argv...)
	}
	return argv
}

// run runs argv and returns its stdout; on failure the error carries
// stderr.
func run(ctx context.Context, argv ...string) (string, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 10 * time.Second // a daemon keeping our pipes open must not hang us
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
