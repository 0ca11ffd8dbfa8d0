package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/bmdb-dev/bmdb/web"
)

// operatorsEnv holds operator credentials for serve, as --operators' file
// does.
const operatorsEnv = "BMDB_OPERATORS"

// serveCommand serves the web pages until interrupted, read-only unless
// operator credentials are given (--operators FILE, or $BMDB_OPERATORS:
// NAME:TOKEN entries, see web.ParseOperators); --timeout bounds only
// connecting.
func serveCommand(fs *flag.FlagSet) runFunc {
	addr := fs.String("addr", "127.0.0.1:8080", "listen address (port 0: any free port)")
	opsFile := fs.String("operators", "", "file of operator credentials, NAME:TOKEN per line: signed-in operators get pause, resume, cap and clear-backoff buttons (default $"+operatorsEnv+"; none: read-only pages)")
	return func(ctx context.Context, c *common, args []string) error {
		if err := noArgs("serve", args); err != nil {
			return err
		}
		var opts web.Options
		creds, from := os.Getenv(operatorsEnv), "$"+operatorsEnv
		if *opsFile != "" {
			b, err := os.ReadFile(*opsFile)
			if err != nil {
				return usagef("--operators: %v", err)
			}
			creds, from = string(b), "--operators "+*opsFile
		}
		conn, err := c.open(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		if creds != "" {
			ops, err := web.ParseOperators(creds)
			if err != nil {
				return usagef("%s: %v", from, err)
			}
			opts.Actions = &web.Actions{Conn: conn, Operators: ops}
		}
		ln, err := net.Listen("tcp", *addr)
		if err != nil {
			return usagef("--addr: %v", err)
		}
		srv := &http.Server{Handler: web.New(conn.DB(), opts), ReadHeaderTimeout: 5 * time.Second}
		mode := "read-only"
		if opts.Actions != nil {
			mode = fmt.Sprintf("with actions for %d operators (sign in at /login)", len(opts.Actions.Operators))
		}
		fmt.Fprintf(c.out, "serving http://%s/ %s\n", ln.Addr(), mode)
		if f, ok := c.out.(interface{ Sync() error }); ok {
			_ = f.Sync()
		}
		stop, cancel := signal.NotifyContext(context.WithoutCancel(ctx), syscall.SIGINT, syscall.SIGTERM)
		defer cancel()
		go func() {
			<-stop.Done()
			shutdown, done := context.WithTimeout(context.Background(), 5*time.Second)
			defer done()
			_ = srv.Shutdown(shutdown)
		}()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}
