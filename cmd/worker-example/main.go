// Command worker-example runs a small bare-metal fleet pipeline on bmdb:
// three components, each a worker.Loop with its own session, move machines
// through provide -> start agent -> install OS. Work is simulated with a
// configurable duration and failure rate, so claims, conflicts, backoff and
// history all show. It seeds machines and runs the three stages together
// with worker.RunAll, printing progress once a second, until every stage
// is idle at once with nothing left; then it prints a summary read from
// work_history. It exits 1, saying what was left per stage, if machines
// were still in backoff (or claimed by another copy) after the drain.
//
//	worker-example --dsn postgres://... --machines 200
//
// The DSN may also come from BMDB_DSN. make demo starts a throwaway
// PostgreSQL and runs this against it. The log (klog's lines: migrations,
// warnings) goes to --log-file, $TMPDIR/worker-example.log by default,
// not between the progress lines; errors go to standard error as well.
//
// --trace stdout prints bmdb's and the loops' OpenTelemetry spans (see
// "Tracing" in package bmdb's doc) to standard output, among the progress
// lines, each as one line of JSON (OpenTelemetry's stdouttrace exporter),
// all of them flushed before the command exits; --trace none, the
// default, traces nothing.
package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/cmd/worker-example/pipeline"
	"github.com/bmdb-dev/bmdb/cmd/worker-example/pipeline/pipelinedb"
	"github.com/bmdb-dev/bmdb/model"
	"github.com/bmdb-dev/bmdb/web"
	"github.com/bmdb-dev/bmdb/worker"
)

type options struct {
	dsn          string
	machines     int
	concurrency  int
	workDuration time.Duration
	failureRate  float64
	interval     time.Duration
	timeout      time.Duration
	backoff      bmdb.Backoff
	metricsAddr  string
	httpAddr     string
	keepServing  bool
	logFile      string // where klog writes ("": standard error)
	trace        string // where spans go: "none" or "stdout"
}

func main() {
	var o options
	klogFlags := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(klogFlags)
	flag.StringVar(&o.dsn, "dsn", "", "database DSN (default $BMDB_DSN)")
	flag.IntVar(&o.machines, "machines", 200, "number of new machines to seed (0: use the machines already there)")
	flag.IntVar(&o.concurrency, "concurrency", 8, "machines each stage works on at once (claimed together, finished together)")
	flag.DurationVar(&o.workDuration, "work-duration", 40*time.Millisecond, "mean simulated duration of one stage's work on one machine")
	flag.Float64Var(&o.failureRate, "failure-rate", 0.1, "probability that one attempt of a stage fails (and backs off)")
	flag.DurationVar(&o.interval, "session-interval", 2*time.Second, "bmdb session interval")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up if the pipeline has not completed by then")
	flag.DurationVar(&o.backoff.Initial, "backoff-initial", 100*time.Millisecond, "first backoff after a failure")
	flag.DurationVar(&o.backoff.Maximum, "backoff-max", 2*time.Second, "longest backoff")
	flag.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on this address, e.g. 127.0.0.1:9100 (default: off)")
	flag.StringVar(&o.httpAddr, "http-addr", "", "serve the fleet web pages (and /metrics) on this address, e.g. 127.0.0.1:8080; port 0 picks one (default: off)")
	flag.BoolVar(&o.keepServing, "keep-serving", false, "after the pipeline completes, keep serving the fleet pages (--http-addr) until interrupted (Ctrl-C)")
	flag.StringVar(&o.logFile, "log-file", filepath.Join(os.TempDir(), "worker-example.log"),
		"write the log (klog's lines) to this file, rewritten on each run, so that they do not interleave with the progress; - for standard error")
	flag.StringVar(&o.trace, "trace", "none", "print OpenTelemetry spans: stdout (one JSON line per span, among the progress lines) or none")
	addLoggingFlags(flag.CommandLine, klogFlags)
	flag.Parse()
	if err := logTo(klogFlags, &o.logFile); err != nil {
		fmt.Fprintln(os.Stderr, "worker-example:", err)
		os.Exit(2)
	}
	if o.dsn == "" {
		o.dsn = os.Getenv("BMDB_DSN") // not the flag's default: --help would print its password
	}
	o.backoff.Exponent, o.backoff.Jitter = 2, 0.2

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "worker-example:", err)
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

// addLoggingFlags makes klog's flags parse as the command's own, but lists
// them after the command's in --help, under a heading of their own.
func addLoggingFlags(cmd, logging *flag.FlagSet) {
	own := flag.NewFlagSet(cmd.Name(), flag.ExitOnError)
	cmd.VisitAll(func(f *flag.Flag) { own.Var(f.Value, f.Name, f.Usage) })
	logging.VisitAll(func(f *flag.Flag) { cmd.Var(f.Value, f.Name, f.Usage) })
	cmd.Usage = func() {
		out := cmd.Output()
		fmt.Fprintf(out, "Usage of %s:\n", filepath.Base(cmd.Name()))
		own.SetOutput(out)
		own.PrintDefaults()
		fmt.Fprintf(out, "\nLogging flags (klog):\n")
		logging.SetOutput(out)
		logging.PrintDefaults()
	}
}

// logTo sends klog's lines to the file *path instead of standard error,
// where they would interleave with the progress lines: errors go to both.
// It leaves klog as it is, and sets *path to "", if *path is "-" or if
// the command line set klog's own destination flags.
func logTo(klogFlags *flag.FlagSet, path *string) error {
	own := false
	flag.Visit(func(f *flag.Flag) {
		own = own || f.Name == "logtostderr" || f.Name == "log_file" || f.Name == "log_dir" || f.Name == "alsologtostderr"
	})
	if *path == "-" || own {
		*path = ""
		return nil
	}
	// klog appends to the file: start it anew.
	if err := os.Remove(*path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("--log-file: %w", err)
	}
	for name, value := range map[string]string{"logtostderr": "false", "log_file": *path} {
		if err := klogFlags.Set(name, value); err != nil {
			return fmt.Errorf("--log-file: %w", err)
		}
	}
	return nil
}

func (o options) validate() error {
	switch {
	case o.dsn == "":
		return errors.New("no database: pass --dsn or set BMDB_DSN (make demo starts one)")
	case o.machines < 0:
		return fmt.Errorf("--machines is %d, must not be negative", o.machines)
	case o.concurrency < 1 || o.concurrency > bmdb.MaxWorkMany:
		return fmt.Errorf("--concurrency is %d, must be in [1, %d]", o.concurrency, bmdb.MaxWorkMany)
	case o.workDuration < 0:
		return fmt.Errorf("--work-duration is %v, must not be negative", o.workDuration)
	case !(o.failureRate >= 0 && o.failureRate < 1):
		return fmt.Errorf("--failure-rate is %v, must be in [0, 1)", o.failureRate)
	case o.keepServing && o.httpAddr == "":
		return errors.New("--keep-serving needs --http-addr: there are no fleet pages to keep serving")
	case o.timeout <= 0:
		return fmt.Errorf("--timeout is %v, must be positive", o.timeout)
	case o.trace != "" && o.trace != "none" && o.trace != "stdout":
		return fmt.Errorf("--trace is %q, must be stdout or none", o.trace)
	}
	return o.backoff.Validate()
}

func run(ctx context.Context, o options) error {
	if err := o.validate(); err != nil {
		return err
	}
	serveCtx := ctx // --keep-serving: until interrupted, not bounded by --timeout
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	// The fleet pages' URL is the first line the demo prints: listen before
	// anything else (opening bmdb logs its migrations), serve once open.
	pages, err := listen(o.httpAddr, "fleet pages")
	if err != nil {
		return err
	}
	if pages != nil {
		defer pages.Close()
	}
	if o.logFile != "" {
		fmt.Printf("the log goes to %s\n", o.logFile)
	}

	reg := prometheus.NewRegistry()
	metrics, err := bmdb.NewMetrics(reg)
	if err != nil {
		return err
	}
	stopMetrics, err := serve(o.metricsAddr, "metrics", func(mux *http.ServeMux) {
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	})
	if err != nil {
		return err
	}
	defer stopMetrics()

	tp, stopTracing, err := tracerProvider(o.trace)
	if err != nil {
		return err
	}
	defer stopTracing()
	if tp != nil {
		// The run's span: the loops' spans are its children.
		var span trace.Span
		ctx, span = tp.Tracer("worker-example").Start(ctx, "worker-example")
		defer span.End()
	}

	var conns []*bmdb.Connection
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var loops []*worker.Loop
	for _, st := range pipeline.Stages {
		conn, err := bmdb.Open(ctx, bmdb.Config{
			DSN: o.dsn, ComponentName: st.Component,
			SessionInterval: o.interval, Metrics: metrics, TracerProvider: tp,
			Application: pipeline.Application(),
		})
		if err != nil {
			return err
		}
		conns = append(conns, conn)
		l, err := worker.New(conn, worker.Config{
			Process:       st.Process,
			Concurrency:   o.concurrency,
			Backoff:       o.backoff,
			PollMin:       20 * time.Millisecond,
			PollMax:       500 * time.Millisecond,
			ShutdownGrace: 5 * time.Second,
			// A batch: the stages stop together once all are idle at
			// once, waiting for backoffs to end first (RunAll).
			StopWhenIdle: time.Second,
			DrainTimeout: max(30*time.Second, 3*o.backoff.Maximum),
			Retrieve:     st.Retrieve,
			Work:         simulate(st, o),
		})
		if err != nil {
			return err
		}
		loops = append(loops, l)
	}
	if err := seed(ctx, conns[0], o.machines); err != nil {
		return err
	}
	db := conns[0].DB()
	stopWeb := serveOn(pages, func(mux *http.ServeMux) {
		mux.Handle("/", web.New(conns[0].DB(), web.Options{}))
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	})
	defer stopWeb()

	start := time.Now()
	ran := make(chan error, 1)
	go func() { ran <- worker.RunAll(ctx, loops...) }()
	c, err := watch(context.WithoutCancel(ctx), db, loops, start, ran)
	switch {
	case err != nil:
		return err
	case ctx.Err() != nil:
		return fmt.Errorf("pipeline incomplete (%d of %d machines through every stage): %w", c.OsInstalled, c.Machines, context.Cause(ctx))
	case c.OsInstalled != c.Machines:
		// RunAll returned nil: nothing was left that the stages could do.
		return fmt.Errorf("pipeline incomplete: only %d of %d machines passed every stage, and no stage has any left to do", c.OsInstalled, c.Machines)
	}
	fmt.Printf("\nall %d machines passed every stage in %.1fs\n\n", c.Machines, time.Since(start).Seconds())
	if err := summary(context.WithoutCancel(ctx), model.New(db)); err != nil {
		return err
	}
	switch {
	case o.keepServing:
		fmt.Println("\nthe fleet pages stay up until you interrupt (Ctrl-C); the database too, for bmdbctl:")
		fmt.Printf("  export BMDB_DSN='%s'\n", printableDSN(o.dsn))
		<-serveCtx.Done()
	case o.httpAddr != "":
		fmt.Println("\nthe fleet pages stop now; --keep-serving (make demo KEEP=1) keeps them up after the run")
	}
	return nil
}

// tracerProvider returns the TracerProvider of --trace (nil for none) and
// a function that flushes its spans and shuts it down.
func tracerProvider(dest string) (trace.TracerProvider, func(), error) {
	if dest != "stdout" {
		return nil, func() {}, nil
	}
	exporter, err := stdouttrace.New(stdouttrace.WithWriter(os.Stdout))
	if err != nil {
		return nil, nil, fmt.Errorf("--trace stdout: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter))
	return tp, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "worker-example: flushing spans:", err)
		}
	}, nil
}

// serve starts an HTTP server on addr ("": none) with the routes that
// routes adds, and returns a function that stops it.
func serve(addr, what string, routes func(*http.ServeMux)) (func(), error) {
	ln, err := listen(addr, what)
	if err != nil {
		return nil, err
	}
	return serveOn(ln, routes), nil
}

// listen listens on addr ("": nil, no listener) and prints the URL of what
// it is for.
func listen(addr, what string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serving %s: %w", what, err)
	}
	fmt.Printf("%s on http://%s/\n", what, ln.Addr())
	return ln, nil
}

// serveOn serves the routes that routes adds on ln (nil: nothing), and
// returns a function that stops it.
func serveOn(ln net.Listener, routes func(*http.ServeMux)) func() {
	if ln == nil {
		return func() {}
	}
	mux := http.NewServeMux()
	routes(mux)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return func() { srv.Close() }
}

// keyValuePassword is the password of a key=value DSN.
var keyValuePassword = regexp.MustCompile(`(password=)('(?:[^'\\]|\\.)*'|\S+)`)

// printableDSN is dsn with its password, if any, masked: the demo prints
// it for the user to paste.
func printableDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		return keyValuePassword.ReplaceAllString(dsn, "${1}xxxxx")
	}
	if u.User == nil {
		return dsn
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// seed inserts n machines, in transactions of a session of up to
// bmdb.MaxCreateMachines each.
func seed(ctx context.Context, conn *bmdb.Connection, n int) error {
	if n > 0 {
		sess, err := conn.StartSession(ctx)
		if err != nil {
			return err
		}
		defer sess.Close(context.WithoutCancel(ctx))
		for done := 0; done < n; done += bmdb.MaxCreateMachines {
			err = sess.Transact(ctx, func(tx *bmdb.Tx) error {
				_, err := tx.CreateMachines(ctx, min(n-done, bmdb.MaxCreateMachines))
				return err
			})
			if err != nil {
				return fmt.Errorf("seeding %d machines: %w", n, err)
			}
		}
	}
	fmt.Printf("seeded %d machines; stages: provide -> start-agent -> install-os\n", n)
	return nil
}

// simulate returns the Work function of a stage: it sleeps about
// workDuration and fails with probability failureRate.
func simulate(st pipeline.Stage, o options) worker.Handler {
	return func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
		d := o.workDuration/2 + rand.N(o.workDuration+1)
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if rand.Float64() < o.failureRate {
			return nil, fmt.Errorf("simulated %s failure on %s", st.Process, w.Machine())
		}
		return func(tx *bmdb.Tx) error { return st.Commit(ctx, tx, w.Machine()) }, nil
	}
}

// watch prints progress every second until the loops' RunAll returns
// its error on ran, then once more, and returns the last progress and
// RunAll's error (or, after it, the last progress read's). A progress
// read that fails is printed, not fatal: the loops run on.
func watch(ctx context.Context, db *sql.DB, loops []*worker.Loop, start time.Time, ran <-chan error) (pipelinedb.MachineStageCountsRow, error) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var runErr error
	for stopped := false; ; {
		c, err := pipeline.Progress(ctx, db)
		if err != nil {
			err = fmt.Errorf("reading progress: %w", err)
			fmt.Printf("%5.1fs  %v\n", time.Since(start).Seconds(), err)
		} else {
			var failed int64
			for _, l := range loops {
				failed += l.Stats().Failed
			}
			fmt.Printf("%5.1fs  done (of %d): provided %d  agent-started %d  os-installed %d  |  now: in-flight %d  backed-off %d  |  failures so far %d\n",
				time.Since(start).Seconds(), c.Machines, c.Provided, c.AgentStarted, c.OsInstalled, c.InFlight, c.BackedOff, failed)
		}
		if stopped {
			return c, cmp.Or(runErr, err)
		}
		select {
		case runErr = <-ran:
			stopped = true
		case <-tick.C:
		}
	}
}

// summary prints work_history's events per process and event.
func summary(ctx context.Context, q *model.Queries) error {
	rows, err := q.WorkHistorySummary(ctx)
	if err != nil {
		return fmt.Errorf("reading history: %w", err)
	}
	events := []model.WorkHistoryEvent{
		model.WorkHistoryEventStarted, model.WorkHistoryEventFinished, model.WorkHistoryEventFailed,
		model.WorkHistoryEventCanceled, model.WorkHistoryEventAbandoned,
	}
	counts := map[string]map[model.WorkHistoryEvent]int64{}
	for _, r := range rows {
		if counts[r.Process] == nil {
			counts[r.Process] = map[model.WorkHistoryEvent]int64{}
		}
		counts[r.Process][r.Event] = r.Events
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := []string{"process"}
	for _, e := range events {
		header = append(header, string(e))
	}
	fmt.Fprintln(tw, strings.Join(header, "\t")+"\t")
	for _, st := range pipeline.Stages {
		line := []string{st.Process}
		for _, e := range events {
			line = append(line, fmt.Sprint(counts[st.Process][e]))
		}
		fmt.Fprintln(tw, strings.Join(line, "\t")+"\t")
	}
	fmt.Println("work_history:")
	return tw.Flush()
}
