package postgres

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"tidemark"
)

func TestAtomicity(t *testing.T) {
	good := simpleTable("good")
	money := &tidemark.Table{
		ID: tidemark.TableID{Database: "shop", Name: "money"},
		Columns: []tidemark.Column{
			{Name: "id", Kind: tidemark.KindInt, Bits: 64},
			{Name: "amount", Kind: tidemark.KindDecimal, Precision: 5, Scale: 2, Nullable: true},
		},
		Key: []int{0},
	}
	cases := []struct {
		name    string
		bad     tidemark.Change
		failCP  bool
		wantErr []string
	}{
		{"wrong Go type", ins(good, v(2, 2), int64(2), 42, nil), false, []string{"shop.good.name", "want string", "got int"}},
		{"NULL key", ins(good, v(2, 2), nil, "x", nil), false, []string{"shop.good.id", "NULL"}},
		{"rejected by PostgreSQL", ins(money, v(2, 2), int64(1), tidemark.Decimal("123456.00")), false,
			[]string{e2eSchemaPlaceholder + ".money", `column "amount"`, "22003"}},
		{"checkpoint store fails", ins(good, v(2, 2), int64(2), "fine", nil), true, []string{"injected"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			// Make sure both tables exist, with a first checkpoint.
			e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(1), Changes: []tidemark.Change{
				ins(good, v(1, 1), int64(100), "kept", nil), ins(money, v(1, 2), int64(100), tidemark.Decimal("1.00"))}})
			if c.failCP {
				// The checkpoint's write fails in the batch's
				// transaction, after it wrote (an AFTER trigger).
				cs := tidemark.QuotePostgres(e.store.Schema())
				if _, err := e.conn.Exec(context.Background(), `CREATE FUNCTION `+cs+`.fail() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'injected failure'; END$$;
CREATE TRIGGER fail AFTER INSERT OR UPDATE ON `+cs+`.checkpoints FOR EACH ROW EXECUTE FUNCTION `+cs+`.fail()`); err != nil {
					t.Fatal(err)
				}
			}
			before := e.rows(`SELECT id, name FROM ` + e.table("good") + ` ORDER BY id`)
			_, err := e.sink.Apply(context.Background(), &tidemark.Batch{Source: "s", Checkpoint: gtid(2), Changes: []tidemark.Change{
				ins(good, v(2, 1), int64(1), "must not stay", nil),
				upd(good, v(2, 3), row(int64(100), "kept", nil), row(int64(100), "changed", nil)),
				c.bad,
			}})
			if err == nil {
				t.Fatal("Apply succeeded, want an error")
			}
			for _, w := range c.wantErr {
				w = strings.ReplaceAll(w, e2eSchemaPlaceholder, e.schema)
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if after := e.rows(`SELECT id, name FROM ` + e.table("good") + ` ORDER BY id`); !reflect.DeepEqual(before, after) {
				t.Errorf("data changed by a failed batch: %q → %q", before, after)
			}
			if pos, _ := e.checkpoint("s"); pos != gtid(1) {
				t.Errorf("checkpoint moved to %v by a failed batch", pos)
			}
		})
	}
}

const e2eSchemaPlaceholder = "<schema>"

func TestWatermarksCommitWithBatch(t *testing.T) {
	e := newEnv(t)
	tbl := simpleTable("wm")
	w := tidemark.Watermark{Table: tbl.ID, Value: time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)}
	e.apply(&tidemark.Batch{Source: "s", Watermarks: []tidemark.Watermark{w}, Changes: []tidemark.Change{ins(tbl, v(1, 1), int64(1), "a", nil)}})
	got, ok, err := e.store.LoadWatermark(context.Background(), querier{e.sink.pool}, "s", tbl.ID)
	if err != nil || !ok || !got.Equal(w.Value) {
		t.Fatalf("watermark = %v %t %v", got, ok, err)
	}
	// A checkpoint-only batch (no changes) still commits.
	e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(9)})
	if pos, _ := e.checkpoint("s"); pos != gtid(9) {
		t.Errorf("checkpoint = %v", pos)
	}
}

func TestCheckpointBadStoredValue(t *testing.T) {
	e := newEnv(t)
	if _, err := e.conn.Exec(context.Background(), `INSERT INTO `+tidemark.QuotePostgres(e.store.Schema())+`.checkpoints (source, position) VALUES ('x', 'pos=12;bogus')`); err != nil {
		t.Fatal(err)
	}
	_, ok, err := e.sink.Checkpoint(context.Background(), "x")
	if err == nil || ok {
		t.Fatalf("Checkpoint = %t, %v; want an error", ok, err)
	}
	for _, want := range []string{`source "x"`, e.store.Schema() + ".checkpoints", "parse position"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if _, ok := e.checkpoint("unknown"); ok {
		t.Error("a checkpoint for an unknown source")
	}
}
