package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/internal/testenv"
)

func TestClassify(t *testing.T) {
	col := func(k tidemark.Kind, bits, p, s int) tidemark.Column {
		return tidemark.Column{Name: "c", Kind: k, Bits: bits, Precision: p, Scale: s}
	}
	cases := []struct {
		name string
		o, n tidemark.Column
		want int
	}{
		{"same", col(tidemark.KindInt, 32, 0, 0), col(tidemark.KindInt, 32, 0, 0), colSame},
		{"int widened", col(tidemark.KindInt, 32, 0, 0), col(tidemark.KindInt, 64, 0, 0), colWiden},
		{"int narrowed", col(tidemark.KindInt, 64, 0, 0), col(tidemark.KindInt, 32, 0, 0), colIncompatible},
		{"uint to wider int", col(tidemark.KindUint, 32, 0, 0), col(tidemark.KindInt, 64, 0, 0), colWiden},
		{"uint to same-width int", col(tidemark.KindUint, 32, 0, 0), col(tidemark.KindInt, 32, 0, 0), colIncompatible},
		{"int to uint", col(tidemark.KindInt, 32, 0, 0), col(tidemark.KindUint, 64, 0, 0), colIncompatible},
		{"decimal precision up", col(tidemark.KindDecimal, 0, 10, 2), col(tidemark.KindDecimal, 0, 12, 2), colWiden},
		{"decimal scale up keeping integer digits", col(tidemark.KindDecimal, 0, 10, 2), col(tidemark.KindDecimal, 0, 11, 3), colWiden},
		{"decimal scale up losing integer digits", col(tidemark.KindDecimal, 0, 10, 2), col(tidemark.KindDecimal, 0, 10, 3), colIncompatible},
		{"decimal scale down", col(tidemark.KindDecimal, 0, 12, 4), col(tidemark.KindDecimal, 0, 12, 2), colIncompatible},
		{"float to double", col(tidemark.KindFloat, 0, 0, 0), col(tidemark.KindDouble, 0, 0, 0), colWiden},
		{"double to float", col(tidemark.KindDouble, 0, 0, 0), col(tidemark.KindFloat, 0, 0, 0), colIncompatible},
		{"bit widened", col(tidemark.KindBit, 4, 0, 0), col(tidemark.KindBit, 8, 0, 0), colWiden},
		{"bit narrowed", col(tidemark.KindBit, 8, 0, 0), col(tidemark.KindBit, 4, 0, 0), colIncompatible},
		{"datetime more digits", col(tidemark.KindDateTime, 0, 0, 0), col(tidemark.KindDateTime, 0, 0, 6), colWiden},
		{"datetime fewer digits", col(tidemark.KindDateTime, 0, 0, 6), col(tidemark.KindDateTime, 0, 0, 3), colIncompatible},
		{"datetime to timestamp", col(tidemark.KindDateTime, 0, 0, 0), col(tidemark.KindTimestamp, 0, 0, 0), colIncompatible},
		{"enum to text", col(tidemark.KindEnum, 0, 0, 0), col(tidemark.KindText, 0, 0, 0), colWiden},
		{"text to enum", col(tidemark.KindText, 0, 0, 0), col(tidemark.KindEnum, 0, 0, 0), colIncompatible},
		{"text to bytes", col(tidemark.KindText, 0, 0, 0), col(tidemark.KindBytes, 0, 0, 0), colIncompatible},
		{"int to decimal", col(tidemark.KindInt, 32, 0, 0), col(tidemark.KindDecimal, 0, 20, 0), colIncompatible},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := classify(c.o, c.n); got != c.want {
				t.Errorf("classify(%s → %s) = %d, want %d", describe(c.o), describe(c.n), got, c.want)
			}
		})
	}
	for _, c := range []struct {
		from, to string
		want     bool
	}{
		{"smallint", "bigint", true}, {"bigint", "integer", false}, {"bigint", "numeric(20,0)", true},
		{"integer", "numeric(9,0)", false}, {"numeric(10,2)", "numeric(12,3)", true}, {"numeric(10,2)", "numeric(10,3)", false},
		{"real", "double precision", true}, {"double precision", "real", false}, {"bit(4)", "bit(8)", false}, {"text", "text", true},
	} {
		if got := pgFits(c.from, c.to); got != c.want {
			t.Errorf("pgFits(%s, %s) = %t", c.from, c.to, got)
		}
	}
}

// columnTypes returns "name type" of a target table's columns, in order.
func (e *env) columnTypes(name string) []string {
	e.t.Helper()
	return e.rows(`SELECT attname || ' ' || format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attname NOT LIKE '\_tm\_%' ORDER BY attnum`, e.table(name))
}

func (e *env) alignment(name string) *alignment {
	e.t.Helper()
	got := e.rows("SELECT obj_description($1::regclass, 'pg_class')", e.table(name))
	var a alignment
	if len(got) != 1 || json.Unmarshal([]byte(got[0]), &a) != nil {
		e.t.Fatalf("no alignment comment on %s: %v", name, got)
	}
	return &a
}

func evoTable(name string, cols ...tidemark.Column) *tidemark.Table {
	return &tidemark.Table{ID: tidemark.TableID{Database: "shop", Name: name}, Columns: cols, Key: []int{0}}
}

// TestSchemaEvolution follows compatible changes: added columns, widened
// types (values unchanged, BIT right-aligned), a dropped column kept with
// its values, keyword column names.
func TestSchemaEvolution(t *testing.T) {
	for _, mode := range []string{KeepColumns, DropColumns} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.Schema.DropColumns = mode })
			id := tidemark.Column{Name: "id", Kind: tidemark.KindInt, Bits: 64}
			s1 := evoTable("evo", id,
				tidemark.Column{Name: "order", Kind: tidemark.KindText, Nullable: true},
				tidemark.Column{Name: "qty", Kind: tidemark.KindInt, Bits: 16, Nullable: true},
				tidemark.Column{Name: "price", Kind: tidemark.KindDecimal, Precision: 8, Scale: 2, Nullable: true},
				tidemark.Column{Name: "f", Kind: tidemark.KindFloat, Nullable: true},
				tidemark.Column{Name: "b", Kind: tidemark.KindBit, Bits: 4, Nullable: true},
				tidemark.Column{Name: "st", Kind: tidemark.KindEnum, Nullable: true},
				tidemark.Column{Name: "u", Kind: tidemark.KindUint, Bits: 32, Nullable: true},
			)
			e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{
				ins(s1, v(1, 1), int64(1), "a", int64(7), tidemark.Decimal("123456.78"), float32(0.1), uint64(0b1011), "paid", uint64(4294967295)),
				ins(s1, v(1, 2), int64(2), "b", nil, nil, nil, nil, nil, nil),
			}})
			// The ALTER: `order` dropped, `select` added, every other
			// column widened.
			s2 := evoTable("evo", id,
				tidemark.Column{Name: "select", Kind: tidemark.KindText, Nullable: true},
				tidemark.Column{Name: "qty", Kind: tidemark.KindInt, Bits: 64, Nullable: true},
				tidemark.Column{Name: "price", Kind: tidemark.KindDecimal, Precision: 12, Scale: 3, Nullable: true},
				tidemark.Column{Name: "f", Kind: tidemark.KindDouble, Nullable: true},
				tidemark.Column{Name: "b", Kind: tidemark.KindBit, Bits: 8, Nullable: true},
				tidemark.Column{Name: "st", Kind: tidemark.KindText, Nullable: true},
				tidemark.Column{Name: "u", Kind: tidemark.KindUint, Bits: 64, Nullable: true},
			)
			e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{
				ins(s2, v(2, 1), int64(3), "new", int64(1)<<40, tidemark.Decimal("123456789.123"), 0.5, uint64(0xff), "x", uint64(1)<<63),
				upd(s2, v(2, 2), row(int64(2), nil, nil, nil, nil, nil, nil, nil), row(int64(2), "upd", nil, nil, nil, nil, nil, nil)),
			}})
			wantTypes := []string{"id bigint", "order text", "qty bigint", "price numeric(12,3)", "f double precision", "b bit(8)", "st text", "u numeric(20,0)", "select text"}
			if mode == DropColumns {
				wantTypes = append(wantTypes[:1], wantTypes[2:]...)
			}
			if got := e.columnTypes("evo"); strings.Join(got, ", ") != strings.Join(wantTypes, ", ") {
				t.Fatalf("columns\n got %v\nwant %v", got, wantTypes)
			}
			got := e.rows(`SELECT id, qty, price::text, f::text, b::text, st, u::text, coalesce("select", '∅') FROM ` + e.table("evo") + ` ORDER BY id`)
			want := []string{
				"1|7|123456.780|0.10000000149011612|00001011|paid|4294967295|∅", // old values unchanged by the widening
				"2|∅|∅|∅|∅|∅|∅|upd",
				"3|1099511627776|123456789.123|0.5|11111111|x|9223372036854775808|new",
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Fatalf("rows\n got %v\nwant %v", got, want)
			}
			a := e.alignment("evo")
			if mode == KeepColumns {
				if strings.Join(a.Kept, ",") != "order" {
					t.Errorf("kept %v", a.Kept)
				}
				if got := e.rows(`SELECT id, coalesce("order", '∅') FROM ` + e.table("evo") + ` ORDER BY id`); strings.Join(got, ",") != "1|a,2|b,3|∅" {
					t.Errorf("kept column %v: old values stay, new rows NULL", got)
				}
			} else if len(a.Kept) != 0 {
				t.Errorf("kept %v in drop mode", a.Kept)
			}
			if c, ok := a.column("qty"); !ok || c.Bits != 64 {
				t.Errorf("alignment %+v", a)
			}
			// A replay of an old batch (rows of the old schema, already
			// applied) is skipped and changes nothing.
			st, err := e.sink.Apply(context.Background(), &tidemark.Batch{Source: "s", Changes: []tidemark.Change{
				ins(s2, v(2, 1), int64(3), "new", int64(1)<<40, tidemark.Decimal("123456789.123"), 0.5, uint64(0xff), "x", uint64(1)<<63)}})
			if err != nil || st.Skipped != 1 {
				t.Fatalf("replay: %+v %v", st, err)
			}
		})
	}
}

// TestIncompatibleSchema: each change that cannot be followed losslessly is
// a TableError wrapping ErrIncompatibleSchema, naming table and column, and
// changes nothing in the target.
func TestIncompatibleSchema(t *testing.T) {
	id := tidemark.Column{Name: "id", Kind: tidemark.KindInt, Bits: 32}
	base := []tidemark.Column{id,
		{Name: "v", Kind: tidemark.KindInt, Bits: 32, Nullable: true},
		{Name: "d", Kind: tidemark.KindDecimal, Precision: 10, Scale: 4, Nullable: true},
		{Name: "ts", Kind: tidemark.KindDateTime, Scale: 6, Nullable: true},
		{Name: "s", Kind: tidemark.KindText, Nullable: true},
	}
	with := func(i int, c tidemark.Column) []tidemark.Column {
		out := append([]tidemark.Column(nil), base...)
		out[i] = c
		return out
	}
	cases := []struct {
		name string
		cols []tidemark.Column
		key  []int
		want string
	}{
		{"narrowed int", with(1, tidemark.Column{Name: "v", Kind: tidemark.KindInt, Bits: 16}), []int{0}, `column "v": int(32 bits) → int(16 bits)`},
		{"signedness", with(1, tidemark.Column{Name: "v", Kind: tidemark.KindUint, Bits: 32}), []int{0}, `column "v"`},
		{"decimal scale", with(2, tidemark.Column{Name: "d", Kind: tidemark.KindDecimal, Precision: 10, Scale: 2}), []int{0}, `column "d": decimal(10,4) → decimal(10,2)`},
		{"fractional seconds", with(3, tidemark.Column{Name: "ts", Kind: tidemark.KindDateTime, Scale: 0}), []int{0}, `column "ts"`},
		{"text to bytes", with(4, tidemark.Column{Name: "s", Kind: tidemark.KindBytes}), []int{0}, `column "s"`},
		{"key changed", base, []int{0, 1}, "business key changed from (id) to (id, v)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			t1 := &tidemark.Table{ID: tidemark.TableID{Database: "shop", Name: "inc"}, Columns: base, Key: []int{0}}
			e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(t1, v(1, 1), int64(1), int64(5), tidemark.Decimal("1.2345"), nil, "x")}})
			before := e.columnTypes("inc")
			t2 := &tidemark.Table{ID: t1.ID, Columns: c.cols, Key: c.key}
			r := make([]any, len(c.cols))
			r[0] = int64(2)
			if len(c.key) > 1 {
				r[1] = int64(6)
			}
			_, err := e.sink.Apply(context.Background(), &tidemark.Batch{Source: "s", Checkpoint: gtid(2), Changes: []tidemark.Change{ins(t2, v(2, 1), r...)}})
			var te *tidemark.TableError
			if !errors.As(err, &te) || te.Table != t1.ID || !errors.Is(err, tidemark.ErrIncompatibleSchema) {
				t.Fatalf("Apply = %v, want a TableError of %s wrapping ErrIncompatibleSchema", err, t1.ID)
			}
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), e.schema+".inc") {
				t.Fatalf("error %q should name the table and say %q", err, c.want)
			}
			if after := e.columnTypes("inc"); strings.Join(after, ",") != strings.Join(before, ",") {
				t.Errorf("target changed: %v → %v", before, after)
			}
			if _, ok := e.checkpoint("s"); ok {
				t.Error("checkpoint stored with a refused batch")
			}
		})
	}
}

// TestApplyDDL: renames keep the data, drops follow the policy, a kept
// column added again starts over, TRUNCATE and DROP TABLE are applied or
// refused, each with its checkpoint in the same transaction.
func TestApplyDDL(t *testing.T) {
	ctx := context.Background()
	id := tidemark.Column{Name: "id", Kind: tidemark.KindInt, Bits: 64}
	s1 := evoTable("t", id, tidemark.Column{Name: "a", Kind: tidemark.KindText, Nullable: true}, tidemark.Column{Name: "b", Kind: tidemark.KindInt, Bits: 32, Nullable: true})
	alter := func(ev tidemark.DDLEvent) tidemark.DDLEvent {
		ev.Op, ev.Table = tidemark.DDLAlterTable, s1.ID
		return ev
	}

	t.Run("rename, drop and re-add", func(t *testing.T) {
		e := newEnv(t)
		e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(s1, v(1, 1), int64(1), "one", int64(10))}})
		// ALTER TABLE t RENAME COLUMN a TO `from`, DROP COLUMN b
		if err := e.sink.ApplyDDL(ctx, "s", []tidemark.DDLEvent{alter(tidemark.DDLEvent{Renames: []tidemark.ColumnRename{{From: "a", To: "from"}}, Dropped: []string{"b"}})}, gtid(2)); err != nil {
			t.Fatal(err)
		}
		if pos, _ := e.checkpoint("s"); pos != gtid(2) {
			t.Fatalf("checkpoint %v", pos)
		}
		if got := e.rows(`SELECT id, "from", b FROM ` + e.table("t")); strings.Join(got, ",") != "1|one|10" {
			t.Fatalf("after rename: %v (the data must stay)", got)
		}
		if a := e.alignment("t"); a.Columns[1].Name != "from" || len(a.Columns) != 2 || strings.Join(a.Kept, ",") != "b" {
			t.Fatalf("alignment %+v", a)
		}
		// Rows of the new schema need no further DDL.
		s2 := evoTable("t", id, tidemark.Column{Name: "from", Kind: tidemark.KindText, Nullable: true})
		e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(s2, v(3, 1), int64(2), "two")}})
		// A replayed rename finds nothing to rename.
		if err := e.sink.ApplyDDL(ctx, "s", []tidemark.DDLEvent{alter(tidemark.DDLEvent{Renames: []tidemark.ColumnRename{{From: "a", To: "from"}}})}, gtid(2)); err != nil {
			t.Fatal(err)
		}
		// ALTER TABLE t ADD COLUMN b BIGINT: the kept b had stale values.
		if err := e.sink.ApplyDDL(ctx, "s", []tidemark.DDLEvent{alter(tidemark.DDLEvent{Added: []string{"b"}})}, gtid(4)); err != nil {
			t.Fatal(err)
		}
		s3 := evoTable("t", id, tidemark.Column{Name: "from", Kind: tidemark.KindText, Nullable: true}, tidemark.Column{Name: "b", Kind: tidemark.KindInt, Bits: 64, Nullable: true})
		e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(s3, v(5, 1), int64(3), "three", int64(30))}})
		if got := e.rows(`SELECT id, "from", coalesce(b::text, '∅') FROM ` + e.table("t") + ` ORDER BY id`); strings.Join(got, ",") != "1|one|∅,2|two|∅,3|three|30" {
			t.Fatalf("after re-add: %v", got)
		}
		// A rename onto an existing column cannot be followed.
		if _, err := e.conn.Exec(ctx, `ALTER TABLE `+e.table("t")+` ADD COLUMN manual int`); err != nil {
			t.Fatal(err)
		}
		err := e.sink.ApplyDDL(ctx, "s", []tidemark.DDLEvent{alter(tidemark.DDLEvent{Renames: []tidemark.ColumnRename{{From: "b", To: "manual"}}})}, gtid(6))
		if !errors.Is(err, tidemark.ErrIncompatibleSchema) {
			t.Fatalf("rename onto an existing column: %v", err)
		}
	})

	t.Run("drop mode", func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.Schema.DropColumns = DropColumns })
		e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(s1, v(1, 1), int64(1), "one", int64(10))}})
		if err := e.sink.ApplyDDL(ctx, "s", []tidemark.DDLEvent{alter(tidemark.DDLEvent{Dropped: []string{"b", "id"}})}, tidemark.Position{}); err != nil {
			t.Fatal(err)
		}
		if got := e.columnTypes("t"); strings.Join(got, ",") != "id bigint,a text" {
			t.Fatalf("columns %v (b dropped, the key never)", got)
		}
	})

	t.Run("truncate and drop table", func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.Schema.DropTable = ApplyDDL })
		other := evoTable("other", id)
		e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(s1, v(1, 1), int64(1), "one", nil), ins(other, v(1, 2), int64(1))}})
		if err := e.sink.SetTableState(ctx, "s", tidemark.TableState{Table: other.ID, Mode: tidemark.TableStreaming}); err != nil {
			t.Fatal(err)
		}
		if err := e.sink.ApplyDDL(ctx, "s", []tidemark.DDLEvent{{Op: tidemark.DDLTruncate, Table: s1.ID}}, gtid(2)); err != nil {
			t.Fatal(err)
		}
		if got := e.rows("SELECT count(*) FROM " + e.table("t")); got[0] != "0" {
			t.Fatalf("after TRUNCATE: %v rows", got)
		}
		if err := e.sink.ApplyDDL(ctx, "s", []tidemark.DDLEvent{{Op: tidemark.DDLDropTable, Table: other.ID}}, gtid(3)); err != nil {
			t.Fatal(err)
		}
		if has, err := e.sink.HasTable(ctx, other.ID); err != nil || has {
			t.Fatalf("HasTable after DROP = %t, %v", has, err)
		}
		if states, _ := e.sink.TableStates(ctx, "s"); len(states) != 0 {
			t.Fatalf("state of the dropped table kept: %+v", states)
		}
		// Rows after the drop create the table again.
		e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(other, v(4, 1), int64(9))}})
		if got := e.rows("SELECT id FROM " + e.table("other")); strings.Join(got, ",") != "9" {
			t.Fatalf("re-created table: %v", got)
		}
	})

	// A TRUNCATE replayed over rows written after it (nemesis seed
	// 75894702205) removes only the rows at its version or older; under
	// hard deletes it raises the table's horizon, so an older insert of a
	// key without a row is skipped. Soft deletes keep no horizon: that
	// insert is written until the replay reaches the TRUNCATE again.
	for _, soft := range []bool{false, true} {
		t.Run(fmt.Sprintf("replayed truncate, soft=%t", soft), func(t *testing.T) {
			var opts []envOption
			if soft {
				opts = append(opts, softDeletes)
			}
			e := newEnv(t, opts...)
			e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(s1, v(1, 1), int64(1), "before", nil), ins(s1, v(3, 1), int64(2), "after", nil)}})
			if err := e.sink.ApplyDDL(ctx, "s", []tidemark.DDLEvent{{Op: tidemark.DDLTruncate, Table: s1.ID, Version: v(2, 0)}}, gtid(2)); err != nil {
				t.Fatal(err)
			}
			if got := e.rows("SELECT id, a FROM " + e.table("t") + " ORDER BY id"); strings.Join(got, ",") != "2|after" {
				t.Fatalf("after the replayed TRUNCATE: %v, want the row written after it (2|after)", got)
			}
			e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(s1, v(1, 2), int64(3), "older", nil), ins(s1, v(3, 1), int64(2), "after", nil)}})
			want := "2|after"
			if soft {
				want = "2|after,3|older"
			}
			if got := e.rows("SELECT id, a FROM " + e.table("t") + " ORDER BY id"); strings.Join(got, ",") != want {
				t.Fatalf("after replayed inserts: %v, want %s", got, want)
			}
		})
	}

	t.Run("refused", func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.Schema.Truncate = RefuseDDL })
		e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(1), Changes: []tidemark.Change{ins(s1, v(1, 1), int64(1), "one", nil)}})
		for _, ev := range []tidemark.DDLEvent{{Op: tidemark.DDLTruncate, Table: s1.ID}, {Op: tidemark.DDLDropTable, Table: s1.ID}} {
			err := e.sink.ApplyDDL(ctx, "s", []tidemark.DDLEvent{ev}, gtid(2))
			var te *tidemark.TableError
			if !errors.As(err, &te) || te.Table != s1.ID || !errors.Is(err, tidemark.ErrDDLRefused) || !strings.Contains(err.Error(), "refuse") {
				t.Fatalf("%s: %v", ev.Op, err)
			}
		}
		if got := e.rows("SELECT count(*) FROM " + e.table("t")); got[0] != "1" {
			t.Fatal("a refused DDL changed the target")
		}
		// Without a target table there is nothing to refuse.
		never := tidemark.TableID{Database: "shop", Name: "never_written"}
		for _, op := range []tidemark.DDLOp{tidemark.DDLTruncate, tidemark.DDLDropTable} {
			if err := e.sink.ApplyDDL(ctx, "s", []tidemark.DDLEvent{{Op: op, Table: never}}, tidemark.Position{}); err != nil {
				t.Fatalf("%s of a table with no target: %v", op, err)
			}
		}
		if pos, _ := e.checkpoint("s"); pos != gtid(1) {
			t.Fatalf("checkpoint moved to %v with a refused DDL", pos)
		}
	})
}

// TestRegistry: states, HasTable, ResetTable (target and watermark gone),
// EnsureTable, and the source lock.
func TestRegistry(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	tbl := simpleTable("reg")
	st := tidemark.TableState{Table: tbl.ID, Mode: tidemark.TableQuarantined, Reason: "why", Floor: v(3, 0)}
	if err := e.sink.SetTableState(ctx, "s", st); err != nil {
		t.Fatal(err)
	}
	if got, err := e.sink.TableStates(ctx, "s"); err != nil || len(got) != 1 || got[0].Mode != st.Mode || got[0].Floor != st.Floor {
		t.Fatalf("TableStates = %+v, %v", got, err)
	}
	if has, _ := e.sink.HasTable(ctx, tbl.ID); has {
		t.Fatal("HasTable before anything")
	}
	if err := e.sink.EnsureTable(ctx, tbl); err != nil {
		t.Fatal(err)
	}
	if has, _ := e.sink.HasTable(ctx, tbl.ID); !has {
		t.Fatal("EnsureTable did not create the table")
	}
	e.apply(&tidemark.Batch{Source: "s", Watermarks: []tidemark.Watermark{{Table: tbl.ID, Value: time.Now()}}, Changes: []tidemark.Change{ins(tbl, v(1, 1), int64(1), "a", nil)}})
	if err := e.sink.ResetTable(ctx, "s", tbl.ID); err != nil {
		t.Fatal(err)
	}
	if has, _ := e.sink.HasTable(ctx, tbl.ID); has {
		t.Fatal("ResetTable kept the table")
	}
	if _, ok, _ := e.store.LoadWatermark(ctx, querier{e.sink.pool}, "s", tbl.ID); ok {
		t.Fatal("ResetTable kept the watermark")
	}
	// The sink forgot the table: the next rows create it again.
	e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(tbl, v(2, 1), int64(2), "b", nil)}})
	if got := e.rows("SELECT id FROM " + e.table("reg")); strings.Join(got, ",") != "2" {
		t.Fatalf("rows %v", got)
	}

	release, ok, err := e.sink.TryLockSource(ctx, "src-a")
	if err != nil || !ok {
		t.Fatalf("first lock: %t %v", ok, err)
	}
	other := newEnv(t)
	if _, ok, err := other.sink.TryLockSource(ctx, "src-a"); err != nil || ok {
		t.Fatalf("second lock on the same source = %t, %v; want refused", ok, err)
	}
	if r2, ok, err := other.sink.TryLockSource(ctx, "src-b"); err != nil || !ok {
		t.Fatalf("another source: %t %v", ok, err)
	} else {
		r2()
	}
	release()
	// release ends the session; the server frees its lock when the
	// backend has processed that, a moment later on a loaded machine.
	var r3 func()
	if !testenv.WaitFor(10*time.Second, func() bool {
		r3, ok, err = other.sink.TryLockSource(ctx, "src-a")
		return err != nil || ok
	}) || err != nil {
		t.Fatalf("after release: %t %v", ok, err)
	}
	r3()
}
