// Package wait holds the context-aware sleep that bmdb, the worker loop and
// the chaos harness share.
package wait

import (
	"context"
	"time"
)

// Sleep waits for d or until ctx is done, whichever comes first, and then
// returns ctx's cause (context.Cause), if any.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
