package tidemark

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
)

// locker is a SourceLocker of function fields.
type locker struct {
	try func() (func(), bool, error)
}

func (l locker) TryLockSource(context.Context, string) (func(), bool, error) { return l.try() }

// TestLockSourceRetriesFailedAttempts: a lock attempt that fails (the
// target restarting: "unexpected EOF") is tried again instead of stopping
// the daemon at start; a lock held by another process is waited for.
func TestLockSourceRetriesFailedAttempts(t *testing.T) {
	calls := 0
	l := locker{try: func() (func(), bool, error) {
		calls++
		switch calls {
		case 1, 2:
			return nil, false, errors.New("unexpected EOF")
		case 3:
			return nil, false, nil // held by another process
		}
		return func() {}, true, nil
	}}
	p := &Pipeline{cfg: PipelineConfig{Source: "s", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}}
	release, err := p.lockSource(context.Background(), l)
	if err != nil || release == nil {
		t.Fatalf("lockSource = %v, %v after %d attempts; want the lock", release != nil, err, calls)
	}
	if calls != 4 {
		t.Fatalf("%d attempts, want 4", calls)
	}
}
