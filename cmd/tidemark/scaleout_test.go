package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"tidemark"
)

// fakeKafka is the tailer's Kafka sink for tailerTarget's tests: function
// fields answer Watermark and record the boundaries.
type fakeKafka struct {
	tidemark.Sink
	watermark func(table tidemark.TableID) (time.Time, bool)
	calls     []string
}

func (f *fakeKafka) Watermark(_ context.Context, _ string, table tidemark.TableID) (time.Time, bool, error) {
	at, ok := f.watermark(table)
	return at, ok, nil
}

func (f *fakeKafka) BeginSnapshot(_ context.Context, _ string, table tidemark.TableID, reason string) error {
	f.calls = append(f.calls, "begin "+table.String())
	return nil
}

func (f *fakeKafka) EndSnapshot(_ context.Context, _ string, table tidemark.TableID, v tidemark.Version) error {
	f.calls = append(f.calls, "end "+table.String()+" "+v.String())
	return nil
}

// fakeLock is the tailer's lock target: table states in memory.
type fakeLock struct {
	lockTarget
	states map[tidemark.TableID]tidemark.TableState
}

func (l *fakeLock) SetTableState(_ context.Context, _ string, st tidemark.TableState) error {
	l.states[st.Table] = st
	return nil
}

func (l *fakeLock) SwapTableState(_ context.Context, _ string, old tidemark.TableMode, st tidemark.TableState) (bool, error) {
	if l.states[st.Table].Mode != old {
		return false, nil
	}
	l.states[st.Table] = st
	return true, nil
}

// TestTailerSnapshotReadsInFull: while the scale-out tailer snapshots a
// table (ResetTable … EndSnapshot) the table's catch-up watermark is not
// seen, so the snapshot reads the table in full — a window would leave the
// rows outside it to the end boundary, which removes them from the
// appliers' target. Other tables keep theirs; after the end the table's
// counts again. An ALTER TABLE that renames a column requests a resync.
func TestTailerSnapshotReadsInFull(t *testing.T) {
	ctx := context.Background()
	a, b := tidemark.TableID{Database: "d", Name: "a"}, tidemark.TableID{Database: "d", Name: "b"}
	mark := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	k := &fakeKafka{watermark: func(tidemark.TableID) (time.Time, bool) { return mark, true }}
	lock := &fakeLock{states: map[tidemark.TableID]tidemark.TableState{}}
	tt := tailerTarget{Sink: k, snap: k, ddl: nopDDL{}, lock: lock, resets: &resetTables{ids: map[tidemark.TableID]bool{}}}
	has := func(id tidemark.TableID) bool {
		t.Helper()
		_, ok, err := tt.Watermark(ctx, "s", id)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	snap := func(ctx context.Context, tables []tidemark.TableID) (tidemark.Version, error) {
		if has(a) || !has(b) {
			t.Errorf("during the snapshot of %v: watermark of a seen %v (want false), of b %v (want true)", tables, has(a), has(b))
		}
		return tidemark.Version{Seq: 9}, nil
	}
	if _, err := tidemark.Resnapshot(ctx, tt, "s", a, snap, "resync requested"); err != nil {
		t.Fatal(err)
	}
	if !has(a) {
		t.Error("after the snapshot the watermark of a is still hidden")
	}
	if got := strings.Join(k.calls, "|"); got != "begin d.a|end d.a "+(tidemark.Version{Seq: 9}).String() {
		t.Errorf("boundaries: %s", got)
	}
	rename := tidemark.DDLEvent{Op: tidemark.DDLAlterTable, Table: b, Renames: []tidemark.ColumnRename{{From: "x", To: "y"}}}
	if err := tt.ApplyDDL(ctx, "s", []tidemark.DDLEvent{rename}, tidemark.Position{}); err != nil {
		t.Fatal(err)
	}
	if st := lock.states[b]; st.Mode != tidemark.TableResyncRequested {
		t.Errorf("after a column rename: state %+v, want a resync request", st)
	}
}

type nopDDL struct{}

func (nopDDL) PublishDDL(context.Context, string, []tidemark.DDLEvent, tidemark.Position) error {
	return nil
}

func (nopDDL) HasTopic(context.Context, string, tidemark.TableID) (bool, error) { return true, nil }
