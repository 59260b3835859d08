package tidemark

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestTableSetPut: put reports a change for a new table and for another
// mode, floor or reason, not for the same state recorded again.
func TestTableSetPut(t *testing.T) {
	var s tableSet // the zero value is ready
	id := TableID{Database: "d", Name: "t"}
	for i, tc := range []struct {
		st      TableState
		changed bool
	}{
		{TableState{Table: id, Mode: TableStreaming}, true},
		{TableState{Table: id, Mode: TableStreaming}, false},
		{TableState{Table: id, Mode: TableStreaming, UpdatedAt: time.Unix(1, 0)}, false},
		{TableState{Table: id, Mode: TableQuarantined, Reason: "r"}, true},
		{TableState{Table: id, Mode: TableQuarantined, Reason: "other"}, true},
		{TableState{Table: id, Mode: TableStreaming, Reason: "other", Floor: Version{Seq: 3}}, true},
		{TableState{Table: id, Mode: TableStreaming, Reason: "other", Floor: Version{Seq: 4}}, true},
		{TableState{Table: id, Mode: TableStreaming, Reason: "other", Floor: Version{Seq: 4}}, false},
	} {
		if got := s.put(tc.st); got != tc.changed {
			t.Fatalf("put %d (%+v): changed %v, want %v", i, tc.st, got, tc.changed)
		}
		if got, ok := s.get(id); !ok || got != tc.st {
			t.Fatalf("put %d: get returned %+v, %v", i, got, ok)
		}
	}
	s.forget(id)
	if _, ok := s.get(id); ok {
		t.Fatal("forget kept the table")
	}
	if !s.put(TableState{Table: id, Mode: TableStreaming, Reason: "other", Floor: Version{Seq: 4}}) {
		t.Fatal("a forgotten table is not new again")
	}
}

// TestTableSetFilter: changes of a quarantined or snapshotting table and
// changes older than a streaming table's floor are removed and counted;
// changes of streaming tables from the floor on and of unknown tables are
// kept, in order.
func TestTableSetFilter(t *testing.T) {
	tbl := func(name string) *Table { return &Table{ID: TableID{Database: "d", Name: name}} }
	a, q, sn, u := tbl("a"), tbl("q"), tbl("s"), tbl("unknown")
	var s tableSet
	s.put(TableState{Table: a.ID, Mode: TableStreaming, Floor: Version{Seq: 5, Index: 2}})
	s.put(TableState{Table: q.ID, Mode: TableQuarantined})
	s.put(TableState{Table: sn.ID, Mode: TableSnapshotting})
	b := &Batch{Changes: []Change{
		{Table: a, Version: Version{Seq: 5, Index: 1}}, // older than the floor
		{Table: q, Version: Version{Seq: 9}},
		{Table: a, Version: Version{Seq: 5, Index: 2}}, // at the floor
		{Table: u, Version: Version{Seq: 1}},
		{Table: sn, Version: Version{Seq: 9}},
		{Table: a, Version: Version{Seq: 6}},
	}}
	if !s.hasUnknown(b) {
		t.Fatal("hasUnknown missed the unknown table")
	}
	s.filter(b)
	var got []string
	for _, c := range b.Changes {
		got = append(got, c.Table.ID.Name+"@"+c.Version.String())
	}
	want := []string{"a@" + (Version{Seq: 5, Index: 2}).String(), "unknown@" + (Version{Seq: 1}).String(), "a@" + (Version{Seq: 6}).String()}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("kept %v, want %v", got, want)
	}
	if n := s.skippedChanges(); n != 3 {
		t.Fatalf("skipped %d, want 3", n)
	}
	s.put(TableState{Table: u.ID, Mode: TableStreaming})
	if s.hasUnknown(b) {
		t.Fatal("hasUnknown after every table is known")
	}
	list := s.list()
	if len(list) != 4 || list[0].Table != a.ID || list[1].Table != q.ID || list[2].Table != sn.ID || list[3].Table != u.ID {
		t.Fatalf("list not sorted by name: %+v", list)
	}
	s.reset()
	if len(s.list()) != 0 {
		t.Fatal("reset kept tables")
	}
}

// TestResnapshotStopsWhenFenced: a snapshot that fails because another
// instance took over writing for the source (the Kafka sink fenced: nemesis
// seed 25, a tailer a standby had just taken over from was
// re-snapshotting a table for a resync) stops the pipeline with that
// error; the table is not quarantined (a snapshot that fails on the table
// itself still is).
func TestResnapshotStopsWhenFenced(t *testing.T) {
	id := TableID{Database: "d", Name: "t"}
	for _, tc := range []struct {
		name       string
		err        error
		quarantine bool
	}{
		{"fenced", fmt.Errorf("catch up d.t: sink/kafka: fenced by another instance with transactional id tm-s: %w", ErrFenced), false},
		{"lock lost", fmt.Errorf("catch up d.t: %w of s", ErrSourceLockLost), false},
		{"the table's own failure", errors.New("read d.t: table has no primary key"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := &memRegistry{}
			p := &Pipeline{cfg: PipelineConfig{Source: "s", Snapshot: func(context.Context, []TableID) (Version, error) { return Version{}, tc.err }}, reg: reg}
			p.cfg.setDefaults()
			err := p.resnapshot(context.Background(), id, "resync requested")
			quarantined := reg.states[id].Mode == TableQuarantined
			if quarantined != tc.quarantine || (err == nil) != tc.quarantine {
				t.Fatalf("resnapshot = %v, table state %+v; want quarantined %v (and no error), or the error", err, reg.states[id], tc.quarantine)
			}
			if !tc.quarantine && !errors.Is(err, tc.err) {
				t.Fatalf("resnapshot = %v, want %v", err, tc.err)
			}
		})
	}
}

// resetRefused is a registry whose ResetTable refuses the table itself.
type resetRefused struct{ *memRegistry }

func (r resetRefused) ResetTable(_ context.Context, _ string, id TableID) error {
	return &TableError{Table: id, Err: errors.New("map table to PostgreSQL: invalid identifier")}
}

// TestResnapshotQuarantinesWhenTheTargetRefusesTheTable: a table the
// target cannot hold (a gh-ost _<table>_del renamed in under a name past
// PostgreSQL's 63 bytes) fails Resnapshot's ResetTable with a TableError:
// the table is quarantined and the pipeline goes on. Nemesis seed 31 (a
// 63-byte table name and the gh-ost cut-over) stopped the daemon before:
// "resnapshot …_del: table …_del: map table … to PostgreSQL: invalid
// identifier".
func TestResnapshotQuarantinesWhenTheTargetRefusesTheTable(t *testing.T) {
	id := TableID{Database: "d", Name: "_t_del"}
	reg := resetRefused{&memRegistry{}}
	p := &Pipeline{cfg: PipelineConfig{Source: "s", Snapshot: func(context.Context, []TableID) (Version, error) { return Version{}, nil }}, reg: reg}
	p.cfg.setDefaults()
	if err := p.resnapshot(context.Background(), id, "renamed from d.t"); err != nil {
		t.Fatalf("resnapshot = %v, want the table quarantined and no error", err)
	}
	if st := reg.states[id]; st.Mode != TableQuarantined || !strings.Contains(st.Reason, "invalid identifier") {
		t.Fatalf("table state %+v, want quarantined naming the cause", st)
	}
}

// staleRegistry returns the states as they were when TableStates was
// called, after running during: the registry read of pendingSnapshots that
// a batch applying in the background overtakes.
type staleRegistry struct {
	*memRegistry
	during func()
}

func (r staleRegistry) TableStates(context.Context, string) ([]TableState, error) {
	var out []TableState
	for _, st := range r.states {
		out = append(out, st)
	}
	if r.during != nil {
		r.during()
	}
	return out, nil
}

// TestPendingSnapshotsKeepsAQuarantineMadeMeanwhile: pendingSnapshots (on
// the state tick, while a batch applies in the background) reads the
// recorded states; a quarantine the batch records after that read must
// not be undone in memory by the older state read, for up to
// StateInterval (2 s), during which the table's changes applied again.
func TestPendingSnapshotsKeepsAQuarantineMadeMeanwhile(t *testing.T) {
	ctx := context.Background()
	id := TableID{Database: "d", Name: "t"}
	var p *Pipeline
	reg := staleRegistry{memRegistry: &memRegistry{}}
	var reported []TableMode
	p = &Pipeline{cfg: PipelineConfig{Source: "s", OnTableState: func(st TableState) { reported = append(reported, st.Mode) }}, reg: reg}
	p.cfg.setDefaults()
	if err := p.setState(ctx, TableState{Table: id, Mode: TableStreaming}); err != nil {
		t.Fatal(err)
	}
	reg.during = func() {
		// The batch in flight: the sink refused the table.
		if err := p.quarantine(ctx, id, errors.New("convert value of d.t.c: text contains a NUL byte")); err != nil {
			t.Error(err)
		}
	}
	p.reg = reg
	if err := p.pendingSnapshots(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if st, _ := p.state(id); st.Mode != TableQuarantined {
		t.Errorf("state in memory after pendingSnapshots: %s; want quarantined (reported %v)", st.Mode, reported)
	}
	b := &Batch{Changes: []Change{{Table: &Table{ID: id}, Op: OpInsert, Version: Version{Seq: 9}}}}
	p.tables.filter(b)
	if len(b.Changes) != 0 {
		t.Errorf("a change of the quarantined table passes the filter")
	}
	// A later read, which sees the quarantine, changes nothing.
	reg.during = nil
	if err := p.pendingSnapshots(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if st, _ := p.state(id); st.Mode != TableQuarantined {
		t.Errorf("state in memory after the next read: %s; want quarantined", st.Mode)
	}
}
