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
	e.reopen()
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

// TestReplayPastPrunedTombstonesLosesToHorizon: a replay that starts before
// the stored checkpoint by more than the tombstones kept (the checkpoint
// deleted to start over from source.start_position; nemesis seed 119)
// finds no tombstone of a deleted key. The key still stays deleted: pruning
// left the table's horizon, and a change at or below it of a key without a
// row is skipped, on a restarted sink (no cache) and on the direct path's
// candidates. A newer insert and a snapshot row still land; a table the
// sink creates again (dropped to re-seed it) has no horizon; pruning by
// table (the apply topology) raises it too, and an applier's batch
// (Refresh, with offsets) is held to it.
func TestReplayPastPrunedTombstonesLosesToHorizon(t *testing.T) {
	e := newEnv(t)
	tbl := simpleTable("hz")
	q := `SELECT id, name, _tm_seq FROM ` + e.table("hz") + ` ORDER BY id`
	horizon := func(table string) []string {
		t.Helper()
		return e.rows(`SELECT seq, idx FROM `+tidemark.QuotePostgres(e.store.Schema())+`.tombstone_horizons WHERE target = $1`, e.table(table))
	}
	b1 := &tidemark.Batch{Source: "s", Checkpoint: gtid(10), Changes: []tidemark.Change{
		ins(tbl, v(10, 1), int64(1), "one", nil), ins(tbl, v(10, 2), int64(2), "two", nil)}}
	e.apply(b1)
	e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(11), Changes: []tidemark.Change{del(tbl, v(11, 2), int64(1), "one", nil)}})
	e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(12)})
	e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(13)})
	if n := e.rows(`SELECT count(*) FROM ` + tidemark.QuotePostgres(e.store.Schema()) + `.tombstones`)[0]; n != "0" {
		t.Fatalf("%s tombstones after checkpoints 12 and 13, want them pruned", n)
	}
	if h := horizon("hz"); !reflect.DeepEqual(h, []string{"11|2"}) {
		t.Fatalf("horizon of hz after pruning: %q, want 11|2 (the pruned tombstone's version)", h)
	}
	want := []string{"2|two|10"}
	// The replay from the start, by a restarted sink.
	e.reopen()
	for i, b := range []*tidemark.Batch{b1,
		{Source: "s", Changes: []tidemark.Change{upd(tbl, v(10, 5), row(int64(1), "one", nil), row(int64(1), "one'", nil))}},
		{Source: "s", Changes: []tidemark.Change{ins(tbl, v(11, 2), int64(1), "one''", nil)}},
	} {
		st := e.apply(b)
		if got := e.rows(q); !reflect.DeepEqual(got, want) || st.Skipped != len(b.Changes) {
			t.Fatalf("replay %d past the pruned tombstone: rows %q (want %q), stats %+v (want all %d skipped)", i, got, want, st, len(b.Changes))
		}
	}
	// Newer than the horizon, and a snapshot row (a read, not a replay).
	e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(14), Changes: []tidemark.Change{ins(tbl, v(14, 1), int64(1), "back", nil)}})
	e.apply(&tidemark.Batch{Source: "s", Refresh: true, Changes: []tidemark.Change{ins(tbl, v(9, 0), int64(3), "read", nil)}})
	want = []string{"1|back|14", "2|two|10", "3|read|9"}
	if got := e.rows(q); !reflect.DeepEqual(got, want) {
		t.Fatalf("a newer insert and a snapshot row: rows %q, want %q", got, want)
	}
	// Dropped to re-seed it (the daemon stopped): created again with no
	// horizon, so the replay fills it.
	if _, err := e.conn.Exec(context.Background(), "DROP TABLE "+e.table("hz")); err != nil {
		t.Fatal(err)
	}
	e.reopen()
	if st := e.apply(b1); st.Inserted != 2 {
		t.Fatalf("replay into the re-created table: stats %+v, rows %q, horizon %q; want both rows inserted", st, e.rows(q), horizon("hz"))
	}
	if h := horizon("hz"); len(h) != 0 {
		t.Fatalf("horizon of the re-created table: %q, want none", h)
	}
	// Pruning by table (PruneTombstones, the apply topology).
	t2 := simpleTable("hz2")
	e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(t2, v(20, 1), int64(5), "five", nil)}})
	e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{del(t2, v(21, 1), int64(5), "five", nil)}})
	if n, err := e.sink.PruneTombstones(context.Background(), t2.ID, v(22, 0)); err != nil || n != 1 {
		t.Fatalf("PruneTombstones: %d, %v; want 1 pruned", n, err)
	}
	if h := horizon("hz2"); !reflect.DeepEqual(h, []string{"21|1"}) {
		t.Fatalf("horizon of hz2 after PruneTombstones: %q, want 21|1", h)
	}
	if st := e.apply(&tidemark.Batch{Source: "s", Refresh: true, Offsets: []tidemark.StreamOffset{{Group: "g", Topic: "tp", Partition: 0, Next: 1, Prev: -1}},
		Changes: []tidemark.Change{ins(t2, v(20, 1), int64(5), "five", nil)}}); st.Skipped != 1 {
		t.Fatalf("an applier's replay past the pruned tombstone: stats %+v, rows %q", st, e.rows(`SELECT id FROM `+e.table("hz2")))
	}
}

// reopen closes the env's sink and opens a new one with its config (a
// restart: nothing cached).
func (e *env) reopen() {
	e.t.Helper()
	e.sink.Close()
	s, err := Open(context.Background(), e.sink.cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.sink = s
	e.t.Cleanup(func() { s.Close() })
}
