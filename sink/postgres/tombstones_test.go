package postgres

import (
	"context"
	"reflect"
	"strconv"
	"testing"

	"tidemark"
)

// TestHardDeleteReplayNeverResurrects: a replay from an older checkpoint
// (the Fanout resuming from a sink that is behind, a checkpoint set back)
// brings a hard-deleted row back, not even for a moment: the older insert
// or update loses to the delete's tombstone, on the staged path and on the
// direct insert path. A newer insert of the key still wins. Tombstones are
// pruned once two later checkpoints have been stored, not by a replay, and
// the state survives a restart of the sink.
func TestHardDeleteReplayNeverResurrects(t *testing.T) {
	e := newEnv(t)
	tbl := simpleTable("hard")
	q := `SELECT id, name, _tm_seq FROM ` + e.table("hard") + ` ORDER BY id`
	tombs := func() int {
		t.Helper()
		n, err := strconv.Atoi(e.rows(`SELECT count(*) FROM ` + tidemark.QuotePostgres(e.store.Schema()) + `.tombstones`)[0])
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	b1 := &tidemark.Batch{Source: "s", Checkpoint: gtid(10), Changes: []tidemark.Change{
		ins(tbl, v(10, 1), int64(1), "one", nil), ins(tbl, v(10, 2), int64(2), "two", nil)}}
	b2 := &tidemark.Batch{Source: "s", Checkpoint: gtid(11), Changes: []tidemark.Change{
		upd(tbl, v(11, 1), row(int64(2), "two", nil), row(int64(2), "two'", nil)), del(tbl, v(11, 2), int64(1), "one", nil)}}
	e.apply(b1)
	e.apply(b2)
	want := []string{"2|two'|11"}
	if got := e.rows(q); !reflect.DeepEqual(got, want) || tombs() != 1 {
		t.Fatalf("after the delete: rows %q (want %q), %d tombstones (want 1)", got, want, tombs())
	}
	// Replays from the older checkpoint: the insert batch as it was (all
	// inserts: the direct path's candidate), then an older update alone.
	for i, b := range []*tidemark.Batch{b1,
		{Source: "s", Checkpoint: gtid(10), Changes: []tidemark.Change{upd(tbl, v(10, 5), row(int64(1), "one", nil), row(int64(1), "one'", nil))}},
		{Source: "s", Changes: []tidemark.Change{ins(tbl, v(11, 1), int64(1), "one''", nil)}},
	} {
		st := e.apply(b)
		if got := e.rows(q); !reflect.DeepEqual(got, want) {
			t.Fatalf("replay %d brought the deleted row back: rows %q, want %q (stats %+v)", i, got, want, st)
		}
		if st.Skipped != len(b.Changes) {
			t.Fatalf("replay %d: stats %+v, want all %d skipped", i, st, len(b.Changes))
		}
	}
	// The direct insert path (a table with no conflict yet, so it is
	// tried): a replayed insert of a deleted key alone.
	t2 := simpleTable("hard2")
	e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(t2, v(10, 3), int64(7), "seven", nil)}})
	e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{del(t2, v(11, 3), int64(7), "seven", nil)}})
	if st := e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(t2, v(10, 3), int64(7), "seven", nil)}}); st.Skipped != 1 {
		t.Fatalf("replayed insert on the direct path: stats %+v, want skipped (rows %q)", st, e.rows(`SELECT id FROM `+e.table("hard2")))
	}
	if rows, _ := e.sink.DirectInserts(); rows != 3 {
		t.Fatalf("direct path used for %d rows, want 3 (the first inserts)", rows)
	}
	// A restarted sink reads the tombstones and their state back.
	e.sink.Close()
	s2, err := Open(context.Background(), e.sink.cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.sink = s2
	t.Cleanup(func() { s2.Close() })
	if st := e.apply(b1); st.Skipped != 2 || !reflect.DeepEqual(e.rows(q), want) {
		t.Fatalf("replay after a restart: stats %+v, rows %q", st, e.rows(q))
	}
	// A newer insert of the deleted key wins.
	e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(12), Changes: []tidemark.Change{ins(tbl, v(12, 1), int64(1), "back", nil)}})
	want = []string{"1|back|12", "2|two'|11"}
	if got := e.rows(q); !reflect.DeepEqual(got, want) {
		t.Fatalf("newer insert: rows %q, want %q", got, want)
	}
	// Pruning: the tombstone (stored with checkpoint 11) goes once a later
	// checkpoint (12) is stored and another batch (13) applied; replayed
	// batches and batches without a checkpoint do not count.
	if n := tombs(); n != 2 {
		t.Fatalf("pruned too early: %d tombstones after checkpoint 12", n)
	}
	e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(11)})
	e.apply(&tidemark.Batch{Source: "s"})
	if n := tombs(); n != 2 {
		t.Fatalf("a replayed checkpoint pruned: %d tombstones", n)
	}
	e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(13)})
	if n := tombs(); n != 0 {
		t.Fatalf("not pruned after checkpoints 12 and 13: %d tombstones", n)
	}
}
