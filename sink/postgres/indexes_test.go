package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"

	"tidemark"
)

func TestPgIndexName(t *testing.T) {
	if got := pgIndexName("orders", "k_updated"); got != "orders_k_updated" {
		t.Fatalf("short name: %q", got)
	}
	long := strings.Repeat("t", 40)
	a, b := pgIndexName(long, strings.Repeat("i", 30)+"a"), pgIndexName(long, strings.Repeat("i", 30)+"b")
	if len(a) > pgNameMax || len(b) > pgNameMax || a == b {
		t.Fatalf("long names must fit in 63 bytes and stay distinct: %q (%d) %q (%d)", a, len(a), b, len(b))
	}
	u := pgIndexName(strings.Repeat("é", 30), "idx") // 60 bytes + 4
	if len(u) > pgNameMax || !strings.HasPrefix(u, "é") || strings.ContainsRune(u, '\uFFFD') {
		t.Fatalf("a cut must keep whole characters: %q", u)
	}
}

// TestPgIndexAltName: "<table>_<index>" is ambiguous, and so is its hash
// past 63 bytes; the alternative name hashes the pair.
func TestPgIndexAltName(t *testing.T) {
	long := strings.Repeat("l", 60)
	for _, p := range [][4]string{{"a", "b_c", "a_b", "c"}, {long, "b_c", long + "_b", "c"}} {
		if pgIndexName(p[0], p[1]) != pgIndexName(p[2], p[3]) {
			t.Fatalf("%q/%q and %q/%q: the primary names differ; the case is moot", p[0], p[1], p[2], p[3])
		}
		a, b := pgIndexAltName(p[0], p[1]), pgIndexAltName(p[2], p[3])
		if a == b || len(a) > pgNameMax || len(b) > pgNameMax || a == pgIndexName(p[0], p[1]) {
			t.Errorf("alternative names of %q/%q and %q/%q: %q (%d bytes), %q (%d bytes)", p[0], p[1], p[2], p[3], a, len(a), b, len(b))
		}
	}
	if got := pgIndexAltName("p", "q"); got != pgIndexAltName("p", "q") || !strings.HasPrefix(got, "p_q_") || len(got) != len("p_q_")+8 {
		t.Errorf("short pair: %q", got)
	}
	u := pgIndexAltName(strings.Repeat("é", 30), "idx")
	if len(u) > pgNameMax || strings.ContainsRune(u, '\uFFFD') || !strings.HasPrefix(u, "é") {
		t.Errorf("a cut must keep whole characters: %q", u)
	}
}

func TestIndexSpecs(t *testing.T) {
	types := map[string]string{"id": "bigint", "email": "text", "blob": "bytea", "a": "integer", "b": "integer"}
	idx := []tidemark.Index{
		{Name: "uq", Unique: true, Type: "BTREE", Columns: []tidemark.IndexColumn{{Name: "email"}}},
		{Name: "uqp", Unique: true, Type: "BTREE", Columns: []tidemark.IndexColumn{{Name: "email", Prefix: 5}, {Name: "a"}}},
		{Name: "kb", Type: "BTREE", Columns: []tidemark.IndexColumn{{Name: "blob", Prefix: 8}, {Name: "b", Desc: true}}},
		{Name: "h", Type: "HASH", Columns: []tidemark.IndexColumn{{Name: "a"}}},
		{Name: "ft", Type: "FULLTEXT", Columns: []tidemark.IndexColumn{{Name: "email"}}},
		{Name: "sp", Type: "SPATIAL", Columns: []tidemark.IndexColumn{{Name: "a"}}},
		{Name: "gone", Type: "BTREE", Columns: []tidemark.IndexColumn{{Name: "secret"}}},
		{Name: "bad\"name", Type: "BTREE", Columns: []tidemark.IndexColumn{{Name: "a"}}},
		{Name: "pkey", Type: "BTREE", Columns: []tidemark.IndexColumn{{Name: "a"}}},
		// The business key (a, b): a unique index on its columns, in any
		// order, is the primary key's; a superset, a subset and a prefix
		// are mirrored.
		{Name: "bk", Unique: true, Type: "BTREE", Columns: []tidemark.IndexColumn{{Name: "b"}, {Name: "a"}}},
		{Name: "bksup", Unique: true, Type: "BTREE", Columns: []tidemark.IndexColumn{{Name: "a"}, {Name: "b"}, {Name: "id"}}},
		{Name: "bksub", Unique: true, Type: "BTREE", Columns: []tidemark.IndexColumn{{Name: "a"}}},
		{Name: "bknu", Type: "BTREE", Columns: []tidemark.IndexColumn{{Name: "a"}, {Name: "b"}}},
	}
	q := `"s"."t"`
	for _, soft := range []bool{false, true} {
		specs, skipped := indexSpecs("s", "t", q, soft, types, []string{"a", "b"}, idx)
		got := map[string]string{}
		for _, sp := range specs {
			got[sp.name] = sp.create
		}
		want := map[string]string{
			"t_uq":    `ALTER TABLE "s"."t" ADD CONSTRAINT "t_uq" UNIQUE ("email") DEFERRABLE INITIALLY DEFERRED`,
			"t_uqp":   `ALTER TABLE "s"."t" ADD CONSTRAINT "t_uqp" EXCLUDE USING btree ((left("email", 5)) WITH =, "a" WITH =) DEFERRABLE INITIALLY DEFERRED`,
			"t_kb":    `CREATE INDEX "t_kb" ON "s"."t" ((substring("blob" from 1 for 8)), "b" DESC)`,
			"t_h":     `CREATE INDEX "t_h" ON "s"."t" ("a")`,
			"t_bksup": `ALTER TABLE "s"."t" ADD CONSTRAINT "t_bksup" UNIQUE ("a", "b", "id") DEFERRABLE INITIALLY DEFERRED`,
			"t_bksub": `ALTER TABLE "s"."t" ADD CONSTRAINT "t_bksub" UNIQUE ("a") DEFERRABLE INITIALLY DEFERRED`,
			"t_bknu":  `CREATE INDEX "t_bknu" ON "s"."t" ("a", "b")`,
		}
		if soft {
			// Tombstones keep their values: uniqueness is over live rows.
			want["t_uq"] = `ALTER TABLE "s"."t" ADD CONSTRAINT "t_uq" EXCLUDE USING btree ("email" WITH =) WHERE (NOT "_tm_deleted") DEFERRABLE INITIALLY DEFERRED`
			want["t_uqp"] = `ALTER TABLE "s"."t" ADD CONSTRAINT "t_uqp" EXCLUDE USING btree ((left("email", 5)) WITH =, "a" WITH =) WHERE (NOT "_tm_deleted") DEFERRABLE INITIALLY DEFERRED`
			want["t_bksup"] = `ALTER TABLE "s"."t" ADD CONSTRAINT "t_bksup" EXCLUDE USING btree ("a" WITH =, "b" WITH =, "id" WITH =) WHERE (NOT "_tm_deleted") DEFERRABLE INITIALLY DEFERRED`
			want["t_bksub"] = `ALTER TABLE "s"."t" ADD CONSTRAINT "t_bksub" EXCLUDE USING btree ("a" WITH =) WHERE (NOT "_tm_deleted") DEFERRABLE INITIALLY DEFERRED`
		}
		for n, w := range want {
			if got[n] != w {
				t.Errorf("soft=%v %s:\n got %s\nwant %s", soft, n, got[n], w)
			}
		}
		if len(got) != len(want) {
			t.Errorf("soft=%v: specs %v", soft, got)
		}
		var names []string
		for _, sk := range skipped {
			names = append(names, sk.index)
		}
		if strings.Join(names, ",") != `ft,sp,gone,bad"name,pkey,bk` || !skipped[len(skipped)-1].implied {
			t.Errorf("skipped %v", skipped)
		}
	}
}

// userTable is (id key, email NOT NULL, name) with a unique index on email.
func userTable(name string) *tidemark.Table {
	return &tidemark.Table{
		ID: tidemark.TableID{Database: "shop", Name: name},
		Columns: []tidemark.Column{
			{Name: "id", Kind: tidemark.KindInt, Bits: 64},
			{Name: "email", Kind: tidemark.KindText},
			{Name: "name", Kind: tidemark.KindText, Nullable: true},
		},
		Key:          []int{0},
		Indexes:      []tidemark.Index{{Name: "uq_email", Unique: true, Type: "BTREE", Columns: []tidemark.IndexColumn{{Name: "email"}}}},
		IndexesKnown: true,
	}
}

// TestMirroredUniqueIndex: a streamed table gets its unique index at once;
// two rows swapping their values in one batch apply (the check is at
// commit); in soft mode a tombstone does not hold its value against a new
// row; rows that really violate it quarantine the table (a TableError
// naming the index), nothing is committed.
func TestMirroredUniqueIndex(t *testing.T) {
	for _, mode := range []string{"hard", "soft"} {
		t.Run(mode, func(t *testing.T) {
			var opts []envOption
			if mode == "soft" {
				opts = append(opts, softDeletes)
			}
			e := newEnv(t, opts...)
			tbl := userTable("users")
			e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{
				ins(tbl, v(1, 1), int64(1), "a@x", "A"), ins(tbl, v(1, 2), int64(2), "b@x", "B")}, Checkpoint: gtid(1)})
			var deferred bool
			if err := e.conn.QueryRow(context.Background(), `SELECT condeferred FROM pg_constraint WHERE conname = 'users_uq_email'`).Scan(&deferred); err != nil || !deferred {
				t.Fatalf("users_uq_email: deferred %v, %v", deferred, err)
			}
			// NOT NULL mirrored in hard mode only.
			notNull := e.rows(`SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND attnotnull AND attname NOT LIKE '\_tm\_%' ORDER BY attnum`, e.table("users"))
			if wantNN := map[string]string{"hard": "[id email]", "soft": "[id]"}[mode]; strings.Join(notNull, " ") != strings.Trim(wantNN, "[]") {
				t.Fatalf("NOT NULL columns %v, want %s", notNull, wantNN)
			}
			// Swap, through a temporary value, in one batch.
			e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{
				upd(tbl, v(2, 1), row(int64(1), "a@x", "A"), row(int64(1), "tmp", "A")),
				upd(tbl, v(2, 2), row(int64(2), "b@x", "B"), row(int64(2), "a@x", "B")),
				upd(tbl, v(2, 3), row(int64(1), "tmp", "A"), row(int64(1), "b@x", "A"))}, Checkpoint: gtid(2)})
			if got := e.rows("SELECT id, email FROM " + e.table("users") + " ORDER BY id"); strings.Join(got, " ") != "1|b@x 2|a@x" {
				t.Fatalf("after swap: %v", got)
			}
			if mode == "soft" {
				// Deleted, then the email reused by a new row.
				e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{
					del(tbl, v(3, 1), int64(2), "a@x", "B"), ins(tbl, v(3, 2), int64(3), "a@x", "C")}, Checkpoint: gtid(3)})
				if got := e.rows("SELECT id, email, _tm_deleted FROM " + e.table("users") + " ORDER BY id"); strings.Join(got, " ") != "1|b@x|false 2|a@x|true 3|a@x|false" {
					t.Fatalf("after delete and reuse: %v", got)
				}
			}
			// A real violation: the target does not hold what the source
			// does. Quarantine, nothing committed.
			_, err := e.sink.Apply(context.Background(), &tidemark.Batch{Source: "s", Changes: []tidemark.Change{
				ins(tbl, v(4, 1), int64(9), "b@x", "dup")}, Checkpoint: gtid(4)})
			var te *tidemark.TableError
			if !errors.As(err, &te) || te.Table != tbl.ID || !errors.Is(err, tidemark.ErrIncompatibleSchema) || !strings.Contains(err.Error(), `unique index "users_uq_email"`) {
				t.Fatalf("want a TableError naming users_uq_email, got %v", err)
			}
			if pos, _ := e.checkpoint("s"); pos != gtid(3) && pos != gtid(2) {
				t.Fatalf("checkpoint moved to %v", pos)
			}
		})
	}
}
