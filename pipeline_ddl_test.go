package tidemark

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// ddlFunc is a DDLSink of one function field.
type ddlFunc func(events []DDLEvent, cp Position) error

func (f ddlFunc) ApplyDDL(ctx context.Context, source string, events []DDLEvent, cp Position) error {
	return f(events, cp)
}

func ddlPipeline(sink DDLSink) *Pipeline {
	p := &Pipeline{cfg: PipelineConfig{Source: "s"}, ddl: sink}
	p.cfg.setDefaults()
	return p
}

// TestApplyDDL: a statement the sink refuses for one table quarantines that
// table and the others are applied (with the checkpoint); a DROP TABLE that
// applied forgets its table; an error that names no table of the events, or
// is not a *TableError, stops.
func TestApplyDDL(t *testing.T) {
	ctx := context.Background()
	a, b, c := TableID{Database: "d", Name: "a"}, TableID{Database: "d", Name: "b"}, TableID{Database: "d", Name: "c"}
	cp := Position{GTID: "0-1-7"}
	events := func() []DDLEvent {
		return []DDLEvent{{Op: DDLAlterTable, Table: a}, {Op: DDLTruncate, Table: b}, {Op: DDLDropTable, Table: c}}
	}

	var calls [][]TableID
	p := ddlPipeline(ddlFunc(func(evs []DDLEvent, got Position) error {
		var ids []TableID
		for _, ev := range evs {
			ids = append(ids, ev.Table)
			if ev.Table == b {
				calls = append(calls, ids)
				return &TableError{Table: b, Err: ErrDDLRefused}
			}
		}
		if got != cp {
			return fmt.Errorf("checkpoint %v, want %v", got, cp)
		}
		calls = append(calls, ids)
		return nil
	}))
	p.tables.put(TableState{Table: c, Mode: TableStreaming})
	committed, err := p.applyDDL(ctx, events(), cp)
	if err != nil || !committed {
		t.Fatalf("applyDDL: committed %v, err %v", committed, err)
	}
	if len(calls) != 2 || len(calls[1]) != 2 || calls[1][0] != a || calls[1][1] != c {
		t.Fatalf("sink calls %v; want the refused table's event dropped and the rest applied", calls)
	}
	if st, _ := p.tables.get(b); st.Mode != TableQuarantined || st.Reason != ErrDDLRefused.Error() {
		t.Fatalf("refused table's state %+v", st)
	}
	if _, ok := p.tables.get(c); ok {
		t.Fatal("dropped table's state kept")
	}

	// Every event refused: nothing committed, no error.
	p = ddlPipeline(ddlFunc(func(evs []DDLEvent, _ Position) error { return &TableError{Table: evs[0].Table, Err: ErrDDLRefused} }))
	if committed, err := p.applyDDL(ctx, events(), cp); err != nil || committed {
		t.Fatalf("all refused: committed %v, err %v", committed, err)
	}
	for _, id := range []TableID{a, b, c} {
		if st, _ := p.tables.get(id); st.Mode != TableQuarantined {
			t.Fatalf("%s: %+v, want quarantined", id, st)
		}
	}

	// Errors that stop.
	for name, sinkErr := range map[string]error{
		"not a table error":          errors.New("connection lost"),
		"a table without its events": &TableError{Table: TableID{Database: "d", Name: "other"}, Err: ErrDDLRefused},
	} {
		p = ddlPipeline(ddlFunc(func([]DDLEvent, Position) error { return sinkErr }))
		if _, err := p.applyDDL(ctx, events(), cp); !errors.Is(err, sinkErr) {
			t.Fatalf("%s: err %v, want %v", name, err, sinkErr)
		}
	}
}

// TestSortDDL: events of a skipped table are dropped, an undecodable
// statement quarantines its table, creates are set apart, and an ALTER
// TABLE that needs a backfill is recorded as snapshotting only when the
// pipeline can snapshot.
func TestSortDDL(t *testing.T) {
	ctx := context.Background()
	q, u, n, al := TableID{Database: "d", Name: "q"}, TableID{Database: "d", Name: "u"}, TableID{Database: "d", Name: "n"}, TableID{Database: "d", Name: "al"}
	in := []DDLEvent{
		{Op: DDLTruncate, Table: q},
		{Op: DDLUndecodable, Table: u, Reason: "ALTER ..."},
		{Op: DDLCreateTable, Table: n},
		{Op: DDLAlterTable, Table: al, Backfill: true},
	}
	p := ddlPipeline(nil)
	p.tables.put(TableState{Table: q, Mode: TableQuarantined})
	events, creates, backfills, err := p.sortDDL(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 1 || events[0].Table != al || len(creates) != 1 || creates[0].Table != n {
		t.Fatalf("events %v creates %v", events, creates)
	}
	if len(backfills) != 0 {
		t.Fatalf("backfills %v without a snapshot function", backfills)
	}
	if st, _ := p.tables.get(u); st.Mode != TableQuarantined || !strings.Contains(st.Reason, ErrUndecodable.Error()) || !strings.Contains(st.Reason, "ALTER ...") {
		t.Fatalf("undecodable table's state %+v", st)
	}

	// With a registry and a snapshot function the backfill is recorded in
	// the target before the ALTER applies.
	reg := &memRegistry{}
	p = ddlPipeline(nil)
	p.reg = reg
	p.cfg.Snapshot = func(context.Context, []TableID) (Version, error) { return Version{}, nil }
	if _, _, backfills, err = p.sortDDL(ctx, in); err != nil {
		t.Fatal(err)
	}
	if len(backfills) != 1 || backfills[0] != al {
		t.Fatalf("backfills %v, want [%s]", backfills, al)
	}
	if st := reg.states[al]; st.Mode != TableSnapshotting {
		t.Fatalf("recorded state of the altered table %+v, want snapshotting", st)
	}
}

// memRegistry is a TableRegistry in memory.
type memRegistry struct{ states map[TableID]TableState }

func (r *memRegistry) TableStates(context.Context, string) ([]TableState, error) { return nil, nil }
func (r *memRegistry) SetTableState(_ context.Context, _ string, st TableState) error {
	if r.states == nil {
		r.states = map[TableID]TableState{}
	}
	r.states[st.Table] = st
	return nil
}
func (r *memRegistry) SwapTableState(ctx context.Context, source string, old TableMode, st TableState) (bool, error) {
	if r.states[st.Table].Mode != old {
		return false, nil
	}
	return true, r.SetTableState(ctx, source, st)
}
func (r *memRegistry) HasTable(context.Context, TableID) (bool, error)   { return false, nil }
func (r *memRegistry) ResetTable(context.Context, string, TableID) error { return nil }
func (r *memRegistry) EnsureTable(context.Context, *Table) error         { return nil }
