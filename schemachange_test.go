package tidemark_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"tidemark"
	"tidemark/internal/testenv"
)

// regSink is a fakeSink that is also a TableRegistry, DDLSink and
// SourceLocker, with its state in memory (house style: function fields for
// the behaviour under test).
type regSink struct {
	*fakeSink
	rmu       sync.Mutex
	states    map[tidemark.TableID]tidemark.TableState
	targets   map[tidemark.TableID]bool
	ddl       [][]tidemark.DDLEvent
	resets    []tidemark.TableID
	locked    bool
	applyDDL  func(events []tidemark.DDLEvent) error
	lockCalls int
}

func newRegSink() *regSink {
	return &regSink{fakeSink: &fakeSink{}, states: map[tidemark.TableID]tidemark.TableState{}, targets: map[tidemark.TableID]bool{}}
}

func (r *regSink) TableStates(ctx context.Context, source string) ([]tidemark.TableState, error) {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	var out []tidemark.TableState
	for _, st := range r.states {
		out = append(out, st)
	}
	return out, nil
}

func (r *regSink) SetTableState(ctx context.Context, source string, st tidemark.TableState) error {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	r.states[st.Table] = st
	return nil
}

func (r *regSink) SwapTableState(ctx context.Context, source string, old tidemark.TableMode, st tidemark.TableState) (bool, error) {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	if r.states[st.Table].Mode != old {
		return false, nil
	}
	r.states[st.Table] = st
	return true, nil
}

func (r *regSink) state(id tidemark.TableID) tidemark.TableState {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	return r.states[id]
}

func (r *regSink) HasTable(ctx context.Context, id tidemark.TableID) (bool, error) {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	return r.targets[id], nil
}

func (r *regSink) ResetTable(ctx context.Context, source string, id tidemark.TableID) error {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	r.resets = append(r.resets, id)
	delete(r.targets, id)
	return nil
}

func (r *regSink) EnsureTable(ctx context.Context, t *tidemark.Table) error { return nil }

func (r *regSink) ApplyDDL(ctx context.Context, source string, events []tidemark.DDLEvent, cp tidemark.Position) error {
	if r.applyDDL != nil {
		if err := r.applyDDL(events); err != nil {
			return err
		}
	}
	r.fakeSink.mu.Lock()
	defer r.fakeSink.mu.Unlock()
	r.rmu.Lock()
	defer r.rmu.Unlock()
	r.ddl = append(r.ddl, append([]tidemark.DDLEvent(nil), events...))
	for _, ev := range events {
		if ev.Op == tidemark.DDLDropTable {
			delete(r.states, ev.Table)
			delete(r.targets, ev.Table)
		}
	}
	if !cp.IsZero() {
		r.fakeSink.checkpoint = cp
	}
	return nil
}

func (r *regSink) TryLockSource(ctx context.Context, source string) (func(), bool, error) {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	r.lockCalls++
	if r.locked {
		return nil, false, nil
	}
	r.locked = true
	return func() {
		r.rmu.Lock()
		r.locked = false
		r.rmu.Unlock()
	}, true, nil
}

func tableNamed(name string) *tidemark.Table {
	return &tidemark.Table{ID: tidemark.TableID{Database: "d", Name: name}, Columns: []tidemark.Column{{Name: "id", Kind: tidemark.KindInt}}, Key: []int{0}}
}

func changesOf(t *tidemark.Table, seq uint64, n int) []tidemark.Change {
	out := make([]tidemark.Change, n)
	for i := range out {
		out[i] = tidemark.Change{Op: tidemark.OpInsert, Table: t, After: []any{int64(i)}, Version: tidemark.Version{Seq: seq, Index: uint32(i + 1)}, Size: 100}
	}
	return out
}

// appliedOf counts the applied changes of a table.
func appliedOf(f *fakeSink, id tidemark.TableID) int {
	n := 0
	for _, b := range f.batches {
		for _, c := range b.Changes {
			if c.Table.ID == id {
				n++
			}
		}
	}
	return n
}

func TestPipelineQuarantinesOneTable(t *testing.T) {
	a, b := tableNamed("a"), tableNamed("b")
	sink := newRegSink()
	sink.targets[a.ID], sink.targets[b.ID] = true, true
	sink.apply = func(batch *tidemark.Batch) (tidemark.ApplyStats, error) {
		for _, c := range batch.Changes {
			if c.Table.ID == a.ID && c.Version.Seq == 2 {
				return tidemark.ApplyStats{}, fmt.Errorf("apply: %w", &tidemark.TableError{Table: a.ID, Err: fmt.Errorf("column v: int → smallint: %w", tidemark.ErrIncompatibleSchema)})
			}
		}
		return tidemark.ApplyStats{}, nil
	}
	src := sourceOf(
		tidemark.Chunk{Changes: append(changesOf(a, 1, 2), changesOf(b, 1, 2)...), Commit: pos(1)},
		tidemark.Chunk{Changes: append(changesOf(a, 2, 3), changesOf(b, 2, 1)...), Commit: pos(2)},
		tidemark.Chunk{Changes: append(changesOf(a, 3, 1), changesOf(b, 3, 1)...), Commit: pos(3)},
	)
	var events []tidemark.TableState
	var log strings.Builder
	p, _ := tidemark.NewPipeline(tidemark.PipelineConfig{Source: "s", MaxDelay: time.Millisecond, MaxBatchChanges: 1,
		Logger: newTestLogger(&log), OnTableState: func(st tidemark.TableState) { events = append(events, st) }}, src, nil, sink)
	if err := runUntil(t, p, sink.fakeSink, func() bool { return sink.checkpoint == pos(3) }); err != nil {
		t.Fatal(err)
	}
	if got := appliedOf(sink.fakeSink, a.ID); got != 2 {
		t.Errorf("applied %d changes of a, want the 2 before the incompatible change", got)
	}
	if got := appliedOf(sink.fakeSink, b.ID); got != 4 {
		t.Errorf("applied %d changes of b, want all 4: the other table continues", got)
	}
	st := sink.state(a.ID)
	if st.Mode != tidemark.TableQuarantined || !strings.Contains(st.Reason, "int → smallint") {
		t.Errorf("recorded state of a: %+v", st)
	}
	if p.SkippedChanges() != 4 {
		t.Errorf("skipped %d, want 4 (3 at seq 2, 1 at seq 3)", p.SkippedChanges())
	}
	if len(events) != 3 || events[len(events)-1].Mode != tidemark.TableQuarantined {
		t.Errorf("OnTableState calls: %+v", events)
	}
	if !strings.Contains(log.String(), "table quarantined") || !strings.Contains(log.String(), "tidemark resync --table d.a") {
		t.Errorf("no clear log line:\n%s", log.String())
	}

	// A restart keeps the table quarantined: its changes never reach the
	// sink.
	sink2 := newRegSink()
	sink2.targets[a.ID], sink2.targets[b.ID] = true, true
	sink2.states[a.ID] = st
	p2, _ := tidemark.NewPipeline(tidemark.PipelineConfig{Source: "s", MaxDelay: time.Millisecond},
		sourceOf(tidemark.Chunk{Changes: append(changesOf(a, 4, 2), changesOf(b, 4, 2)...), Commit: pos(4)}), nil, sink2)
	if err := runUntil(t, p2, sink2.fakeSink, func() bool { return sink2.checkpoint == pos(4) }); err != nil {
		t.Fatal(err)
	}
	if appliedOf(sink2.fakeSink, a.ID) != 0 || appliedOf(sink2.fakeSink, b.ID) != 2 {
		t.Errorf("after restart: a %d, b %d applied", appliedOf(sink2.fakeSink, a.ID), appliedOf(sink2.fakeSink, b.ID))
	}
}

func TestPipelineNewTableIsSnapshotted(t *testing.T) {
	a := tableNamed("a")
	sink := newRegSink()
	var snapped [][]tidemark.TableID
	snapshot := func(ctx context.Context, tables []tidemark.TableID) (tidemark.Version, error) {
		snapped = append(snapped, tables)
		return tidemark.Version{Seq: 5}, nil
	}
	src := sourceOf(
		tidemark.Chunk{Changes: changesOf(a, 4, 2), Commit: pos(4)}, // in the snapshot: skipped
		tidemark.Chunk{Changes: changesOf(a, 5, 2), Commit: pos(5)}, // the snapshot's own transaction: applied again (idempotent)
		tidemark.Chunk{Changes: changesOf(a, 6, 3), Commit: pos(6)},
	)
	p, _ := tidemark.NewPipeline(tidemark.PipelineConfig{Source: "s", MaxDelay: time.Millisecond, Snapshot: snapshot}, src, nil, sink)
	if err := runUntil(t, p, sink.fakeSink, func() bool { return sink.checkpoint == pos(6) }); err != nil {
		t.Fatal(err)
	}
	if len(snapped) != 1 || len(snapped[0]) != 1 || snapped[0][0] != a.ID {
		t.Fatalf("snapshots: %v", snapped)
	}
	if len(sink.resets) != 1 {
		t.Errorf("target reset %d times, want once before the snapshot", len(sink.resets))
	}
	if got := appliedOf(sink.fakeSink, a.ID); got != 5 {
		t.Errorf("applied %d changes, want 5 (those at or after the snapshot)", got)
	}
	if st := sink.state(a.ID); st.Mode != tidemark.TableStreaming || st.Floor != (tidemark.Version{Seq: 5}) {
		t.Errorf("state %+v", st)
	}

	// A table whose target exists is streamed without a snapshot.
	b := tableNamed("b")
	sink = newRegSink()
	sink.targets[b.ID] = true
	snapped = nil
	p, _ = tidemark.NewPipeline(tidemark.PipelineConfig{Source: "s", MaxDelay: time.Millisecond, Snapshot: snapshot},
		sourceOf(tidemark.Chunk{Changes: changesOf(b, 4, 2), Commit: pos(4)}), nil, sink)
	if err := runUntil(t, p, sink.fakeSink, func() bool { return sink.checkpoint == pos(4) }); err != nil {
		t.Fatal(err)
	}
	if len(snapped) != 0 || appliedOf(sink.fakeSink, b.ID) != 2 || sink.state(b.ID).Mode != tidemark.TableStreaming {
		t.Errorf("existing target: snapshots %v, applied %d, state %+v", snapped, appliedOf(sink.fakeSink, b.ID), sink.state(b.ID))
	}
}

func TestPipelineDDL(t *testing.T) {
	a, b := tableNamed("a"), tableNamed("b")
	sink := newRegSink()
	sink.targets[a.ID], sink.targets[b.ID] = true, true
	sink.applyDDL = func(events []tidemark.DDLEvent) error {
		for _, ev := range events {
			if ev.Op == tidemark.DDLTruncate && ev.Table == b.ID {
				return &tidemark.TableError{Table: b.ID, Err: fmt.Errorf("TRUNCATE refused (ddl.truncate: refuse): %w", tidemark.ErrDDLRefused)}
			}
		}
		return nil
	}
	var snapped []tidemark.TableID
	snapshot := func(ctx context.Context, tables []tidemark.TableID) (tidemark.Version, error) {
		snapped = append(snapped, tables...)
		return tidemark.Version{Seq: 7}, nil
	}
	src := sourceOf(
		tidemark.Chunk{Changes: append(changesOf(a, 1, 2), changesOf(b, 1, 1)...), Commit: pos(1)},
		tidemark.Chunk{DDL: []tidemark.DDLEvent{{Op: tidemark.DDLTruncate, Table: a.ID, Version: tidemark.Version{Seq: 2}}, {Op: tidemark.DDLTruncate, Table: b.ID, Version: tidemark.Version{Seq: 2}}}, Commit: pos(2)},
		tidemark.Chunk{Changes: append(changesOf(a, 3, 1), changesOf(b, 3, 1)...), Commit: pos(3)},
		tidemark.Chunk{DDL: []tidemark.DDLEvent{{Op: tidemark.DDLAlterTable, Table: a.ID, Version: tidemark.Version{Seq: 4}, Added: []string{"c"}, Backfill: true}}, Commit: pos(4)},
		tidemark.Chunk{DDL: []tidemark.DDLEvent{{Op: tidemark.DDLUndecodable, Table: tidemark.TableID{Database: "d", Name: "nokey"}, Reason: "no primary key"}}, Commit: pos(5)},
		tidemark.Chunk{DDL: []tidemark.DDLEvent{{Op: tidemark.DDLDropTable, Table: a.ID, Version: tidemark.Version{Seq: 8}}}, Commit: pos(8)},
	)
	// MaxDelay is long: only the DDL boundaries flush.
	p, _ := tidemark.NewPipeline(tidemark.PipelineConfig{Source: "s", MaxDelay: time.Hour, Snapshot: snapshot}, src, nil, sink)
	if err := runUntil(t, p, sink.fakeSink, func() bool { return sink.checkpoint == pos(8) }); err != nil {
		t.Fatal(err)
	}
	// The changes before the TRUNCATE were applied before it.
	if len(sink.batches) == 0 || sink.batches[0].Checkpoint != pos(1) || len(sink.batches[0].Changes) != 3 {
		t.Fatalf("first batch %+v: the DDL must be a batch boundary", sink.batches)
	}
	if len(sink.ddl) < 1 || sink.ddl[0][0].Table != a.ID {
		t.Fatalf("DDL applied: %+v", sink.ddl)
	}
	if st := sink.state(b.ID); st.Mode != tidemark.TableQuarantined || !strings.Contains(st.Reason, "refused") {
		t.Errorf("b: %+v, want quarantined (TRUNCATE refused)", st)
	}
	if appliedOf(sink.fakeSink, b.ID) != 1 {
		t.Errorf("b: %d changes applied, want the one before the refused TRUNCATE", appliedOf(sink.fakeSink, b.ID))
	}
	if len(snapped) != 1 || snapped[0] != a.ID {
		t.Errorf("snapshots %v, want a (backfill after ALTER ADD COLUMN with a default)", snapped)
	}
	if st := sink.state(tidemark.TableID{Database: "d", Name: "nokey"}); st.Mode != tidemark.TableQuarantined || !strings.Contains(st.Reason, "no primary key") {
		t.Errorf("undecodable table: %+v", st)
	}
	if _, ok := sink.states[a.ID]; ok {
		t.Errorf("a was dropped: its state should be gone, is %+v", sink.states[a.ID])
	}
}

func TestPipelineResyncRequest(t *testing.T) {
	a := tableNamed("a")
	sink := newRegSink()
	sink.targets[a.ID] = true
	sink.states[a.ID] = tidemark.TableState{Table: a.ID, Mode: tidemark.TableQuarantined, Reason: "x"}
	snapshotted := make(chan struct{}, 1)
	snapshot := func(ctx context.Context, tables []tidemark.TableID) (tidemark.Version, error) {
		snapshotted <- struct{}{}
		return tidemark.Version{Seq: 10}, nil
	}
	sent := make(chan struct{})
	src := &fakeSource{stream: func(ctx context.Context, from tidemark.Position, out chan<- tidemark.Chunk) error {
		out <- tidemark.Chunk{Changes: changesOf(a, 9, 1), Commit: pos(9)}
		<-sent
		out <- tidemark.Chunk{Changes: changesOf(a, 11, 1), Commit: pos(11)}
		<-ctx.Done()
		return nil
	}}
	p, _ := tidemark.NewPipeline(tidemark.PipelineConfig{Source: "s", MaxDelay: time.Millisecond, Snapshot: snapshot, StateInterval: 10 * time.Millisecond}, src, nil, sink)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx, tidemark.Position{}) }()
	testenv.Eventually(t, 10*time.Second, "checkpoint 9", func() bool { sink.mu.Lock(); defer sink.mu.Unlock(); return sink.checkpoint == pos(9) })
	if appliedOf(sink.fakeSink, a.ID) != 0 {
		t.Fatal("a quarantined table's change was applied")
	}
	if err := sink.SetTableState(ctx, "s", tidemark.TableState{Table: a.ID, Mode: tidemark.TableResyncRequested}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-snapshotted:
	case <-time.After(5 * time.Second):
		t.Fatal("the resync request was not picked up")
	}
	close(sent)
	testenv.Eventually(t, 10*time.Second, "checkpoint 11", func() bool { sink.mu.Lock(); defer sink.mu.Unlock(); return sink.checkpoint == pos(11) })
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if appliedOf(sink.fakeSink, a.ID) != 1 {
		t.Errorf("after the resync: %d changes of a applied, want 1", appliedOf(sink.fakeSink, a.ID))
	}
	if st := sink.state(a.ID); st.Mode != tidemark.TableStreaming || st.Floor.Seq != 10 {
		t.Errorf("state %+v", st)
	}
}

func TestPipelineWaitsForSourceLock(t *testing.T) {
	sink := newRegSink()
	sink.locked = true // another process
	p, _ := tidemark.NewPipeline(tidemark.PipelineConfig{Source: "s", MaxDelay: time.Millisecond},
		sourceOf(tidemark.Chunk{Changes: changes(1, 1), Commit: pos(1)}), nil, sink)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx, tidemark.Position{}) }()
	time.Sleep(100 * time.Millisecond)
	sink.mu.Lock()
	n := len(sink.batches)
	sink.mu.Unlock()
	if n != 0 {
		t.Fatal("applied while another process held the source")
	}
	sink.rmu.Lock()
	sink.locked = false
	sink.rmu.Unlock()
	testenv.Eventually(t, 10*time.Second, "checkpoint 1", func() bool { sink.mu.Lock(); defer sink.mu.Unlock(); return sink.checkpoint == pos(1) })
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	sink.rmu.Lock()
	defer sink.rmu.Unlock()
	if sink.locked {
		t.Error("lock not released after Run")
	}
}

func TestTableErrorUnwraps(t *testing.T) {
	err := fmt.Errorf("apply: %w", &tidemark.TableError{Table: tidemark.TableID{Database: "d", Name: "t"}, Err: fmt.Errorf("key changed: %w", tidemark.ErrIncompatibleSchema)})
	var te *tidemark.TableError
	if !errors.As(err, &te) || te.Table.Name != "t" || !errors.Is(err, tidemark.ErrIncompatibleSchema) {
		t.Fatalf("%v", err)
	}
	if !strings.Contains(err.Error(), "table d.t: key changed") {
		t.Fatalf("message %q", err.Error())
	}
	st := tidemark.TableState{Mode: tidemark.TableStreaming, Floor: tidemark.Version{Seq: 5}}
	if !st.Skips(tidemark.Version{Seq: 4, Index: 9}) || st.Skips(tidemark.Version{Seq: 5, Index: 1}) || st.Skips(tidemark.Version{Seq: 5}) {
		t.Fatal("floor")
	}
}

type lockedBuilder struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func newTestLogger(b *strings.Builder) *slog.Logger {
	return slog.New(slog.NewTextHandler(&lockedBuilder{b: b}, nil))
}

// TestPipelineCreateTable: a table created in the stream is streamed (all
// its rows follow); one renamed into the stream is snapshotted first.
func TestPipelineCreateTable(t *testing.T) {
	created, renamed := tableNamed("created"), tableNamed("renamed")
	sink := newRegSink()
	var snapped []tidemark.TableID
	snapshot := func(ctx context.Context, tables []tidemark.TableID) (tidemark.Version, error) {
		snapped = append(snapped, tables...)
		return tidemark.Version{Seq: 3}, nil
	}
	src := sourceOf(
		tidemark.Chunk{DDL: []tidemark.DDLEvent{{Op: tidemark.DDLCreateTable, Table: created.ID, Version: tidemark.Version{Seq: 1}}}, Commit: pos(1)},
		tidemark.Chunk{DDL: []tidemark.DDLEvent{{Op: tidemark.DDLCreateTable, Table: renamed.ID, From: tidemark.TableID{Database: "other", Name: "x"}, Version: tidemark.Version{Seq: 2}}}, Commit: pos(2)},
		tidemark.Chunk{Changes: append(changesOf(created, 2, 1), changesOf(renamed, 2, 1)...), Commit: pos(3)},
		tidemark.Chunk{Changes: append(changesOf(created, 4, 1), changesOf(renamed, 4, 1)...), Commit: pos(4)},
	)
	p, _ := tidemark.NewPipeline(tidemark.PipelineConfig{Source: "s", MaxDelay: time.Millisecond, Snapshot: snapshot}, src, nil, sink)
	if err := runUntil(t, p, sink.fakeSink, func() bool { return sink.checkpoint == pos(4) }); err != nil {
		t.Fatal(err)
	}
	if len(snapped) != 1 || snapped[0] != renamed.ID {
		t.Fatalf("snapshots %v, want only the renamed table", snapped)
	}
	if appliedOf(sink.fakeSink, created.ID) != 2 || appliedOf(sink.fakeSink, renamed.ID) != 1 {
		t.Fatalf("applied: created %d (want 2), renamed %d (want 1: the one after its snapshot)", appliedOf(sink.fakeSink, created.ID), appliedOf(sink.fakeSink, renamed.ID))
	}
}

// boundaryReg is a regSink that is also a SnapshotBoundary and records the
// order of what Resnapshot does.
type boundaryReg struct {
	*regSink
	steps   []string
	failEnd error
}

func (r *boundaryReg) ResetTable(ctx context.Context, source string, id tidemark.TableID) error {
	r.steps = append(r.steps, "reset "+id.String())
	return r.regSink.ResetTable(ctx, source, id)
}

func (r *boundaryReg) BeginSnapshot(ctx context.Context, source string, id tidemark.TableID, reason string) error {
	r.steps = append(r.steps, "begin "+id.String()+" ("+reason+")")
	return nil
}

func (r *boundaryReg) EndSnapshot(ctx context.Context, source string, id tidemark.TableID, v tidemark.Version) error {
	r.steps = append(r.steps, "end "+id.String()+" at "+v.String())
	return r.failEnd
}

// TestResnapshotBoundaries: a registry that is a SnapshotBoundary sees the
// reset, the beginning, the snapshot's rows and the end with the
// snapshot's version, in that order; a failed end is the registry's error
// and leaves the table snapshotting.
func TestResnapshotBoundaries(t *testing.T) {
	ctx := context.Background()
	id := tidemark.TableID{Database: "d", Name: "t"}
	reg := &boundaryReg{regSink: newRegSink()}
	snap := func(ctx context.Context, tables []tidemark.TableID) (tidemark.Version, error) {
		reg.steps = append(reg.steps, fmt.Sprintf("snapshot %v", tables))
		return tidemark.Version{Seq: 42}, nil
	}
	st, err := tidemark.Resnapshot(ctx, reg, "s", id, snap, "resync requested")
	if err != nil || st.Mode != tidemark.TableStreaming || st.Floor != (tidemark.Version{Seq: 42}) {
		t.Fatalf("Resnapshot: %+v, %v", st, err)
	}
	want := "reset d.t|begin d.t (resync requested)|snapshot [d.t]|end d.t at " + (tidemark.Version{Seq: 42}).String()
	if got := strings.Join(reg.steps, "|"); got != want {
		t.Fatalf("steps\n got %s\nwant %s", got, want)
	}
	reg.failEnd = errors.New("broker gone")
	if _, err := tidemark.Resnapshot(ctx, reg, "s", id, snap, "again"); !tidemark.IsRegistryError(err) {
		t.Fatalf("failed end: %v, want a registry error", err)
	}
	if st := reg.state(id); st.Mode != tidemark.TableSnapshotting {
		t.Fatalf("after a failed end: %+v, want snapshotting", st)
	}
}
