//go:build !unix

package testdb

import (
	"fmt"
	"os/exec"
)

// detach fails: the watchdog is a POSIX shell script.
func detach(*exec.Cmd) error {
	return fmt.Errorf("testdb: %s is not set, and the tests start a PostgreSQL of their own only on Unix systems: set it", EnvDSN)
}
