package tidemark_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"tidemark"
)

// fakeSource and fakeSink are structs of function fields (house style).
type fakeSource struct {
	stream func(ctx context.Context, from tidemark.Position, out chan<- tidemark.Chunk) error
}

func (f *fakeSource) Stream(ctx context.Context, from tidemark.Position, out chan<- tidemark.Chunk) error {
	return f.stream(ctx, from, out)
}

type fakeSink struct {
	mu         sync.Mutex
	batches    []tidemark.Batch
	checkpoint tidemark.Position
	apply      func(b *tidemark.Batch) (tidemark.ApplyStats, error)
}

func (f *fakeSink) Apply(ctx context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.apply != nil {
		s, err := f.apply(b)
		if err != nil {
			return s, err
		}
	}
	f.batches = append(f.batches, *b)
	if !b.Checkpoint.IsZero() {
		f.checkpoint = b.Checkpoint
	}
	return tidemark.ApplyStats{Inserted: len(b.Changes)}, nil
}

func (f *fakeSink) Checkpoint(ctx context.Context, source string) (tidemark.Position, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.checkpoint, !f.checkpoint.IsZero(), nil
}

func (f *fakeSink) Close() error { return nil }

var testTable = &tidemark.Table{ID: tidemark.TableID{Database: "d", Name: "t"}, Columns: []tidemark.Column{{Name: "id", Kind: tidemark.KindInt}}, Key: []int{0}}

func changes(seq uint64, n int) []tidemark.Change {
	out := make([]tidemark.Change, n)
	for i := range out {
		out[i] = tidemark.Change{Op: tidemark.OpInsert, Table: testTable, After: []any{int64(i)}, Version: tidemark.Version{Seq: seq, Index: uint32(i + 1)}, Size: 100}
	}
	return out
}

func pos(seq int) tidemark.Position {
	return tidemark.Position{GTID: "0-1-" + strconv.Itoa(seq)}
}

// sourceOf sends chunks then waits for cancellation.
func sourceOf(chunks ...tidemark.Chunk) *fakeSource {
	return &fakeSource{stream: func(ctx context.Context, from tidemark.Position, out chan<- tidemark.Chunk) error {
		for _, c := range chunks {
			out <- c // the pipeline drains the channel even after cancellation
		}
		<-ctx.Done()
		return nil
	}}
}

func runUntil(t *testing.T, p *tidemark.Pipeline, sink *fakeSink, done func() bool) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx, tidemark.Position{}) }()
	deadline := time.After(10 * time.Second)
	for {
		sink.mu.Lock()
		ok := done()
		sink.mu.Unlock()
		if ok {
			break
		}
		select {
		case err := <-errc:
			cancel()
			return err
		case <-deadline:
			cancel()
			t.Fatal("timed out")
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	return <-errc
}

func TestPipelineBatchesAtTransactionBoundaries(t *testing.T) {
	sink := &fakeSink{}
	src := sourceOf(
		tidemark.Chunk{Changes: changes(1, 3), Commit: pos(1)},
		tidemark.Chunk{Changes: changes(2, 3), Commit: pos(2)}, // batch full here (6 ≥ 5)
		tidemark.Chunk{Changes: changes(3, 4)},                 // split transaction: part 1
		tidemark.Chunk{Changes: changes(3, 4)},                 // part 2: full, but no boundary yet
		tidemark.Chunk{Changes: changes(3, 4)},                 // 12 ≥ 2×5: flushed without a boundary
		tidemark.Chunk{Changes: changes(3, 1), Commit: pos(3)},
	)
	p, err := tidemark.NewPipeline(tidemark.PipelineConfig{Source: "s", MaxBatchChanges: 5, MaxDelay: time.Hour}, src, nil, sink)
	if err != nil {
		t.Fatal(err)
	}
	err = runUntil(t, p, sink, func() bool { return len(sink.batches) == 2 })
	if err != nil {
		t.Fatal(err)
	}
	// Batch 1: tx1+tx2 (6 changes, checkpoint 2). Batch 2: 12 changes of tx3,
	// no checkpoint. Batch 3: the rest of tx3 on cancel, checkpoint 3.
	if len(sink.batches) != 3 {
		t.Fatalf("%d batches", len(sink.batches))
	}
	if b := sink.batches[0]; len(b.Changes) != 6 || b.Checkpoint != pos(2) {
		t.Fatalf("batch 1: %d changes, checkpoint %v", len(b.Changes), b.Checkpoint)
	}
	if b := sink.batches[1]; len(b.Changes) != 12 || !b.Checkpoint.IsZero() {
		t.Fatalf("batch 2 (split tx): %d changes, checkpoint %v", len(b.Changes), b.Checkpoint)
	}
	if b := sink.batches[2]; len(b.Changes) != 1 || b.Checkpoint != pos(3) {
		t.Fatalf("batch 3: %d changes, checkpoint %v", len(b.Changes), b.Checkpoint)
	}
	total, last := p.Totals()
	if total.Inserted != 19 || last != pos(3) {
		t.Fatalf("totals %+v last %v", total, last)
	}
}

func TestPipelineFlushesAfterDelayAndOnStop(t *testing.T) {
	sink := &fakeSink{}
	src := sourceOf(tidemark.Chunk{Changes: changes(1, 2), Commit: pos(1)})
	p, _ := tidemark.NewPipeline(tidemark.PipelineConfig{Source: "s", MaxDelay: 20 * time.Millisecond}, src, nil, sink)
	if err := runUntil(t, p, sink, func() bool { return len(sink.batches) == 1 }); err != nil {
		t.Fatal(err)
	}
	if sink.checkpoint != pos(1) {
		t.Fatalf("checkpoint %v", sink.checkpoint)
	}
	// On cancellation a partial batch is committed (delay never fires).
	sink = &fakeSink{}
	src = sourceOf(tidemark.Chunk{Changes: changes(1, 2), Commit: pos(1)})
	p, _ = tidemark.NewPipeline(tidemark.PipelineConfig{Source: "s", MaxDelay: time.Hour}, src, nil, sink)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx, tidemark.Position{}) }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if len(sink.batches) != 1 || sink.checkpoint != pos(1) {
		t.Fatalf("stop did not commit what was read: %d batches, checkpoint %v", len(sink.batches), sink.checkpoint)
	}
}

func TestPipelineErrors(t *testing.T) {
	boom := errors.New("boom")
	t.Run("source error", func(t *testing.T) {
		src := &fakeSource{stream: func(ctx context.Context, from tidemark.Position, out chan<- tidemark.Chunk) error {
			return boom
		}}
		p, _ := tidemark.NewPipeline(tidemark.PipelineConfig{Source: "s"}, src, nil, &fakeSink{})
		if err := p.Run(context.Background(), tidemark.Position{}); !errors.Is(err, boom) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("sink error keeps checkpoint", func(t *testing.T) {
		sink := &fakeSink{checkpoint: pos(7), apply: func(b *tidemark.Batch) (tidemark.ApplyStats, error) { return tidemark.ApplyStats{}, boom }}
		var from tidemark.Position
		src := &fakeSource{stream: func(ctx context.Context, f tidemark.Position, out chan<- tidemark.Chunk) error {
			from = f
			out <- tidemark.Chunk{Changes: changes(8, 1), Commit: pos(8)}
			<-ctx.Done()
			return nil
		}}
		p, _ := tidemark.NewPipeline(tidemark.PipelineConfig{Source: "s", MaxDelay: time.Millisecond}, src, nil, sink)
		if err := p.Run(context.Background(), tidemark.Position{}); !errors.Is(err, boom) {
			t.Fatalf("err = %v", err)
		}
		if from != pos(7) {
			t.Fatalf("did not resume from the sink's checkpoint: %v", from)
		}
		if sink.checkpoint != pos(7) {
			t.Fatalf("checkpoint moved to %v", sink.checkpoint)
		}
	})
	t.Run("stats mismatch", func(t *testing.T) {
		bad := &miscountingSink{fakeSink: &fakeSink{}}
		p, _ := tidemark.NewPipeline(tidemark.PipelineConfig{Source: "s", MaxDelay: time.Millisecond}, sourceOf(tidemark.Chunk{Changes: changes(1, 3), Commit: pos(1)}), nil, bad)
		if err := p.Run(context.Background(), tidemark.Position{}); !errors.Is(err, tidemark.ErrStatsMismatch) {
			t.Fatalf("err = %v", err)
		}
	})
}

type miscountingSink struct{ *fakeSink }

func (m *miscountingSink) Apply(ctx context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error) {
	s, err := m.fakeSink.Apply(ctx, b)
	s.Inserted--
	return s, err
}

// A stop that arrives while a batch is being applied lets the apply finish:
// Run returns nil and the batch is committed.
func TestPipelineStopDuringApply(t *testing.T) {
	started := make(chan struct{})
	sink := &fakeSink{}
	slow := &slowSink{fakeSink: sink, started: started}
	p, _ := tidemark.NewPipeline(tidemark.PipelineConfig{Source: "s", MaxDelay: time.Millisecond}, sourceOf(tidemark.Chunk{Changes: changes(1, 2), Commit: pos(1)}), nil, slow)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx, tidemark.Position{}) }()
	<-started
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("stop during apply: %v", err)
	}
	if sink.checkpoint != pos(1) {
		t.Fatalf("the batch in flight was not committed: %v", sink.checkpoint)
	}
}

type slowSink struct {
	*fakeSink
	started chan struct{}
	once    sync.Once
}

func (s *slowSink) Apply(ctx context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error) {
	s.once.Do(func() { close(s.started) })
	select {
	case <-ctx.Done():
		return tidemark.ApplyStats{}, ctx.Err()
	case <-time.After(200 * time.Millisecond):
	}
	return s.fakeSink.Apply(ctx, b)
}

type fakeFilter struct {
	filter func([]tidemark.Change) []tidemark.Change
}

func (f *fakeFilter) Filter(c []tidemark.Change) []tidemark.Change { return f.filter(c) }

func TestPipelineFiltersInOrder(t *testing.T) {
	sink := &fakeSink{}
	drop2 := &fakeFilter{filter: func(cs []tidemark.Change) []tidemark.Change {
		out := cs[:0]
		for _, c := range cs {
			if c.Version.Index != 2 {
				out = append(out, c)
			}
		}
		return out
	}}
	src := sourceOf(tidemark.Chunk{Changes: changes(1, 3), Commit: pos(1)}, tidemark.Chunk{Changes: changes(2, 3), Commit: pos(2)})
	p, _ := tidemark.NewPipeline(tidemark.PipelineConfig{Source: "s", MaxDelay: 10 * time.Millisecond}, src, drop2, sink)
	if err := runUntil(t, p, sink, func() bool { return sink.checkpoint == pos(2) }); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range sink.batches {
		for _, c := range b.Changes {
			got = append(got, c.Version.String())
		}
	}
	if fmt.Sprint(got) != "[1.1 1.3 2.1 2.3]" {
		t.Fatalf("applied %v", got)
	}
}

// With FlushWhenIdle a transaction is applied as soon as the applier is
// idle, without waiting for MaxDelay; what arrives while a batch applies is
// gathered into the next batch, which is cut at a commit only.
func TestPipelineFlushWhenIdle(t *testing.T) {
	started, gate, sent := make(chan struct{}), make(chan struct{}), make(chan struct{})
	sink := &fakeSink{}
	var once sync.Once
	sink.apply = func(b *tidemark.Batch) (tidemark.ApplyStats, error) {
		once.Do(func() {
			close(started)
			sink.mu.Unlock() // let the test read the sink while this apply waits
			<-gate
			sink.mu.Lock()
		})
		return tidemark.ApplyStats{}, nil
	}
	src := &fakeSource{stream: func(ctx context.Context, from tidemark.Position, out chan<- tidemark.Chunk) error {
		out <- tidemark.Chunk{Changes: changes(1, 2), Commit: pos(1)}
		<-started
		out <- tidemark.Chunk{Changes: changes(2, 3)} // a transaction's first part
		out <- tidemark.Chunk{Changes: changes(2, 1), Commit: pos(2)}
		out <- tidemark.Chunk{Changes: changes(3, 4), Commit: pos(3)}
		close(sent)
		<-ctx.Done()
		return nil
	}}
	p, _ := tidemark.NewPipeline(tidemark.PipelineConfig{Source: "s", MaxDelay: time.Hour, FlushWhenIdle: true}, src, nil, sink)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx, tidemark.Position{}) }()
	select {
	case <-started: // the first transaction applies without the hour's delay
	case err := <-errc:
		t.Fatalf("pipeline ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the first transaction was not applied while the applier was idle")
	}
	<-sent
	close(gate)
	deadline := time.Now().Add(10 * time.Second)
	for {
		sink.mu.Lock()
		done := sink.checkpoint == pos(3)
		sink.mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the transactions that arrived during the first apply were not applied after it")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	// The first batch is the first transaction alone; the rest arrived
	// during its apply and go in one or two batches (the loop may see the
	// apply end before it reads the last chunk), each ending at a commit:
	// [2 8] or [2 4 4], never the 3-change first part on its own.
	var sizes []int
	total := 0
	for _, b := range sink.batches {
		sizes = append(sizes, len(b.Changes))
		total += len(b.Changes)
		if b.Checkpoint.IsZero() {
			t.Fatalf("a batch of %d changes was cut inside a transaction (batches %v)", len(b.Changes), sizes)
		}
	}
	if len(sizes) < 2 || sizes[0] != 2 || total != 10 || len(sizes) > 3 {
		t.Fatalf("batches of %v changes, want [2 8] or [2 4 4]", sizes)
	}
}
