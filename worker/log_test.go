package worker

import (
	"bytes"
	"flag"
	"io"
	"os"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2"
)

// logTap is where klog writes once a test taps it: to standard error, as
// before, and to the buffers of the tests tapping it at the time.
type logTap struct {
	mu   sync.Mutex
	taps map[*logLines]bool
}

// logLines is what one test read from klog.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

var (
	klogTap     = &logTap{taps: map[*logLines]bool{}}
	klogTapOnce sync.Once
)

func (t *logTap) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for l := range t.taps {
		l.mu.Lock()
		l.buf.Write(p)
		l.mu.Unlock()
	}
	return os.Stderr.Write(p)
}

// tapKlog returns what klog writes from now until the test ends. Tests run
// in parallel: a test picks its own lines (by its process name).
func tapKlog(t *testing.T) *logLines {
	t.Helper()
	klogTapOnce.Do(func() {
		var flags flag.FlagSet
		klog.InitFlags(&flags)
		for k, v := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
			if err := flags.Set(k, v); err != nil {
				t.Fatal(err)
			}
		}
		// Every line goes to the INFO output (each severity's output
		// also gets the lines above it): once to the tap.
		klog.SetOutputBySeverity("INFO", klogTap)
		for _, s := range []string{"WARNING", "ERROR", "FATAL"} {
			klog.SetOutputBySeverity(s, io.Discard)
		}
	})
	l := &logLines{}
	klogTap.mu.Lock()
	klogTap.taps[l] = true
	klogTap.mu.Unlock()
	t.Cleanup(func() {
		klogTap.mu.Lock()
		delete(klogTap.taps, l)
		klogTap.mu.Unlock()
	})
	return l
}

// with returns the lines logged so far that contain every one of words.
func (l *logLines) with(words ...string) []string {
	klog.Flush()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
next:
	for _, line := range strings.Split(l.buf.String(), "\n") {
		for _, w := range words {
			if !strings.Contains(line, w) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}
