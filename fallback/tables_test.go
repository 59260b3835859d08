package fallback

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"tidemark"
)

// fakeRegistry is a Registry in memory: table states, the
// tables it was asked to ensure, and the indexes mirrored (mirror, if set,
// fails a table's mirroring).
type fakeRegistry struct {
	mu       sync.Mutex // tables read at once record their states at once
	states   map[tidemark.TableID]tidemark.TableState
	ensured  []tidemark.TableID
	mirrored []tidemark.TableID
	mirror   func(id tidemark.TableID) error
}

func (f *fakeRegistry) TableStates(ctx context.Context, source string) ([]tidemark.TableState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []tidemark.TableState
	for _, st := range f.states {
		out = append(out, st)
	}
	return out, nil
}
func (f *fakeRegistry) SetTableState(ctx context.Context, source string, st tidemark.TableState) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.states[st.Table] = st
	return nil
}
func (f *fakeRegistry) SwapTableState(ctx context.Context, source string, old tidemark.TableMode, st tidemark.TableState) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.states[st.Table].Mode != old {
		return false, nil
	}
	f.states[st.Table] = st
	return true, nil
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
// run goes on without it, after the same capture; the others are loaded, their indexes mirrored,
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
// alone) gets a catch-up of every table; a table it cannot follow is left
// out (logged, as the stream quarantines it for the process's life) and
// the others are loaded, the checkpoint stored.
func TestRunStreamingWithoutRegistry(t *testing.T) {
	c, tgt, _, read := streamingFixture(t)
	rep, err := c.RunStreaming(context.Background(), noIndexes{}, nil, tgt)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range *read {
		if id.Name == "items" {
			t.Fatalf("read %s, which the run cannot follow", id)
		}
	}
	if len(rep.Tables) != 2 || rep.Tables[0].Table != tid || rep.Tables[1].Table.Name != "notes" {
		t.Fatalf("report tables %+v, want orders and notes", rep.Tables)
	}
	last := tgt.batches[len(tgt.batches)-1]
	if last.Checkpoint != snap.Position || len(last.Changes) != 0 {
		t.Fatalf("last batch %+v, want the checkpoint alone", last)
	}
}

// TestRunStreamingFirstRunLeavesOutOneTable (nemesis seeds 112235448234
// and 107849400749): in a first run, a table without a key is quarantined
// and a table renamed away after the listing is left out, and the run goes
// on after the same capture: the other table is read in full as in any
// first run (its watermark, of a first run that did not finish, is not
// trusted), and the captured position is the checkpoint. Before, the
// keyless table stopped the run without a registry, and with one the run
// was repeated after a second capture as a catch-up that is no first run
// (a window read from the stale watermark); the gone table stopped it.
func TestRunStreamingFirstRunLeavesOutOneTable(t *testing.T) {
	nokey := tidemark.TableID{Database: "shop", Name: "a_nokey"}
	gone := tidemark.TableID{Database: "shop", Name: "z_gho"}
	captures := 0
	var reqs []tidemark.ReadRequest
	src := &fakeSource{
		capture: func() (tidemark.Snapshot, error) { captures++; return snap, nil },
		tables:  []tidemark.TableID{nokey, tid, gone},
		tableOf: func(id tidemark.TableID) (*tidemark.Table, error) {
			switch id {
			case nokey:
				return nil, &tidemark.TableError{Table: id, Err: fmt.Errorf("read schema of %s: table has no primary key (configure business_keys for it): %w", id, tidemark.ErrUndecodable)}
			case gone:
				return nil, fmt.Errorf("read schema of %s: table not found on source s: %w", id, tidemark.ErrTableGone)
			}
			return table, nil
		},
		maxTime: func(string) (time.Time, bool, error) { return now, true, nil },
		read: func(req tidemark.ReadRequest) (tidemark.ReadResult, error) {
			reqs = append(reqs, req)
			return tidemark.ReadResult{Changes: rows(1)}, nil
		},
	}
	tgt := &fakeTarget{firstRun: true, watermark: func() (time.Time, bool, error) { return now.Add(-time.Minute), true, nil }}
	c, err := New(Config{Source: "s", Tables: map[string]TableConfig{
		"shop.orders": {Column: "updated_at"}, "shop.a_nokey": {Column: "updated_at"}, "shop.z_gho": {Column: "updated_at"},
	}}, src, tgt)
	if err != nil {
		t.Fatal(err)
	}
	for _, withReg := range []bool{true, false} {
		t.Run(fmt.Sprintf("registry=%v", withReg), func(t *testing.T) {
			captures, reqs, tgt.batches = 0, nil, nil
			reg := &fakeRegistry{states: map[tidemark.TableID]tidemark.TableState{}}
			var r Registry
			if withReg {
				r = reg
			}
			rep, err := c.RunStreaming(context.Background(), noIndexes{}, r, tgt)
			if err != nil {
				t.Fatal(err)
			}
			if captures != 1 {
				t.Errorf("%d captures, want 1 (one position before every read)", captures)
			}
			if withReg {
				if st := reg.states[nokey]; st.Mode != tidemark.TableQuarantined || !strings.Contains(st.Reason, "no primary key") {
					t.Errorf("a_nokey: state %+v, want quarantined for its missing key", st)
				}
				if _, ok := reg.states[gone]; ok {
					t.Errorf("z_gho has a state %+v: the stream follows its RENAME", reg.states[gone])
				}
			}
			if len(reqs) != 1 || reqs[0].Table != tid || !reqs[0].Lower.IsZero() || reqs[0].Column != "" {
				t.Errorf("reads %+v, want one full read of orders", reqs)
			}
			modes := map[string]string{}
			for _, tr := range rep.Tables {
				modes[tr.Table.Name] = tr.Mode
			}
			if modes["orders"] != "snapshot" || modes["z_gho"] != "gone" {
				t.Errorf("report modes %v, want orders: snapshot, z_gho: gone", modes)
			}
			last := tgt.batches[len(tgt.batches)-1]
			if last.Checkpoint != snap.Position || len(last.Changes) != 0 {
				t.Errorf("last batch %+v, want the checkpoint alone", last)
			}
		})
	}
}
