//go:build !linux

package dbconn

import (
	"syscall"
	"time"
)

// userTimeoutControl does nothing where TCP_USER_TIMEOUT is not available:
// keepalives and bmdb's own cuts bound calls there.
func userTimeoutControl(time.Duration) func(network, address string, c syscall.RawConn) error {
	return nil
}
