package postgres

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"tidemark"
)

// TestDirectInsertPath: batches of fresh inserts are COPYed straight into
// the target; a batch that meets an existing key rolls back to the
// savepoint and is staged (the version guard decides), the table then
// stages its next batch, and the rows are what the staged path writes.
func TestDirectInsertPath(t *testing.T) {
	for _, mode := range []DeleteMode{DeleteHard, DeleteSoft} {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, func(cfg *Config) { cfg.DeleteMode = mode })
			tbl := simpleTable("direct")
			inserts := func(seq uint64, from, n int) *tidemark.Batch {
				b := &tidemark.Batch{Source: "s", Checkpoint: gtid(int(seq))}
				for i := 0; i < n; i++ {
					b.Changes = append(b.Changes, ins(tbl, v(seq, uint32(i+1)), int64(from+i), fmt.Sprintf("n%d", from+i), int64(i)))
				}
				return b
			}
			direct := func(wantRows, wantConflicts int64) {
				t.Helper()
				if r, c := e.sink.DirectInserts(); r != wantRows || c != wantConflicts {
					t.Fatalf("direct path: %d rows, %d conflicts; want %d, %d", r, c, wantRows, wantConflicts)
				}
			}
			q := `SELECT id, name, qty, _tm_seq, _tm_idx, _tm_commit_time, _tm_loaded_at FROM ` + e.table("direct") + ` ORDER BY id`
			a := inserts(1, 1, 100)
			if st := e.apply(a); st != (tidemark.ApplyStats{Inserted: 100}) {
				t.Fatalf("first batch: %+v", st)
			}
			direct(100, 0)
			first := e.rows(q)
			if len(first) != 100 || first[0] != "1|n1|0|1|1|"+fmt.Sprint(commitT0.Add(time.Second))+"|"+strings.Split(first[0], "|")[6] {
				t.Fatalf("rows: %d, first %q", len(first), first[0])
			}
			if n := e.rows(`SELECT count(*) FROM ` + e.table("direct") + ` WHERE _tm_loaded_at IS NULL OR _tm_commit_time IS NULL`); n[0] != "0" {
				t.Fatalf("%s rows without load or commit time", n[0])
			}
			if mode == DeleteSoft {
				if n := e.rows(`SELECT count(*) FROM ` + e.table("direct") + ` WHERE _tm_deleted OR _tm_deleted_at IS NOT NULL`); n[0] != "0" {
					t.Fatalf("%s direct rows marked deleted", n[0])
				}
			}
			// A replay conflicts, is staged, and changes nothing.
			if st := e.apply(a); st != (tidemark.ApplyStats{Skipped: 100}) {
				t.Fatalf("replay: %+v", st)
			}
			direct(100, 1)
			if got := e.rows(q); !reflect.DeepEqual(got, first) {
				t.Fatal("replay changed rows")
			}
			// The next batch is staged (back-off), the one after is direct.
			if st := e.apply(inserts(2, 101, 10)); st != (tidemark.ApplyStats{Inserted: 10}) {
				t.Fatalf("after conflict: %+v", st)
			}
			direct(100, 1)
			if st := e.apply(inserts(3, 111, 10)); st != (tidemark.ApplyStats{Inserted: 10}) {
				t.Fatalf("after back-off: %+v", st)
			}
			direct(110, 1)
			// Fresh keys mixed with an older insert of an existing key:
			// the guard keeps the newer row, the fresh ones go in.
			mixed := inserts(4, 121, 5)
			mixed.Changes = append(mixed.Changes, ins(tbl, v(1, 7), int64(7), "older", int64(-1)))
			if st := e.apply(mixed); st != (tidemark.ApplyStats{Inserted: 5, Skipped: 1}) {
				t.Fatalf("mixed: %+v", st)
			}
			direct(110, 2)
			if got := e.rows(`SELECT name FROM ` + e.table("direct") + ` WHERE id = 7`); got[0] != "n7" {
				t.Fatalf("row 7 = %q", got)
			}
			// Updates never take the direct path.
			e.apply(inserts(5, 200, 1)) // back-off
			up := &tidemark.Batch{Source: "s", Changes: []tidemark.Change{upd(tbl, v(6, 1), row(int64(1), "n1", int64(0)), row(int64(1), "u", int64(0)))}}
			if st := e.apply(up); st != (tidemark.ApplyStats{Updated: 1}) {
				t.Fatalf("update: %+v", st)
			}
			direct(110, 2)
			if got := e.rows(`SELECT count(*) FROM ` + e.table("direct")); got[0] != "126" {
				t.Fatalf("%s rows, want 126", got[0])
			}
		})
	}
}

// TestDirectInsertRefusedStages: when the target's column types change
// behind the sink's back, the direct COPY is refused; the rows are staged
// (cast on the way in) and the table stays on the staged path.
func TestDirectInsertRefusedStages(t *testing.T) {
	e := newEnv(t)
	tbl := simpleTable("refused")
	e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(tbl, v(1, 1), int64(1), "a", int64(1))}})
	if r, _ := e.sink.DirectInserts(); r != 1 {
		t.Fatalf("first insert not direct: %d rows", r)
	}
	if _, err := e.conn.Exec(context.Background(), `ALTER TABLE `+e.table("refused")+` ALTER COLUMN qty TYPE bigint`); err != nil {
		t.Fatal(err)
	}
	for i, id := range []int64{2, 3} {
		st := e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(tbl, v(uint64(2+i), 1), id, "b", int64(40))}})
		if st != (tidemark.ApplyStats{Inserted: 1}) {
			t.Fatalf("insert %d: %+v", id, st)
		}
	}
	if r, c := e.sink.DirectInserts(); r != 1 || c != 0 {
		t.Fatalf("direct path after the type change: %d rows, %d conflicts; want 1, 0", r, c)
	}
	if got := e.rows(`SELECT id, qty FROM ` + e.table("refused") + ` ORDER BY id`); !reflect.DeepEqual(got, []string{"1|1", "2|40", "3|40"}) {
		t.Fatalf("rows %q", got)
	}
}
