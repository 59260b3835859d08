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
	readErr    error          // of Checkpoint, when set
	apply      func(b *Batch) // called inside Apply after the commit, when set
	check      func() (bool, error)
}

func (s *lockSink) Apply(_ context.Context, b *Batch) (ApplyStats, error) {
	s.store(b.Checkpoint)
	if s.apply != nil {
		s.apply(b)
	}
	return ApplyStats{Inserted: len(b.Changes)}, nil
}

// store commits cp (when not zero) as the checkpoint.
func (s *lockSink) store(cp Position) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !cp.IsZero() {
		s.checkpoint = cp
	}
}

func (s *lockSink) ApplyDDL(_ context.Context, _ string, _ []DDLEvent, cp Position) error {
	s.store(cp)
	return nil
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

// committedAt5 is a pipeline whose last commit is checkpoint 5, stored in
// its sink.
func committedAt5(t *testing.T) (*Pipeline, *lockSink) {
	t.Helper()
	sink := &lockSink{checkpoint: gtidPos(5)}
	p, err := NewPipeline(PipelineConfig{Source: "s"}, waitingSource{}, nil, sink)
	if err != nil {
		t.Fatal(err)
	}
	p.setLast(gtidPos(5))
	return p, sink
}

// TestLockRetakenDuringOwnCommit: the lock's session ends and the lock is
// taken again while this process's own commit is under way: its
// checkpoint is stored, Apply has not returned (nemesis seed 294: the
// check said "the stored checkpoint … is past this process's last commit:
// another process wrote while the lock was free" though no other process
// ran, and the tailer stopped). The stored checkpoint is this process's
// own; one past it is another process's.
func TestLockRetakenDuringOwnCommit(t *testing.T) {
	ctx := context.Background()
	p, sink := committedAt5(t)
	var during error
	sink.apply = func(*Batch) { during = p.provenSoleWriter(ctx) }
	tbl := &Table{ID: TableID{Database: "d", Name: "t"}, Columns: []Column{{Name: "id", Kind: KindInt}}, Key: []int{0}}
	b := &Batch{Source: "s", Checkpoint: gtidPos(6), Changes: []Change{{Op: OpInsert, Table: tbl, After: []any{int64(1)}, Version: Version{Seq: 6, Index: 1}}}}
	if err := p.applyBatch(ctx, b); err != nil {
		t.Fatal(err)
	}
	if during != nil {
		t.Fatalf("lock taken again during the commit of checkpoint 6: %v; want it proven (the stored checkpoint is this process's own)", during)
	}
	if _, last := p.Totals(); last != gtidPos(6) {
		t.Fatalf("last commit %s, want %s", last, gtidPos(6))
	}
	sink.apply, sink.checkpoint = nil, gtidPos(7)
	if err := p.provenSoleWriter(ctx); !errors.Is(err, ErrSourceLockLost) {
		t.Fatalf("stored checkpoint 7 past the last commit 6: %v, want ErrSourceLockLost", err)
	}
}

// TestLockRetakenAfterDDLCommit: a DDL statement's checkpoint commits,
// then the backfill it needs runs (long) before the stream goes on; the
// lock is taken again meanwhile (nemesis seed 294: "the tables stay
// behind, a backfill never applied"). The DDL's checkpoint is the last
// commit from its commit on.
func TestLockRetakenAfterDDLCommit(t *testing.T) {
	ctx := context.Background()
	p, sink := committedAt5(t)
	committed, err := p.applyDDL(ctx, []DDLEvent{{Op: DDLTruncate, Table: TableID{Database: "d", Name: "t"}}}, gtidPos(6))
	if err != nil || !committed {
		t.Fatalf("applyDDL: committed %v, %v", committed, err)
	}
	if err := p.provenSoleWriter(ctx); err != nil || sink.checkpoint != gtidPos(6) {
		t.Fatalf("lock taken again after the DDL's checkpoint 6 committed (stored %s): %v; want it proven", sink.checkpoint, err)
	}
}

// TestLockRetakenDuringCatchUp: while a catch-up runs, a stored
// checkpoint past the last commit may be the one it stored: not proven
// (checked again), not lost; once it returned, its checkpoint is the last
// commit.
func TestLockRetakenDuringCatchUp(t *testing.T) {
	ctx := context.Background()
	sink := &lockSink{}
	var p *Pipeline
	var during error
	cfg := PipelineConfig{Source: "s", CatchUp: func(context.Context) (Position, error) {
		sink.store(gtidPos(9))
		during = p.provenSoleWriter(ctx)
		return gtidPos(9), nil
	}}
	p, err := NewPipeline(cfg, waitingSource{}, nil, sink)
	if err != nil {
		t.Fatal(err)
	}
	p.setLast(gtidPos(5))
	if _, err := p.catchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if during == nil || errors.Is(during, ErrSourceLockLost) {
		t.Fatalf("during the catch-up: %v, want not proven and not lost", during)
	}
	if err := p.provenSoleWriter(ctx); err != nil {
		t.Fatalf("after the catch-up stored checkpoint 9: %v; want it proven", err)
	}
}
