package postgres

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"tidemark"
)

// freshChunk is a first run's chunk of snapshot reads of tbl (ids from..to,
// name named), stamped with the capture's version.
func freshChunk(tbl *tidemark.Table, from, to int, name string) *tidemark.Batch {
	b := &tidemark.Batch{Source: "s", FreshLoad: true}
	for id := from; id <= to; id++ {
		b.Changes = append(b.Changes, readRow(tbl, v(10, 0), int64(id), fmt.Sprintf("%s%d", name, id), int64(id)))
	}
	return b
}

// primaryKey returns the target table's primary key columns ("" without
// one) and whether its alignment says the key is pending.
func (e *env) primaryKey(name string) (string, bool) {
	e.t.Helper()
	key := e.rows(`SELECT COALESCE(string_agg(a.attname, ',' ORDER BY array_position(i.indkey::int2[], a.attnum)), '') FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey::int2[])
WHERE i.indrelid = $1::regclass AND i.indisprimary`, e.table(name))
	pending := e.rows(`SELECT COALESCE((obj_description($1::regclass, 'pg_class')::jsonb->>'key_pending')::boolean, false)`, e.table(name))
	return key[0], pending[0] == "true"
}

// TestFreshLoadBuildsKeyAfterLoad: a fresh load's first chunk creates
// its table without the primary key and COPYs the rows straight in; a
// restarted run's chunks go on into it (the same process and a new one),
// a chunk applied twice leaves doubles, and MirrorIndexes after the load
// removes them (the later read of each key kept) and builds the key, after
// which the stream's changes and a replayed chunk behave as always.
func TestFreshLoadBuildsKeyAfterLoad(t *testing.T) {
	for _, mode := range []DeleteMode{DeleteHard, DeleteSoft} {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, func(cfg *Config) { cfg.DeleteMode = mode })
			ctx := context.Background()
			tbl := simpleTable("fresh")
			if st := e.apply(freshChunk(tbl, 1, 100, "a")); st != (tidemark.ApplyStats{Inserted: 100}) {
				t.Fatalf("first chunk: %+v", st)
			}
			if key, pending := e.primaryKey("fresh"); key != "" || !pending {
				t.Fatalf("after the first fresh chunk: primary key %q, pending %v; want none, pending", key, pending)
			}
			if r, _ := e.sink.DirectInserts(); r != 100 {
				t.Fatalf("direct rows %d, want 100", r)
			}
			// Ids 51..100 applied again, read later (other names): doubles.
			if st := e.apply(freshChunk(tbl, 51, 100, "b")); st != (tidemark.ApplyStats{Inserted: 50}) {
				t.Fatalf("replayed chunk: %+v", st)
			}
			// A restart: the new process goes on without the key, and
			// replays ids 91..100 once more.
			e.reopen()
			e2 := e
			if st := e2.apply(freshChunk(tbl, 91, 150, "c")); st != (tidemark.ApplyStats{Inserted: 60}) {
				t.Fatalf("chunk after the restart: %+v", st)
			}
			if key, pending := e2.primaryKey("fresh"); key != "" || !pending {
				t.Fatalf("after the restart's chunk: primary key %q, pending %v", key, pending)
			}
			if n := e2.rows(`SELECT count(*) FROM ` + e.table("fresh")); n[0] != "210" {
				t.Fatalf("%s rows before the key, want 210 (100 + 50 + 60)", n[0])
			}
			if err := e2.sink.MirrorIndexes(ctx, tbl.ID, nil); err != nil {
				t.Fatal(err)
			}
			if key, pending := e2.primaryKey("fresh"); key != "id" || pending {
				t.Fatalf("after MirrorIndexes: primary key %q, pending %v; want id, not pending", key, pending)
			}
			var want []string
			for id := 1; id <= 150; id++ {
				name := "a"
				switch {
				case id > 90:
					name = "c"
				case id > 50:
					name = "b"
				}
				want = append(want, fmt.Sprintf("%d|%s%d|10|0", id, name, id))
			}
			q := `SELECT id, name, _tm_seq, _tm_idx FROM ` + e.table("fresh") + ` ORDER BY id`
			if got := e2.rows(q); !reflect.DeepEqual(got, want) {
				t.Fatalf("rows after the key's build: %d rows, want %d; first differences %v", len(got), len(want), diffRows(got, want))
			}
			// The stream: an update and a delete, then a replay of the
			// first chunk, which the version guard skips.
			b := &tidemark.Batch{Source: "s", Checkpoint: gtid(11), Changes: []tidemark.Change{
				upd(tbl, v(11, 1), row(int64(1), "a1", int64(1)), row(int64(1), "u1", int64(1))),
				del(tbl, v(11, 2), int64(2), "a2", int64(2)),
			}}
			if st := e2.apply(b); st != (tidemark.ApplyStats{Updated: 1, Deleted: 1}) {
				t.Fatalf("stream: %+v", st)
			}
			replay := freshChunk(tbl, 1, 10, "a")
			replay.FreshLoad = false
			if st := e2.apply(replay); st != (tidemark.ApplyStats{Skipped: 10}) {
				t.Fatalf("replayed chunk after the key: %+v", st)
			}
			live := `SELECT count(*) FROM ` + e.table("fresh")
			if mode == DeleteSoft {
				live += ` WHERE NOT _tm_deleted`
			}
			if n := e2.rows(live); n[0] != "149" {
				t.Fatalf("%s live rows, want 149", n[0])
			}
		})
	}
}

// TestFreshLoadKeyBuiltBeforeOtherWrites: a batch that is not a fresh
// load's (the stream, a catch-up, a DDL event) finds the key built first,
// doubles removed; a fresh chunk after that takes the usual direct path,
// whose replays are staged and skipped.
func TestFreshLoadKeyBuiltBeforeOtherWrites(t *testing.T) {
	e := newEnv(t)
	tbl := simpleTable("freshstream")
	e.apply(freshChunk(tbl, 1, 20, "a"))
	e.apply(freshChunk(tbl, 11, 20, "b"))
	if key, _ := e.primaryKey("freshstream"); key != "" {
		t.Fatalf("primary key %q during the fresh load", key)
	}
	st := e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(12), Changes: []tidemark.Change{ins(tbl, v(12, 1), int64(100), "s", int64(0))}})
	if st != (tidemark.ApplyStats{Inserted: 1}) {
		t.Fatalf("stream insert: %+v", st)
	}
	if key, pending := e.primaryKey("freshstream"); key != "id" || pending {
		t.Fatalf("after a stream batch: primary key %q, pending %v", key, pending)
	}
	if n := e.rows(`SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE name LIKE 'b%') FROM ` + e.table("freshstream")); n[0] != "21|21|10" {
		t.Fatalf("rows, distinct keys, later reads = %s; want 21|21|10", n[0])
	}
	// A fresh chunk now: the table has its key, so a chunk applied
	// again is skipped (the same values) instead of doubled.
	if st := e.apply(freshChunk(tbl, 15, 25, "b")); st != (tidemark.ApplyStats{Inserted: 5, Skipped: 6}) {
		t.Fatalf("fresh chunk after the key: %+v", st)
	}
	if n := e.rows(`SELECT count(*), count(DISTINCT id) FROM ` + e.table("freshstream")); n[0] != "26|26" {
		t.Fatalf("rows, distinct keys = %s; want 26|26", n[0])
	}
	// Every key doubled: MirrorIndexes keeps the later read of each.
	other := simpleTable("freshddl")
	e.apply(freshChunk(other, 1, 5, "a"))
	e.apply(freshChunk(other, 1, 5, "b"))
	if err := e.sink.MirrorIndexes(context.Background(), other.ID, nil); err != nil {
		t.Fatal(err)
	}
	if n := e.rows(`SELECT string_agg(name, ',' ORDER BY id) FROM ` + e.table("freshddl")); n[0] != "b1,b2,b3,b4,b5" {
		t.Fatalf("rows after the key's build: %s", n[0])
	}
}

// TestFreshLoadNeedsEmptyTarget: FreshLoad only leaves out the key of a
// table it creates; into an existing table (keyed) its rows are upserted
// as any load's.
func TestFreshLoadNeedsEmptyTarget(t *testing.T) {
	e := newEnv(t)
	tbl := simpleTable("freshexisting")
	e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(tbl, v(1, 1), int64(1), "old", int64(0))}})
	if st := e.apply(freshChunk(tbl, 1, 3, "a")); st != (tidemark.ApplyStats{Inserted: 2, Updated: 1}) {
		t.Fatalf("fresh chunk into an existing table: %+v", st)
	}
	if key, pending := e.primaryKey("freshexisting"); key != "id" || pending {
		t.Fatalf("primary key %q, pending %v", key, pending)
	}
}

func diffRows(got, want []string) []string {
	var out []string
	for i := 0; i < max(len(got), len(want)) && len(out) < 5; i++ {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			out = append(out, fmt.Sprintf("#%d got %q want %q", i, g, w))
		}
	}
	return out
}

// TestFreshLoadKeepsKeyOverTombstones: a target table dropped by hand
// with the control tables kept leaves tombstones of its keys newer than a
// new first run's load. Those rows are guarded by the staged upsert only,
// so the fresh load's table is created with its key and the tombstoned
// key stays deleted.
func TestFreshLoadKeepsKeyOverTombstones(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	tbl := simpleTable("freshtomb")
	e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(20), Changes: []tidemark.Change{ins(tbl, v(20, 1), int64(5), "s", int64(0))}})
	e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(21), Changes: []tidemark.Change{del(tbl, v(21, 1), int64(5), "s", int64(0))}})
	if _, err := e.conn.Exec(ctx, `DROP TABLE `+e.table("freshtomb")); err != nil {
		t.Fatal(err)
	}
	st, err := e.sink.Apply(ctx, freshChunk(tbl, 1, 10, "a"))
	if err != nil {
		t.Fatalf("fresh chunk over tombstones: %v", err)
	}
	if st != (tidemark.ApplyStats{Inserted: 9, Skipped: 1}) {
		t.Fatalf("fresh chunk over tombstones: %+v", st)
	}
	if key, pending := e.primaryKey("freshtomb"); key != "id" || pending {
		t.Fatalf("primary key %q, pending %v; want id, not pending", key, pending)
	}
	if n := e.rows(`SELECT count(*) FROM ` + e.table("freshtomb") + ` WHERE id = 5`); n[0] != "0" {
		t.Fatal("the tombstoned key came back")
	}
}
