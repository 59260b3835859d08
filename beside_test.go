package tidemark

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tidemark/internal/testenv"
)

// TestCursorRoundTrip: a chunk cursor of every type a source's Read
// returns comes back with its type and value; other types are an error
// naming the value's position.
func TestCursorRoundTrip(t *testing.T) {
	at := time.Date(2026, 12, 2, 1, 2, 3, 456789000, time.UTC)
	in := []any{int64(-9223372036854775808), uint64(18446744073709551615), 1.5e300, "a:b\"c\x00é", at}
	enc, err := EncodeCursor(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeCursor(enc)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out, in) {
		t.Fatalf("decoded %#v, want %#v", out, in)
	}
	if out, err := DecodeCursor(""); err != nil || out != nil {
		t.Fatalf("empty cursor: %v, %v", out, err)
	}
	if _, err := EncodeCursor([]any{int64(1), struct{}{}}); err == nil || !strings.Contains(err.Error(), "value 1") {
		t.Fatalf("unknown type: %v", err)
	}
	if _, err := DecodeCursor(`["x:1"]`); err == nil || !strings.Contains(err.Error(), "value 0") {
		t.Fatalf("unknown tag: %v", err)
	}
}

// TestTableSetApplying: the changes and DDL of a snapshotting table whose
// snapshot runs beside the stream are applied (whatever the floor) until
// it is no longer marked; other snapshotting tables' are skipped.
func TestTableSetApplying(t *testing.T) {
	a, b := &Table{ID: TableID{Database: "d", Name: "a"}}, &Table{ID: TableID{Database: "d", Name: "b"}}
	var s tableSet
	s.put(TableState{Table: a.ID, Mode: TableSnapshotting, Floor: Version{Seq: 9}})
	s.put(TableState{Table: b.ID, Mode: TableSnapshotting})
	s.setApplying(a.ID, true)
	batch := &Batch{Changes: []Change{{Table: a, Version: Version{Seq: 1}}, {Table: b, Version: Version{Seq: 2}}}}
	s.filter(batch)
	if len(batch.Changes) != 1 || batch.Changes[0].Table != a {
		t.Fatalf("kept %+v, want a's change only", batch.Changes)
	}
	if known, skip := s.skips(a.ID, Version{Seq: 1}); !known || skip {
		t.Fatalf("a: known %v skip %v, want known and applied", known, skip)
	}
	s.setApplying(a.ID, false)
	if _, skip := s.skips(a.ID, Version{Seq: 1}); !skip {
		t.Fatal("a's changes applied after it is no longer marked")
	}
	if known, _ := s.skips(TableID{Database: "d", Name: "c"}, Version{}); known {
		t.Fatal("an unknown table is known")
	}
}

// besideTarget is a keyed target in memory for the snapshot-beside tests:
// version-guarded upserts and deletes (a change not newer than the row's
// version is skipped, as the PostgreSQL sink does), the checkpoint, and
// the table states.
type besideTarget struct {
	mu         sync.Mutex
	rows       map[Key]Version
	checkpoint Position
	states     map[TableID]TableState
}

func (b *besideTarget) Apply(_ context.Context, batch *Batch) (ApplyStats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var st ApplyStats
	for i := range batch.Changes {
		c := &batch.Changes[i]
		k := c.Key()
		old, had := b.rows[k]
		switch {
		case had && c.Version.Compare(old) <= 0:
			st.Skipped++
		case c.Op == OpDelete && !had:
			st.Skipped++
		case c.Op == OpDelete:
			delete(b.rows, k)
			st.Deleted++
		default:
			b.rows[k] = c.Version
			st.Inserted++
		}
	}
	if !batch.Checkpoint.IsZero() {
		b.checkpoint = batch.Checkpoint
	}
	return st, nil
}

func (b *besideTarget) Checkpoint(context.Context, string) (Position, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.checkpoint, !b.checkpoint.IsZero(), nil
}

func (b *besideTarget) Close() error { return nil }

func (b *besideTarget) TableStates(context.Context, string) ([]TableState, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []TableState
	for _, st := range b.states {
		out = append(out, st)
	}
	return out, nil
}

func (b *besideTarget) SetTableState(_ context.Context, _ string, st TableState) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.states[st.Table] = st
	return nil
}

func (b *besideTarget) SwapTableState(_ context.Context, _ string, old TableMode, st TableState) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.states[st.Table].Mode != old {
		return false, nil
	}
	b.states[st.Table] = st
	return true, nil
}

func (b *besideTarget) HasTable(context.Context, TableID) (bool, error) { return false, nil }

func (b *besideTarget) ResetTable(context.Context, string, TableID) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	clear(b.rows)
	return nil
}

func (b *besideTarget) EnsureTable(context.Context, *Table) error { return nil }

// besideChunks is a ChunkSnapshotter of one chunk: its capture is snap,
// and its read (rows, then the end) waits for release after telling
// reading.
type besideChunks struct {
	snap             Snapshot
	rows             func(Snapshot) []Change
	reading, release chan struct{}
}

func (c *besideChunks) Chunkable(context.Context, TableID) (bool, error) { return true, nil }

func (c *besideChunks) Capture(context.Context) (Snapshot, error) {
	return c.snap, nil
}

func (c *besideChunks) Parallelism() int { return 1 }

func (c *besideChunks) Split(context.Context, TableID, int) ([]SnapshotRange, error) {
	return []SnapshotRange{{}}, nil
}

func (c *besideChunks) ReadChunk(ctx context.Context, _ TableID, _ int, _ SnapshotRange, snap Snapshot) ([]Change, []any, error) {
	close(c.reading)
	select {
	case <-c.release:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	return c.rows(snap), nil, nil
}

func (c *besideChunks) FinishSnapshot(context.Context, TableID) error { return nil }

// TestBesideSnapshotWaitsForTheStream: a new table is snapshotted beside
// the stream while the stream lags behind the chunk's capture (at the
// commit of transaction 30, version 31). Row 2's INSERT (version 20) is
// applied during the snapshot, which does not carry row 2 (its DELETE,
// version 30, was committed before the capture); the DELETE reaches the
// loop only after the last chunk landed. It must be applied, and the
// table streams once the checkpoint has reached the capture. Before, the
// job ended when its last chunk landed, the table streamed from the first
// chunk's version on, the DELETE (older) was skipped, counted and nothing
// said, and row 2 stayed in the target for good
// (TestTypeZooStreamAndSnapshot/mysql: 'extra 18').
func TestBesideSnapshotWaitsForTheStream(t *testing.T) {
	tbl := &Table{ID: TableID{Database: "d", Name: "t"}, Columns: []Column{{Name: "id", Kind: KindInt}}, Key: []int{0}}
	row := func(op Op, id int64, seq uint64) Change {
		c := Change{Op: op, Table: tbl, Version: Version{Seq: seq, Index: 1}, Size: 10}
		if op == OpDelete {
			c.Before = []any{id}
		} else {
			c.After = []any{id}
		}
		return c
	}
	target := &besideTarget{rows: map[Key]Version{}, states: map[TableID]TableState{}}
	at := func(seq int) Position { return Position{GTID: "0-1-" + strconv.Itoa(seq)} }
	chunks := &besideChunks{snap: Snapshot{Position: at(30), Version: Version{Seq: 31}}, reading: make(chan struct{}), release: make(chan struct{}),
		rows: func(s Snapshot) []Change {
			c := row(OpRead, 1, 0)
			c.Version = s.Version
			return []Change{c}
		}}
	feed := make(chan Chunk)
	src := &besideSource{feed: feed}
	p, errc, cancel := runBeside(t, chunks, func(context.Context, []TableID) (Version, error) {
		return Version{}, errors.New("the blocking snapshot was used")
	}, src, target)
	defer cancel()
	waitFor := func(what string, cond func() bool) { t.Helper(); waitPipeline(t, errc, &target.mu, what, cond) }
	// Row 1's INSERT: the table is new, its snapshot is queued beside
	// the stream and the change is skipped (the chunk carries it).
	feed <- Chunk{Changes: []Change{row(OpInsert, 1, 10)}, Commit: at(10)}
	<-chunks.reading
	feed <- Chunk{Changes: []Change{row(OpInsert, 2, 20)}, Commit: at(20)}
	waitFor("row 2 applied during the snapshot", func() bool { _, ok := target.rows[tbl.KeyOf([]any{int64(2)})]; return ok })
	close(chunks.release)
	// The last chunk lands; then the DELETE (the first release of the
	// stream past the chunk, no timing involved: it is fed after the
	// chunk is read, and the chunk lands in the loop's next turn or the
	// one after).
	waitFor("row 1 of the chunk", func() bool { _, ok := target.rows[tbl.KeyOf([]any{int64(1)})]; return ok })
	feed <- Chunk{Changes: []Change{row(OpDelete, 2, 30)}, Commit: at(30)}
	waitFor("the checkpoint of the DELETE", func() bool { return target.checkpoint == at(30) })
	waitFor("the table streaming", func() bool { return target.states[tbl.ID].Mode == TableStreaming })
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if v, ok := target.rows[tbl.KeyOf([]any{int64(2)})]; ok {
		t.Errorf("row 2 (deleted at version 30) is still in the target at version %s after the snapshot beside the stream; %d changes skipped", v, p.SkippedChanges())
	}
	if st := target.states[tbl.ID]; st.Floor != (Version{Seq: 31}) {
		t.Errorf("the table streams with floor %s, want the chunk's version 31", st.Floor)
	}
	if _, ok := target.rows[tbl.KeyOf([]any{int64(1)})]; !ok {
		t.Error("row 1 of the chunk is missing")
	}
}

// runBeside runs a pipeline with chunks (snapshot for the in-loop ones)
// from src into target; its Run's result goes to errc once cancel is
// called (or it stops).
func runBeside(t *testing.T, chunks ChunkSnapshotter, snapshot SnapshotFunc, src Source, target Sink) (*Pipeline, chan error, context.CancelFunc) {
	t.Helper()
	p, err := NewPipeline(PipelineConfig{Source: "s", MaxDelay: time.Millisecond, StateInterval: time.Hour, Chunks: chunks, Snapshot: snapshot}, src, nil, target)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx, Position{}) }()
	return p, errc, cancel
}

// waitPipeline waits until cond (called with mu held) holds, and fails
// the test when the pipeline (its Run's result on errc) stopped first.
func waitPipeline(t *testing.T, errc chan error, mu *sync.Mutex, what string, cond func() bool) {
	t.Helper()
	stopped := false
	var err error
	testenv.Eventually(t, 20*time.Second, what, func() bool {
		select {
		case err = <-errc:
			stopped = true
			return true
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		return cond()
	})
	if stopped {
		t.Fatalf("waiting for %s: the pipeline stopped: %v", what, err)
	}
}

// besideSource streams what the test feeds it.
type besideSource struct{ feed chan Chunk }

func (s *besideSource) Stream(ctx context.Context, _ Position, out chan<- Chunk) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case c := <-s.feed:
			select {
			case out <- c:
			case <-ctx.Done():
				return nil
			}
		}
	}
}

// TestBesideReached: a snapshot beside the stream ends once the committed
// position has reached its first capture, also when the capture is in a
// newer binlog file (an idle MySQL source after a rotation: its GTID set
// decides); a position before the capture has not.
func TestBesideReached(t *testing.T) {
	my := SourceIdentity{Flavor: "mysql", Server: "3e11fa47-71ca-11e1-9e33-c80aa9429562"}
	const u = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
	for _, c := range []struct {
		name         string
		last, target Position
		want         bool
	}{
		{"same position", Position{File: "b.000001", Offset: 900, GTID: u + ":1-9", Source: my}, Position{File: "b.000001", Offset: 900, GTID: u + ":1-9", Source: my}, true},
		{"past it", Position{File: "b.000001", Offset: 1200, GTID: u + ":1-10", Source: my}, Position{File: "b.000001", Offset: 900, GTID: u + ":1-9", Source: my}, true},
		{"before it", Position{File: "b.000001", Offset: 500, GTID: u + ":1-8", Source: my}, Position{File: "b.000001", Offset: 900, GTID: u + ":1-9", Source: my}, false},
		{"capture after a rotation", Position{File: "b.000001", Offset: 900, GTID: u + ":1-9", Source: my}, Position{File: "b.000002", Offset: 197, GTID: u + ":1-9", Source: my}, true},
		{"rotation, a transaction missing", Position{File: "b.000001", Offset: 900, GTID: u + ":1-8", Source: my}, Position{File: "b.000002", Offset: 197, GTID: u + ":1-9", Source: my}, false},
		{"MariaDB GTIDs", Position{GTID: "0-1-30"}, Position{GTID: "0-1-30"}, true},
		{"MariaDB GTIDs before", Position{GTID: "0-1-29"}, Position{GTID: "0-1-30"}, false},
	} {
		if got := reached(c.last, c.target); got != c.want {
			t.Errorf("%s: reached(%s, %s) = %v, want %v", c.name, c.last, c.target, got, c.want)
		}
	}
}

// goneChunks is a ChunkSnapshotter of a table renamed away after its
// snapshot was queued: Chunkable says yes once, then no (the table is not
// on the source any more), and every chunk read finds it gone.
type goneChunks struct{ chunkable int }

func (c *goneChunks) Chunkable(context.Context, TableID) (bool, error) {
	c.chunkable++
	return c.chunkable == 1, nil
}

func (c *goneChunks) Capture(context.Context) (Snapshot, error) {
	return Snapshot{Position: Position{GTID: "0-1-5"}, Version: Version{Seq: 6}}, nil
}

func (c *goneChunks) Parallelism() int { return 1 }

func (c *goneChunks) Split(context.Context, TableID, int) ([]SnapshotRange, error) {
	return []SnapshotRange{{}}, nil
}

func (c *goneChunks) ReadChunk(context.Context, TableID, int, SnapshotRange, Snapshot) ([]Change, []any, error) {
	return nil, nil, fmt.Errorf("read d.t: ERROR 1146 (42S02): Table 'd.t' doesn't exist: %w", ErrTableGone)
}

func (c *goneChunks) FinishSnapshot(context.Context, TableID) error { return nil }

// TestBesideTableGone (nemesis seed 107849400749, beside the stream): a
// table renamed or dropped while it is snapshotted beside the stream is
// not quarantined: the stream carries the statement. It is snapshotted
// again inside the loop (nothing to read: its target emptied, its floor
// past the statement) and streams. Before, the failed chunk read
// quarantined it ("snapshot failed: … doesn't exist").
func TestBesideTableGone(t *testing.T) {
	tbl := &Table{ID: TableID{Database: "d", Name: "t"}, Columns: []Column{{Name: "id", Kind: KindInt}}, Key: []int{0}}
	target := &besideTarget{rows: map[Key]Version{}, states: map[TableID]TableState{}}
	feed := make(chan Chunk)
	var snapshots atomic.Int32
	_, errc, cancel := runBeside(t, &goneChunks{}, func(context.Context, []TableID) (Version, error) {
		snapshots.Add(1)
		return Version{Seq: 50}, nil // the Snapshotter of a table not on the source: its capture
	}, &besideSource{feed: feed}, target)
	defer cancel()
	feed <- Chunk{Changes: []Change{{Op: OpInsert, Table: tbl, After: []any{int64(1)}, Version: Version{Seq: 10, Index: 1}, Size: 10}}, Commit: Position{GTID: "0-1-10"}}
	var stopped error
	testenv.Eventually(t, 20*time.Second, "the table streaming again", func() bool {
		select {
		case stopped = <-errc:
			return true
		default:
		}
		target.mu.Lock()
		defer target.mu.Unlock()
		st := target.states[tbl.ID]
		return st.Mode == TableStreaming || st.Mode == TableQuarantined
	})
	if stopped != nil {
		t.Fatalf("the pipeline stopped: %v", stopped)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	st := target.states[tbl.ID]
	if st.Mode != TableStreaming || st.Floor != (Version{Seq: 50}) {
		t.Errorf("state %+v, want streaming from the second snapshot's version 50", st)
	}
	if n := snapshots.Load(); n != 1 {
		t.Errorf("%d snapshots inside the loop, want 1", n)
	}
	if len(target.rows) != 0 {
		t.Errorf("target rows %v, want none (the table is gone)", target.rows)
	}
}

// TestRangesRoundTrip: a parallel snapshot's ranges (open and bounded ends,
// cursors, done marks) come back as they were stored, and the single
// cursor an older version stored reads as one range over the table.
func TestRangesRoundTrip(t *testing.T) {
	in := SplitRanges([]any{int64(50000), int64(100000)})
	in[0].After, in[0].Done = []any{int64(49999), "x"}, false
	in[1].Done = true
	enc, err := EncodeRanges(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeRanges(enc)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out, in) {
		t.Fatalf("decoded %#v, want %#v", out, in)
	}
	if len(in) != 3 || in[0].From != nil || in[2].To != nil || !reflect.DeepEqual(in[1].From, in[0].To) || !reflect.DeepEqual(in[2].From, in[1].To) {
		t.Fatalf("split ranges do not cover the table end to end: %#v", in)
	}
	old, _ := EncodeCursor([]any{int64(7)})
	if out, err := DecodeRanges(old); err != nil || !reflect.DeepEqual(out, []SnapshotRange{{After: []any{int64(7)}}}) {
		t.Fatalf("an older single cursor: %#v, %v", out, err)
	}
	if out, err := DecodeRanges(""); err != nil || out != nil {
		t.Fatalf("no progress: %#v, %v", out, err)
	}
}

// boundaryTarget is a besideTarget whose consumers apply snapshots on
// their own (SnapshotBoundary, the Kafka sink's): it logs the boundaries
// and the applied changes of the snapshotted table, in order.
type boundaryTarget struct {
	*besideTarget
	log []string
}

func (b *boundaryTarget) Apply(ctx context.Context, batch *Batch) (ApplyStats, error) {
	b.mu.Lock()
	for _, c := range batch.Changes {
		b.log = append(b.log, fmt.Sprintf("%s %s", c.Op, c.Version))
	}
	b.mu.Unlock()
	return b.besideTarget.Apply(ctx, batch)
}

func (b *boundaryTarget) BeginSnapshot(_ context.Context, _ string, id TableID, _ string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.log = append(b.log, "begin "+id.String())
	return nil
}

func (b *boundaryTarget) EndSnapshot(_ context.Context, _ string, id TableID, v Version) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.log = append(b.log, "end "+id.String()+" "+v.String()+" "+string(b.states[id].Mode))
	return nil
}

// TestBesideSnapshotBoundaries: with a sink whose consumers apply the
// snapshot themselves (Kafka: the fan-out, the scale-out tailer), a
// snapshot beside the stream publishes its begin boundary when it becomes
// active, before its chunk and before the table's changes applied from
// then on, and its end boundary after the last chunk, at the first chunk's
// version (the consumers remove the rows older than it), before the table
// is recorded streaming. Before, a Kafka target never got a snapshot
// beside the stream (the daemon did not wire one), and the job published
// no boundaries.
func TestBesideSnapshotBoundaries(t *testing.T) {
	tbl := &Table{ID: TableID{Database: "d", Name: "t"}, Columns: []Column{{Name: "id", Kind: KindInt}}, Key: []int{0}}
	ins := func(id int64, seq uint64) Change {
		return Change{Op: OpInsert, Table: tbl, After: []any{id}, Version: Version{Seq: seq, Index: 1}, Size: 10}
	}
	target := &boundaryTarget{besideTarget: &besideTarget{rows: map[Key]Version{}, states: map[TableID]TableState{}}}
	at := func(seq int) Position { return Position{GTID: "0-1-" + strconv.Itoa(seq)} }
	chunks := &besideChunks{snap: Snapshot{Position: at(30), Version: Version{Seq: 31}}, reading: make(chan struct{}), release: make(chan struct{}),
		rows: func(s Snapshot) []Change {
			c := Change{Op: OpRead, Table: tbl, After: []any{int64(1)}, Version: s.Version, Size: 10}
			return []Change{c}
		}}
	feed := make(chan Chunk)
	_, errc, cancel := runBeside(t, chunks, func(context.Context, []TableID) (Version, error) {
		return Version{}, errors.New("the blocking snapshot was used")
	}, &besideSource{feed: feed}, target)
	defer cancel()
	waitFor := func(what string, cond func() bool) { t.Helper(); waitPipeline(t, errc, &target.mu, what, cond) }
	feed <- Chunk{Changes: []Change{ins(1, 10)}, Commit: at(10)} // admits the table: skipped, queued
	<-chunks.reading
	feed <- Chunk{Changes: []Change{ins(2, 20)}, Commit: at(20)}
	waitFor("row 2 applied during the snapshot", func() bool { _, ok := target.rows[tbl.KeyOf([]any{int64(2)})]; return ok })
	close(chunks.release)
	waitFor("row 1 of the chunk", func() bool { _, ok := target.rows[tbl.KeyOf([]any{int64(1)})]; return ok })
	feed <- Chunk{Changes: []Change{ins(3, 30)}, Commit: at(30)}
	waitFor("the table streaming", func() bool { return target.states[tbl.ID].Mode == TableStreaming })
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	want := []string{"begin d.t", "c 20.1", "r 31.0", "c 30.1", "end d.t 31.0 snapshotting"}
	if !reflect.DeepEqual(target.log, want) {
		t.Fatalf("the sink saw %q, want %q", target.log, want)
	}
}
