package chaos

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/bmdb-dev/bmdb/internal/testing/netproxy"
)

// Args returns the command-line flags that ParseWorkerFlags turns back into c.
func (c WorkerConfig) Args() []string {
	return []string{
		"--dsn", c.DSN, "--id", strconv.Itoa(c.ID), "--seed", strconv.FormatUint(c.Seed, 10),
		"--interval", c.Interval.String(), "--gc-period", c.GCPeriod.String(),
		"--concurrency", strconv.Itoa(c.Concurrency), "--connections", strconv.Itoa(c.Connections),
		"--work-min", c.WorkMin.String(), "--work-max", c.WorkMax.String(),
		"--serializable=" + strconv.FormatBool(c.Serializable), "--max-clock-offset", c.MaxClockOffset.String(),
		"--history", c.History,
	}
}

// ParseWorkerFlags parses the flags of worker mode (see WorkerConfig.Args).
func ParseWorkerFlags(args []string) (WorkerConfig, error) {
	var c WorkerConfig
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.StringVar(&c.DSN, "dsn", "", "database DSN")
	fs.IntVar(&c.ID, "id", 0, "worker number")
	fs.Uint64Var(&c.Seed, "seed", 1, "seed of the work durations")
	fs.DurationVar(&c.Interval, "interval", time.Second, "bmdb session interval")
	fs.DurationVar(&c.GCPeriod, "gc-period", time.Second, "bmdb GC period")
	fs.IntVar(&c.Concurrency, "concurrency", 2, "handlers per loop")
	fs.IntVar(&c.Connections, "connections", 1, "bmdb Connections, each with a loop of its own")
	fs.DurationVar(&c.WorkMin, "work-min", 200*time.Millisecond, "shortest simulated work")
	fs.DurationVar(&c.WorkMax, "work-max", 800*time.Millisecond, "longest simulated work")
	fs.BoolVar(&c.Serializable, "serializable", false, "SERIALIZABLE batches (bmdb.Config.SerializableBatches)")
	fs.DurationVar(&c.MaxClockOffset, "max-clock-offset", 0, "bmdb.Config.MaxClockOffset (0: bmdb's default)")
	fs.StringVar(&c.History, "history", "", "the history file the worker appends its operations to")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case c.DSN == "" || c.History == "":
		return c, fmt.Errorf("worker: --dsn and --history are required")
	case c.Concurrency < 1:
		return c, fmt.Errorf("worker: --concurrency must be positive")
	case c.Connections < 1:
		return c, fmt.Errorf("worker: --connections must be positive")
	case c.WorkMin < 0 || c.WorkMax < c.WorkMin:
		return c, fmt.Errorf("worker: need 0 <= --work-min <= --work-max")
	}
	return c, nil
}

// fleet runs the worker processes: the harness binary re-executed in
// worker mode, one log file per worker (appended to across restarts).
type fleet struct {
	argv   []string // command prefix, e.g. {exe, "worker"}
	logDir string

	mu         sync.Mutex
	procs      []*proc
	unexpected []string // unexpected exits, violations
}

// proc is one worker slot; its process changes on restart.
type proc struct {
	cfg     WorkerConfig
	appName string // application_name of its connections
	proxy   *netproxy.Proxy
	logPath string
	log     *os.File // the harness's handle, for markers

	cmd      *exec.Cmd
	exited   chan struct{}
	expected bool // the harness is stopping or killing it
	starts   int
}

// mark appends a harness line to w's log, between the worker's own lines.
func (w *proc) mark(format string, args ...any) {
	fmt.Fprintf(w.log, "chaos-harness: %s %s\n", time.Now().Format("15:04:05.000000"), fmt.Sprintf(format, args...))
}

// start starts w's process.
func (f *fleet) start(w *proc) error {
	cfg := w.cfg
	cfg.Seed = cfg.Seed*1000 + uint64(w.starts)
	cmd := exec.Command(f.argv[0], append(append([]string{}, f.argv[1:]...), cfg.Args()...)...)
	cmd.Stdout, cmd.Stderr = w.log, w.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	w.starts++
	w.mark("start #%d", w.starts)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("chaos: starting worker %d: %w", cfg.ID, err)
	}
	exited := make(chan struct{})
	f.mu.Lock()
	w.cmd, w.exited, w.expected = cmd, exited, false
	f.mu.Unlock()
	go func() {
		err := cmd.Wait()
		f.mu.Lock()
		if !w.expected {
			f.unexpected = append(f.unexpected, fmt.Sprintf("worker %d (pid %d) exited unexpectedly: %v (log %s)", cfg.ID, cmd.Process.Pid, err, w.logPath))
		}
		f.mu.Unlock()
		w.mark("exited: %v", err)
		close(exited)
	}()
	return nil
}

// add creates worker slot cfg.ID and starts it.
func (f *fleet) add(cfg WorkerConfig, appName string, proxy *netproxy.Proxy) error {
	path := filepath.Join(f.logDir, fmt.Sprintf("worker-%d.log", cfg.ID))
	log, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	w := &proc{cfg: cfg, appName: appName, proxy: proxy, logPath: path, log: log}
	f.procs = append(f.procs, w)
	return f.start(w)
}

// signal sends sig to w's current process.
func (f *fleet) signal(w *proc, sig syscall.Signal) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		w.expected = true
	}
	return w.cmd.Process.Signal(sig)
}

// kill kills w's process with SIGKILL and waits for it to exit.
func (f *fleet) kill(w *proc) error {
	if err := f.signal(w, syscall.SIGKILL); err != nil {
		return err
	}
	<-w.exited
	return nil
}

// stopAll asks every worker to shut down (SIGTERM) and waits up to grace;
// workers still running then are killed, and named in the returned list.
func (f *fleet) stopAll(grace time.Duration) []string {
	for _, w := range f.procs {
		_ = f.signal(w, syscall.SIGCONT)
		_ = f.signal(w, syscall.SIGTERM)
	}
	var stuck []string
	deadline := time.Now().Add(grace)
	for _, w := range f.procs {
		select {
		case <-w.exited:
		case <-time.After(time.Until(deadline)):
			stuck = append(stuck, fmt.Sprintf("worker %d did not shut down within %v of SIGTERM (log %s)", w.cfg.ID, grace, w.logPath))
			_ = f.kill(w)
		}
	}
	for _, w := range f.procs {
		w.log.Close()
	}
	return stuck
}

// unexpectedExits returns the workers' unexpected exits so far.
func (f *fleet) unexpectedExits() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.unexpected...)
}
