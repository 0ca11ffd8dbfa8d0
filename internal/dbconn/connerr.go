package dbconn

import (
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
)

// IsConnectionError reports whether err says the connection to the
// database failed (as opposed to the database refusing a statement): then
// the server has rolled back whatever transaction was open on it.
func IsConnectionError(err error) bool {
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var netErr *net.OpError
	if errors.As(err, &netErr) {
		return true
	}
	code := SQLState(err)
	return strings.HasPrefix(code, "08") || // connection exception
		code == "57P01" || code == "57P02" || code == "57P03" // admin/crash shutdown, cannot connect now
}
