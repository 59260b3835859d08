package fallback

import (
	"context"
	"errors"
	"testing"
	"time"

	"tidemark"
)

// fakeRegistry is a Registry in memory: table states, the
// tables it was asked to ensure, and the indexes mirrored (mirror, if set,
// fails a table's mirroring).
type fakeRegistry struct {
	states   map[tidemark.TableID]tidemark.TableState
	ensured  []tidemark.TableID
	mirrored []tidemark.TableID
	mirror   func(id tidemark.TableID) error
}

func (f *fakeRegistry) TableStates(ctx context.Context, source string) ([]tidemark.TableState, error) {
	var out []tidemark.TableState
	for _, st := range f.states {
		out = append(out, st)
	}
	return out, nil
}
func (f *fakeRegistry) SetTableState(ctx context.Context, source string, st tidemark.TableState) error {
	f.states[st.Table] = st
	return nil
}
func (f *fakeRegistry) HasTable(ctx context.Context, id tidemark.TableID) (bool, error) {
	return true, nil
}
func (f *fakeRegistry) ResetTable(ctx context.Context, source string, id tidemark.TableID) error {
	return nil
}
func (f *fakeRegistry) EnsureTable(ctx context.Context, t *tidemark.Table) error {
	f.ensured = append(f.ensured, t.ID)
	return nil
}
func (f *fakeRegistry) MirrorIndexes(ctx context.Context, id tidemark.TableID, idx []tidemark.Index) error {
	if f.mirror != nil {
		if err := f.mirror(id); err != nil {
			return err
		}
	}
	f.mirrored = append(f.mirrored, id)
	return nil
}

// noIndexes is the source's tidemark.IndexLister: no secondary index.
type noIndexes struct{}

func (noIndexes) Indexes(ctx context.Context, id tidemark.TableID) ([]tidemark.Index, error) {
	return nil, nil
}

// streamingFixture is three tables of one source: orders (dated rows),
// items (its watermark column is missing from the source: a TableError),
// notes (quarantined before the run).
func streamingFixture(t *testing.T) (*CatchUp, *fakeTarget, *fakeRegistry, *[]tidemark.TableID) {
	items := tidemark.TableID{Database: "shop", Name: "items"}
	notes := tidemark.TableID{Database: "shop", Name: "notes"}
	var read []tidemark.TableID
	src := &fakeSource{
		capture: func() (tidemark.Snapshot, error) { return snap, nil },
		tables:  []tidemark.TableID{tid, items, notes}, table: table,
		maxTime: func(string) (time.Time, bool, error) { return now, true, nil },
		read: func(req tidemark.ReadRequest) (tidemark.ReadResult, error) {
			read = append(read, req.Table)
			return tidemark.ReadResult{}, nil
		},
	}
	tgt := &fakeTarget{watermark: func() (time.Time, bool, error) { return time.Time{}, false, nil }}
	c, err := New(Config{Source: "s", Tables: map[string]TableConfig{
		"shop.orders": {Column: "updated_at"},
		"shop.items":  {Column: "gone"},
	}}, src, tgt)
	if err != nil {
		t.Fatal(err)
	}
	reg := &fakeRegistry{states: map[tidemark.TableID]tidemark.TableState{
		notes: {Table: notes, Mode: tidemark.TableQuarantined, Reason: "before"},
	}}
	return c, tgt, reg, &read
}

// TestRunStreamingQuarantinesAndGoesOn: a table already quarantined is not
// read; a table the run cannot follow is quarantined (naming why) and the
// run repeated without it; the others are loaded, their indexes mirrored,
// and the captured position stored as the checkpoint through the given
// sink.
func TestRunStreamingQuarantinesAndGoesOn(t *testing.T) {
	c, tgt, reg, read := streamingFixture(t)
	rep, err := c.RunStreaming(context.Background(), noIndexes{}, reg, tgt)
	if err != nil {
		t.Fatal(err)
	}
	items := tidemark.TableID{Database: "shop", Name: "items"}
	if st := reg.states[items]; st.Mode != tidemark.TableQuarantined || st.Reason == "" {
		t.Fatalf("items: state %+v, want quarantined with a reason", st)
	}
	for _, id := range *read {
		if id != tid {
			t.Fatalf("read %s; only %s is streaming and followable", id, tid)
		}
	}
	if len(rep.Tables) != 1 || rep.Tables[0].Table != tid {
		t.Fatalf("report tables %+v", rep.Tables)
	}
	if len(reg.mirrored) != 1 || reg.mirrored[0] != tid {
		t.Fatalf("mirrored %v, want only %s", reg.mirrored, tid)
	}
	last := tgt.batches[len(tgt.batches)-1]
	if last.Checkpoint != snap.Position || len(last.Changes) != 0 {
		t.Fatalf("last batch %+v, want the checkpoint alone", last)
	}
}

// TestRunStreamingQuarantinesOnMirror: rows that violate a mirrored
// constraint quarantine their table (a TableError from MirrorIndexes); any
// other mirroring error fails the run.
func TestRunStreamingQuarantinesOnMirror(t *testing.T) {
	c, tgt, reg, _ := streamingFixture(t)
	reg.mirror = func(id tidemark.TableID) error {
		return &tidemark.TableError{Table: id, Err: errors.New("NOT NULL violated")}
	}
	if _, err := c.RunStreaming(context.Background(), noIndexes{}, reg, tgt); err != nil {
		t.Fatal(err)
	}
	if st := reg.states[tid]; st.Mode != tidemark.TableQuarantined {
		t.Fatalf("orders: state %+v, want quarantined", st)
	}

	c, tgt, reg, _ = streamingFixture(t)
	boom := errors.New("connection lost")
	reg.mirror = func(tidemark.TableID) error { return boom }
	if _, err := c.RunStreaming(context.Background(), noIndexes{}, reg, tgt); !errors.Is(err, boom) {
		t.Fatalf("error %v, want %v", err, boom)
	}
}

// TestSnapshotterEnsuresEmptyTables: a snapshot of a table with no rows
// creates its target table; a table gone from the source is not read.
func TestSnapshotterEnsuresEmptyTables(t *testing.T) {
	c, _, reg, read := streamingFixture(t)
	gone := tidemark.TableID{Database: "shop", Name: "gone"}
	var reports int
	v, err := c.Snapshotter(noIndexes{}, reg, func(Report) { reports++ })(context.Background(), []tidemark.TableID{tid, gone})
	if err != nil {
		t.Fatal(err)
	}
	if v != snap.Version || reports != 1 {
		t.Fatalf("version %v, %d reports", v, reports)
	}
	if len(reg.ensured) != 1 || reg.ensured[0] != table.ID || len(reg.mirrored) != 1 {
		t.Fatalf("ensured %v, mirrored %v", reg.ensured, reg.mirrored)
	}
	for _, id := range *read {
		if id == gone {
			t.Fatal("read a table gone from the source")
		}
	}
}

// TestRunStreamingWithoutRegistry: a target without table states (Kafka
// alone) gets a catch-up of every table; a table it cannot follow fails the
// run, naming the table (there is nowhere to quarantine it).
func TestRunStreamingWithoutRegistry(t *testing.T) {
	c, tgt, _, read := streamingFixture(t)
	_, err := c.RunStreaming(context.Background(), noIndexes{}, nil, tgt)
	var te *tidemark.TableError
	if !errors.As(err, &te) || te.Table.Name != "items" {
		t.Fatalf("error %v, want a TableError of shop.items", err)
	}
	if len(*read) == 0 || (*read)[0] != tid {
		t.Fatalf("read %v, want shop.orders first", *read)
	}
}
