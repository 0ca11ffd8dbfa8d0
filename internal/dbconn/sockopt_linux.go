package dbconn

import (
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// userTimeoutControl sets TCP_USER_TIMEOUT on TCP sockets: the kernel
// closes a connection whose sent data stays unacknowledged (or whose
// keepalive probes go unanswered) for longer than timeout.
func userTimeoutControl(timeout time.Duration) func(network, address string, c syscall.RawConn) error {
	ms := int(max(timeout.Milliseconds(), 1))
	return func(network, _ string, c syscall.RawConn) error {
		if !strings.HasPrefix(network, "tcp") {
			return nil
		}
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, ms)
		})
		if err != nil {
			return err
		}
		return serr
	}
}
