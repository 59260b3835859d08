package tidemark

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"
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

// lockSink is a Sink with a checked source lock, of function fields.
type lockSink struct {
	mu         sync.Mutex
	checkpoint Position
	readErr    error // of Checkpoint, when set
	check      func() (bool, error)
}

func (s *lockSink) Apply(_ context.Context, b *Batch) (ApplyStats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !b.Checkpoint.IsZero() {
		s.checkpoint = b.Checkpoint
	}
	return ApplyStats{Inserted: len(b.Changes)}, nil
}

func (s *lockSink) Checkpoint(context.Context, string) (Position, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checkpoint, !s.checkpoint.IsZero(), s.readErr
}

func (s *lockSink) Close() error { return nil }

func (s *lockSink) TryLockSource(context.Context, string) (func(), bool, error) {
	return func() {}, true, nil
}

func (s *lockSink) CheckSourceLock(context.Context, string) (bool, error) { return s.check() }

// waitingSource sends nothing and waits for cancellation.
type waitingSource struct{}

func (waitingSource) Stream(ctx context.Context, _ Position, _ chan<- Chunk) error {
	<-ctx.Done()
	return nil
}

// TestRunReturnsLostSourceLock: when another session holds the source's
// lock, Run stops with ErrSourceLockLost, not nil (nemesis seed 294: the
// tailer logged "source lock lost" and exited 0, "stopped cleanly": the
// cause was set on a shadowed err).
func TestRunReturnsLostSourceLock(t *testing.T) {
	runLosingLock(t, waitingSource{}, 10*time.Millisecond)
}

// runLosingLock runs a pipeline of src whose sink's lock is held by
// another session, checked every interval, and requires Run to stop with
// ErrSourceLockLost.
func runLosingLock(t *testing.T, src Source, interval time.Duration) {
	t.Helper()
	sink := &lockSink{check: func() (bool, error) {
		return false, fmt.Errorf("check lock of source s: %w: another session holds it now", ErrSourceLockLost)
	}}
	p, err := NewPipeline(PipelineConfig{Source: "s", LockCheckInterval: interval}, src, nil, sink)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Run(ctx, Position{}); !errors.Is(err, ErrSourceLockLost) || ctx.Err() != nil {
		t.Fatalf("Run = %v (ctx %v), want ErrSourceLockLost", err, ctx.Err())
	}
}

// checkingSource calls the writer check Run hands it (WriterCheckable)
// once and reports its result, then waits for cancellation.
type checkingSource struct {
	check  func(context.Context) error
	result chan error
}

func (s *checkingSource) SetWriterCheck(check func(context.Context) error) { s.check = check }

func (s *checkingSource) Stream(ctx context.Context, _ Position, _ chan<- Chunk) error {
	if s.check == nil {
		s.result <- errors.New("Run handed the source no writer check")
	} else {
		s.result <- s.check(ctx)
	}
	<-ctx.Done()
	return nil
}

// TestWriterCheckFindsLostLock: the source asks (its server ended its
// stream for another client with its server_id: a standby that took the
// lock over) long before the periodic check would run; the check finds
// the lock held by another session, and Run stops with ErrSourceLockLost.
func TestWriterCheckFindsLostLock(t *testing.T) {
	src := &checkingSource{result: make(chan error, 1)}
	runLosingLock(t, src, time.Hour)
	if err := <-src.result; !errors.Is(err, ErrSourceLockLost) {
		t.Fatalf("the writer check said %v, want ErrSourceLockLost", err)
	}
}

// TestLockCheckProvesARetakenLock: a lock taken again is proven from the
// checkpoint before any check says the lock is held, also when the first
// proof could not read the checkpoint and the next check finds the lock
// held by its new session (it used to pass then, unproven); a checkpoint
// past this process's last commit is a lost lock.
func TestLockCheckProvesARetakenLock(t *testing.T) {
	retaken := true
	sink := &lockSink{check: func() (bool, error) { r := retaken; retaken = false; return r, nil }}
	p, err := NewPipeline(PipelineConfig{Source: "s"}, waitingSource{}, nil, sink)
	if err != nil {
		t.Fatal(err)
	}
	p.setLast(gtidPos(5))
	sink.checkpoint = gtidPos(5)
	var cause error
	l := &lockCheck{p: p, c: sink, lost: func(err error) { cause = err }}
	ctx := context.Background()
	sink.readErr = errors.New("connection refused")
	if err := l.writer(ctx); err == nil || errors.Is(err, ErrSourceLockLost) {
		t.Fatalf("retaken, checkpoint unreadable: %v, want an error that is not a lost lock", err)
	}
	if err := l.writer(ctx); err == nil {
		t.Fatal("held again, still unproven (checkpoint unreadable): nil, want an error")
	}
	sink.readErr = nil
	if err := l.writer(ctx); err != nil {
		t.Fatalf("held, proven: %v", err)
	}
	if err := l.writer(ctx); err != nil || sink.readErr != nil {
		t.Fatalf("held: %v", err)
	}
	retaken, sink.checkpoint = true, gtidPos(7)
	if err := l.writer(ctx); !errors.Is(err, ErrSourceLockLost) || !errors.Is(cause, ErrSourceLockLost) {
		t.Fatalf("retaken, checkpoint past the last commit: %v (cause %v), want ErrSourceLockLost", err, cause)
	}
}

func gtidPos(seq int) Position { return Position{GTID: fmt.Sprintf("0-1-%d", seq)} }
