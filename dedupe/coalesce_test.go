package dedupe

import (
	"reflect"
	"strings"
	"testing"

	"tidemark"
)

func TestCoalesce(t *testing.T) {
	schema2 := newTable("shop", "orders") // same table, new *Table: a schema change
	withBefore := func(c tidemark.Change, b []any) tidemark.Change { c.Before = b; return c }
	withSize := func(c tidemark.Change, n int) tidemark.Change { c.Size = n; return c }
	tests := []struct {
		name string
		soft bool
		in   []tidemark.Change
		want []tidemark.Change
	}{
		{
			name: "single change is kept",
			in:   []tidemark.Change{upd(1, "A", "B", ver(1, 1), sec(0))},
			want: []tidemark.Change{upd(1, "A", "B", ver(1, 1), sec(0))},
		},
		{
			name: "insert + update is an insert with the final image",
			in:   []tidemark.Change{ins(1, "A", ver(1, 1), sec(0)), upd(1, "A", "B", ver(1, 2), sec(0)), upd(1, "B", "C", ver(2, 1), sec(1))},
			want: []tidemark.Change{ins(1, "C", ver(2, 1), sec(1))},
		},
		{
			name: "update + update is an update from the first Before to the last After",
			in:   []tidemark.Change{upd(1, "A", "B", ver(1, 1), sec(0)), upd(1, "B", "C", ver(2, 1), sec(1))},
			want: []tidemark.Change{withSize(upd(1, "A", "C", ver(2, 1), sec(1)), 200)},
		},
		{
			name: "update + delete is the delete",
			in:   []tidemark.Change{upd(1, "A", "B", ver(1, 1), sec(0)), del(1, "B", ver(2, 1), sec(1))},
			want: []tidemark.Change{del(1, "B", ver(2, 1), sec(1))},
		},
		{
			name: "insert + delete is the delete with hard deletes (a replayed batch may straddle a commit)",
			in:   []tidemark.Change{ins(1, "A", ver(1, 1), sec(0)), upd(1, "A", "B", ver(1, 2), sec(0)), del(1, "B", ver(2, 1), sec(1))},
			want: []tidemark.Change{del(1, "B", ver(2, 1), sec(1))},
		},
		{
			name: "insert + delete is a deleted row with soft deletes",
			soft: true,
			in:   []tidemark.Change{ins(1, "A", ver(1, 1), sec(0)), del(1, "A", ver(2, 1), sec(1))},
			want: []tidemark.Change{del(1, "A", ver(2, 1), sec(1))},
		},
		{
			name: "delete + insert is an upsert of the insert image",
			in:   []tidemark.Change{del(1, "A", ver(1, 1), sec(0)), ins(1, "B", ver(2, 1), sec(1))},
			want: []tidemark.Change{ins(1, "B", ver(2, 1), sec(1))},
		},
		{
			name: "update + delete + insert + update is an upsert of the last image",
			in: []tidemark.Change{
				upd(1, "A", "B", ver(1, 1), sec(0)), del(1, "B", ver(1, 2), sec(0)),
				ins(1, "C", ver(2, 1), sec(1)), upd(1, "C", "D", ver(3, 1), sec(2)),
			},
			want: []tidemark.Change{ins(1, "D", ver(3, 1), sec(2))},
		},
		{
			name: "A→B→A is an update to A at the last version",
			in:   []tidemark.Change{upd(1, "A", "B", ver(1, 1), sec(0)), upd(1, "B", "A", ver(2, 1), sec(1))},
			want: []tidemark.Change{withSize(upd(1, "A", "A", ver(2, 1), sec(1)), 200)},
		},
		{
			name: "read + update is an update from the read image",
			in:   []tidemark.Change{read(1, "A", ver(5, 0), sec(0)), upd(1, "A", "B", ver(5, 1), sec(1))},
			want: []tidemark.Change{withSize(upd(1, "A", "B", ver(5, 1), sec(1)), 200)},
		},
		{
			name: "read + read is the last read",
			in:   []tidemark.Change{read(1, "A", ver(5, 0), sec(0)), read(1, "B", ver(6, 0), sec(1))},
			want: []tidemark.Change{read(1, "B", ver(6, 0), sec(1))},
		},
		{
			name: "read + delete is the delete",
			in:   []tidemark.Change{read(1, "A", ver(5, 0), sec(0)), del(1, "A", ver(5, 1), sec(1))},
			want: []tidemark.Change{del(1, "A", ver(5, 1), sec(1))},
		},
		{
			name: "older change inside the batch is merged away",
			in:   []tidemark.Change{upd(1, "B", "C", ver(3, 1), sec(2)), upd(1, "A", "B", ver(2, 1), sec(1)), upd(1, "C", "C", ver(3, 1), sec(2))},
			want: []tidemark.Change{upd(1, "B", "C", ver(3, 1), sec(2))},
		},
		{
			name: "net change takes the place of the first appearance",
			in: []tidemark.Change{
				ins(1, "A", ver(1, 1), sec(0)), ins(2, "X", ver(1, 2), sec(0)),
				upd(1, "A", "B", ver(2, 1), sec(1)), on(tabB, ins(1, "Q", ver(2, 2), sec(1))),
			},
			want: []tidemark.Change{ins(1, "B", ver(2, 1), sec(1)), ins(2, "X", ver(1, 2), sec(0)), on(tabB, ins(1, "Q", ver(2, 2), sec(1)))},
		},
		{
			name: "same key in two tables is not merged",
			in:   []tidemark.Change{ins(1, "A", ver(1, 1), sec(0)), on(tabB, del(1, "A", ver(2, 1), sec(1)))},
			want: []tidemark.Change{ins(1, "A", ver(1, 1), sec(0)), on(tabB, del(1, "A", ver(2, 1), sec(1)))},
		},
		{
			name: "key change is a barrier for both keys",
			in: []tidemark.Change{
				ins(1, "A", ver(1, 1), sec(0)), del(2, "Z", ver(1, 2), sec(0)),
				move(1, 2, "A", ver(2, 1), sec(1)),
				upd(2, "A", "B", ver(3, 1), sec(2)), ins(1, "N", ver(3, 2), sec(2)), upd(2, "B", "C", ver(4, 1), sec(3)),
			},
			want: []tidemark.Change{
				ins(1, "A", ver(1, 1), sec(0)), del(2, "Z", ver(1, 2), sec(0)),
				move(1, 2, "A", ver(2, 1), sec(1)),
				withSize(upd(2, "A", "C", ver(4, 1), sec(3)), 200), ins(1, "N", ver(3, 2), sec(2)),
			},
		},
		{
			name: "update keeping the key is not a barrier",
			in:   []tidemark.Change{ins(1, "A", ver(1, 1), sec(0)), withBefore(upd(1, "A", "B", ver(2, 1), sec(1)), img(1, "A", sec(0)))},
			want: []tidemark.Change{ins(1, "B", ver(2, 1), sec(1))},
		},
		{
			name: "schema change inside the batch starts a new group",
			in:   []tidemark.Change{ins(1, "A", ver(1, 1), sec(0)), on(schema2, upd(1, "A", "B", ver(2, 1), sec(1)))},
			want: []tidemark.Change{ins(1, "A", ver(1, 1), sec(0)), on(schema2, upd(1, "A", "B", ver(2, 1), sec(1)))},
		},
		{
			name: "change without a table passes",
			in:   []tidemark.Change{{Op: tidemark.OpInsert, Version: ver(1, 1)}, {Op: tidemark.OpInsert, Version: ver(1, 1)}},
			want: []tidemark.Change{{Op: tidemark.OpInsert, Version: ver(1, 1)}, {Op: tidemark.OpInsert, Version: ver(1, 1)}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := append([]tidemark.Change(nil), tt.in...)
			got, n := Coalesce(in, tt.soft)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got\n  %s\nwant\n  %s", strings.Join(describeAll(got), "\n  "), strings.Join(describeAll(tt.want), "\n  "))
			}
			if want := len(tt.in) - len(tt.want); n != want {
				t.Errorf("coalesced = %d, want %d", n, want)
			}
			// Applying the net changes leaves any target like applying the
			// batch one by one.
			for _, tomb := range []bool{false, true} {
				for p := 0; p <= len(tt.in); p++ {
					prior := newModel(tomb)
					if tt.in[0].Table != nil {
						prior.apply(tt.in[:p]...)
					}
					a, b := prior.clone(), prior.clone()
					if tt.in[0].Table != nil {
						a.apply(tt.in...)
						b.apply(got...)
					}
					if d := a.diff(b); len(d) > 0 {
						t.Errorf("tombstones=%t, target at prefix %d: net changes differ from the batch:\n%s", tomb, p, strings.Join(d, "\n"))
					}
				}
			}
		})
	}
}

// TestCoalesceReplayStraddlingCommit is the case that forbids netting
// insert + delete to nothing: the target committed the insert in an earlier
// batch, a replay from an older checkpoint puts the insert and the delete in
// one batch, and dedupe has no state for the key (evicted or restarted).
func TestCoalesceReplayStraddlingCommit(t *testing.T) {
	for _, soft := range []bool{false, true} {
		target := newModel(soft)
		insert := ins(1, "A", ver(1, 1), sec(0))
		target.apply(insert) // committed before the crash
		batch, _ := Coalesce([]tidemark.Change{insert, del(1, "A", ver(2, 1), sec(1))}, soft)
		target.apply(batch...)
		if r, ok := target.rows[modelKey{tabA.ID, insert.Key()}]; ok && !r.deleted {
			t.Errorf("soft=%t: row %s survived its delete", soft, fmtRow(r))
		}
	}
}

func TestWindowCoalesceCounts(t *testing.T) {
	w, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		out := w.Coalesce([]tidemark.Change{ins(1, "A", ver(1, 1), sec(0)), upd(1, "A", "B", ver(2, 1), sec(1)), ins(2, "A", ver(3, 1), sec(1))}, false)
		if len(out) != 2 {
			t.Fatalf("got %d changes, want 2", len(out))
		}
	}
	if got := w.Stats().Coalesced; got != 2 {
		t.Fatalf("Coalesced = %d, want 2", got)
	}
	if len(w.co.groups) != 0 || len(w.co.open) != 0 {
		t.Fatal("scratch space keeps the last batch")
	}
}

func (m *model) clone() *model {
	c := newModel(m.tombstones)
	for k, r := range m.rows {
		c.rows[k] = r
	}
	return c
}
