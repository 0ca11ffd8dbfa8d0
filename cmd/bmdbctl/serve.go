package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/bmdb-dev/bmdb/web"
)

// serveCommand serves the read-only web pages until interrupted; --timeout
// bounds only connecting.
func serveCommand(fs *flag.FlagSet) runFunc {
	addr := fs.String("addr", "127.0.0.1:8080", "listen address (port 0: any free port)")
	return func(ctx context.Context, c *common, args []string) error {
		if err := noArgs("serve", args); err != nil {
			return err
		}
		conn, err := c.open(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		ln, err := net.Listen("tcp", *addr)
		if err != nil {
			return usagef("--addr: %v", err)
		}
		srv := &http.Server{Handler: web.New(conn.DB(), web.Options{}), ReadHeaderTimeout: 5 * time.Second}
		fmt.Fprintf(c.out, "serving http://%s/\n", ln.Addr())
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
