//go:build unix

package testdb

import (
	"os/exec"
	"syscall"
)

// detach makes cmd, the watchdog, run in a session of its own, so that a
// Ctrl-C on the terminal ends the test binary (whose exit ends the
// server) and not the watchdog before it has cleaned up.
func detach(cmd *exec.Cmd) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return nil
}
