package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"tidemark"
)

func TestKindsRoundTrip(t *testing.T) {
	e := newEnv(t)
	ist := time.FixedZone("IST", 5*3600+1800)
	cases := []struct {
		name  string
		col   tidemark.Column
		value any
		want  string // PostgreSQL's text of the stored value (session in UTC)
	}{
		{"int8", tidemark.Column{Kind: tidemark.KindInt, Bits: 8}, int64(-128), "-128"},
		{"int16", tidemark.Column{Kind: tidemark.KindInt, Bits: 16}, int64(32767), "32767"},
		{"int24", tidemark.Column{Kind: tidemark.KindInt, Bits: 24}, int64(-8388608), "-8388608"},
		{"int32", tidemark.Column{Kind: tidemark.KindInt, Bits: 32}, int64(math.MinInt32), "-2147483648"},
		{"int64", tidemark.Column{Kind: tidemark.KindInt, Bits: 64}, int64(math.MinInt64), "-9223372036854775808"},
		{"uint8", tidemark.Column{Kind: tidemark.KindUint, Bits: 8}, uint64(255), "255"},
		{"uint16", tidemark.Column{Kind: tidemark.KindUint, Bits: 16}, uint64(65535), "65535"},
		{"uint24", tidemark.Column{Kind: tidemark.KindUint, Bits: 24}, uint64(16777215), "16777215"},
		{"uint32", tidemark.Column{Kind: tidemark.KindUint, Bits: 32}, uint64(math.MaxUint32), "4294967295"},
		{"uint64", tidemark.Column{Kind: tidemark.KindUint, Bits: 64}, uint64(math.MaxUint64), "18446744073709551615"},
		{"decimal_65_30", tidemark.Column{Kind: tidemark.KindDecimal, Precision: 65, Scale: 30},
			tidemark.Decimal("-12345678901234567890123456789012345.123456789012345678901234567890"),
			"-12345678901234567890123456789012345.123456789012345678901234567890"},
		{"decimal_10_2", tidemark.Column{Kind: tidemark.KindDecimal, Precision: 10, Scale: 2}, tidemark.Decimal("0.10"), "0.10"},
		{"decimal_unconstrained", tidemark.Column{Kind: tidemark.KindDecimal}, tidemark.Decimal("123.4500"), "123.4500"},
		{"float", tidemark.Column{Kind: tidemark.KindFloat}, float32(3.14), "3.14"},
		{"double", tidemark.Column{Kind: tidemark.KindDouble}, 0.1, "0.1"},
		{"double_max", tidemark.Column{Kind: tidemark.KindDouble}, math.MaxFloat64, "1.7976931348623157e+308"},
		{"text_emoji", tidemark.Column{Kind: tidemark.KindText}, "héllo 😀 世界 \"'\\", "héllo 😀 世界 \"'\\"},
		{"text_empty", tidemark.Column{Kind: tidemark.KindText}, "", ""},
		{"enum", tidemark.Column{Kind: tidemark.KindEnum}, "medium", "medium"},
		{"set", tidemark.Column{Kind: tidemark.KindSet}, "a,c", "a,c"},
		{"bytes_nul", tidemark.Column{Kind: tidemark.KindBytes}, []byte{0, 1, 0xff, 0}, `\x0001ff00`},
		{"bytes_empty", tidemark.Column{Kind: tidemark.KindBytes}, []byte{}, `\x`},
		{"bit1", tidemark.Column{Kind: tidemark.KindBit, Bits: 1}, uint64(1), "1"},
		{"bit10", tidemark.Column{Kind: tidemark.KindBit, Bits: 10}, uint64(0b1000000011), "1000000011"},
		{"bit64", tidemark.Column{Kind: tidemark.KindBit, Bits: 64}, uint64(0x8000000000000001), "1" + strings.Repeat("0", 62) + "1"},
		{"year", tidemark.Column{Kind: tidemark.KindYear}, int64(2155), "2155"},
		{"date", tidemark.Column{Kind: tidemark.KindDate}, time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC), "2024-02-29"},
		{"date_1000", tidemark.Column{Kind: tidemark.KindDate}, time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), "1000-01-01"},
		{"time_negative", tidemark.Column{Kind: tidemark.KindTime}, -(838*time.Hour + 59*time.Minute + 59*time.Second), "-838:59:59"},
		{"time_over_24h", tidemark.Column{Kind: tidemark.KindTime}, 25*time.Hour + 30*time.Minute + time.Microsecond, "25:30:00.000001"},
		{"time_zero", tidemark.Column{Kind: tidemark.KindTime}, time.Duration(0), "00:00:00"},
		{"datetime", tidemark.Column{Kind: tidemark.KindDateTime}, time.Date(2024, 3, 10, 2, 30, 0, 123456000, time.UTC), "2024-03-10 02:30:00.123456+00"},
		{"datetime_zone", tidemark.Column{Kind: tidemark.KindDateTime}, time.Date(2024, 3, 10, 8, 0, 0, 0, ist), "2024-03-10 02:30:00+00"},
		{"timestamp", tidemark.Column{Kind: tidemark.KindTimestamp}, time.Unix(1, 0).UTC(), "1970-01-01 00:00:01+00"},
		{"datetime_1000", tidemark.Column{Kind: tidemark.KindDateTime}, time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), "1000-01-01 00:00:00+00"},
		{"json", tidemark.Column{Kind: tidemark.KindJSON}, tidemark.JSON(`{"a":{"b":[1,2.50,"😀",null,true]},"c":"x"}`),
			`{"a": {"b": [1, 2.50, "😀", null, true]}, "c": "x"}`},
		{"json_scalar_string", tidemark.Column{Kind: tidemark.KindJSON}, tidemark.JSON(`"s"`), `"s"`},
	}
	tbl := &tidemark.Table{ID: tidemark.TableID{Database: "src", Name: "kinds"},
		Columns: []tidemark.Column{{Name: "id", Kind: tidemark.KindInt, Bits: 64}}, Key: []int{0}}
	full, nulls := []any{int64(1)}, []any{int64(2)}
	for _, c := range cases {
		col := c.col
		col.Name = "c_" + c.name
		col.Nullable = true
		tbl.Columns = append(tbl.Columns, col)
		full = append(full, c.value)
		nulls = append(nulls, nil)
	}
	st := e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(tbl, v(1, 1), full...), ins(tbl, v(1, 2), nulls...)}})
	if st != (tidemark.ApplyStats{Inserted: 2}) {
		t.Fatalf("stats = %+v", st)
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			col := tidemark.QuotePostgres(tbl.Columns[i+1].Name)
			var got *string
			if err := e.conn.QueryRow(context.Background(), "SELECT "+col+"::text FROM "+e.table("kinds")+" WHERE id = 1").Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got == nil || *got != c.want {
				t.Errorf("stored %v, want %q", got, c.want)
			}
			var isNull bool
			if err := e.conn.QueryRow(context.Background(), "SELECT "+col+" IS NULL FROM "+e.table("kinds")+" WHERE id = 2").Scan(&isNull); err != nil {
				t.Fatal(err)
			}
			if !isNull {
				t.Error("NULL did not round-trip")
			}
		})
	}
	// The column types, as documented in docs/type-mapping.md.
	got := e.rows(`SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = $1::regclass AND attname IN ('c_uint64', 'c_uint32', 'c_uint8', 'c_decimal_65_30', 'c_bit10', 'c_time_zero', 'c_datetime', 'c_json')
ORDER BY attname`, e.table("kinds"))
	want := []string{
		"c_bit10|bit(10)", "c_datetime|timestamp with time zone", "c_decimal_65_30|numeric(65,30)",
		"c_json|jsonb", "c_time_zero|interval", "c_uint32|bigint", "c_uint64|numeric(20,0)", "c_uint8|smallint",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("column types:\n got %q\nwant %q", got, want)
	}
}

func TestConvertRejects(t *testing.T) {
	id := tidemark.TableID{Database: "db", Name: "tbl"}
	cases := []struct {
		name  string
		col   tidemark.Column
		value any
	}{
		{"int as string", tidemark.Column{Kind: tidemark.KindInt, Bits: 64}, "1"},
		{"int as int32", tidemark.Column{Kind: tidemark.KindInt, Bits: 32}, int32(1)},
		{"smallint overflow", tidemark.Column{Kind: tidemark.KindInt, Bits: 16}, int64(40000)},
		{"uint as int64", tidemark.Column{Kind: tidemark.KindUint, Bits: 64}, int64(1)},
		{"uint8 overflow", tidemark.Column{Kind: tidemark.KindUint, Bits: 8}, uint64(40000)},
		{"decimal as string", tidemark.Column{Kind: tidemark.KindDecimal}, "1.5"},
		{"decimal as float", tidemark.Column{Kind: tidemark.KindDecimal}, 1.5},
		{"decimal garbage", tidemark.Column{Kind: tidemark.KindDecimal}, tidemark.Decimal("1e5")},
		{"decimal empty", tidemark.Column{Kind: tidemark.KindDecimal}, tidemark.Decimal("-")},
		{"float as float64", tidemark.Column{Kind: tidemark.KindFloat}, 1.5},
		{"text with NUL", tidemark.Column{Kind: tidemark.KindText}, "a\x00b"},
		{"text invalid utf8", tidemark.Column{Kind: tidemark.KindText}, "\xff"},
		{"text as bytes", tidemark.Column{Kind: tidemark.KindText}, []byte("x")},
		{"bytes as string", tidemark.Column{Kind: tidemark.KindBytes}, "x"},
		{"bit overflow", tidemark.Column{Kind: tidemark.KindBit, Bits: 3}, uint64(8)},
		{"date not midnight", tidemark.Column{Kind: tidemark.KindDate}, time.Date(2024, 1, 1, 5, 30, 0, 0, time.UTC)},
		{"date as string", tidemark.Column{Kind: tidemark.KindDate}, "2024-01-01"},
		{"time nanoseconds", tidemark.Column{Kind: tidemark.KindTime}, time.Nanosecond},
		{"datetime nanoseconds", tidemark.Column{Kind: tidemark.KindDateTime}, time.Date(2024, 1, 1, 0, 0, 0, 1, time.UTC)},
		{"datetime as string", tidemark.Column{Kind: tidemark.KindTimestamp}, "2024-01-01 00:00:00"},
		{"json invalid", tidemark.Column{Kind: tidemark.KindJSON}, tidemark.JSON("{")},
		{"json as string", tidemark.Column{Kind: tidemark.KindJSON}, `{}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.col.Name = "secret_col"
			_, err := convert(id, &c.col, c.value)
			var ve *tidemark.ValueError
			if !errors.As(err, &ve) {
				t.Fatalf("convert = %v, want a *tidemark.ValueError", err)
			}
			if ve.Table != id || ve.Column != "secret_col" || !strings.Contains(err.Error(), "db.tbl.secret_col") {
				t.Errorf("error %q does not name db.tbl.secret_col", err)
			}
		})
	}
}

func TestInsertUpdateDelete(t *testing.T) {
	e := newEnv(t)
	tbl := simpleTable("items")
	steps := []struct {
		name    string
		changes []tidemark.Change
		want    tidemark.ApplyStats
		rows    []string
	}{
		{"insert", []tidemark.Change{ins(tbl, v(1, 1), int64(1), "a", int64(10)), ins(tbl, v(1, 2), int64(2), "b", nil)},
			tidemark.ApplyStats{Inserted: 2}, []string{"1|a|10|1|1", "2|b|∅|1|2"}},
		{"update", []tidemark.Change{upd(tbl, v(2, 1), row(int64(1), "a", int64(10)), row(int64(1), "a2", int64(11)))},
			tidemark.ApplyStats{Updated: 1}, []string{"1|a2|11|2|1", "2|b|∅|1|2"}},
		{"update without before image", []tidemark.Change{{Op: tidemark.OpUpdate, Table: tbl, After: row(int64(2), "b2", int64(5)), Version: v(3, 1), CommitTime: commitT0.Add(3 * time.Second)}},
			tidemark.ApplyStats{Updated: 1}, []string{"1|a2|11|2|1", "2|b2|5|3|1"}},
		{"read upserts", []tidemark.Change{{Op: tidemark.OpRead, Table: tbl, After: row(int64(3), "c", int64(1)), Version: v(3, 0)}},
			tidemark.ApplyStats{Inserted: 1}, []string{"1|a2|11|2|1", "2|b2|5|3|1", "3|c|1|3|0"}},
		{"delete", []tidemark.Change{del(tbl, v(4, 1), int64(1), "a2", int64(11))},
			tidemark.ApplyStats{Deleted: 1}, []string{"2|b2|5|3|1", "3|c|1|3|0"}},
		{"delete of a missing row", []tidemark.Change{del(tbl, v(5, 1), int64(99), "x", nil)},
			tidemark.ApplyStats{Skipped: 1}, []string{"2|b2|5|3|1", "3|c|1|3|0"}},
	}
	for i, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			st := e.apply(&tidemark.Batch{Source: "s", Changes: s.changes, Checkpoint: gtid(i + 1)})
			if st != s.want {
				t.Errorf("stats = %+v, want %+v", st, s.want)
			}
			if got := e.rows(`SELECT id, name, qty, _tm_seq, _tm_idx FROM ` + e.table("items") + ` ORDER BY id`); !reflect.DeepEqual(got, s.rows) {
				t.Errorf("rows = %q, want %q", got, s.rows)
			}
			if pos, ok := e.checkpoint("s"); !ok || pos != gtid(i+1) {
				t.Errorf("checkpoint = %v %t, want %v", pos, ok, gtid(i+1))
			}
		})
	}
	// Metadata: commit time from the source, loaded_at from PostgreSQL.
	got := e.rows(`SELECT id, _tm_commit_time::text, _tm_loaded_at <= now() AND _tm_loaded_at > now() - interval '1 hour' FROM ` + e.table("items") + ` ORDER BY id`)
	want := []string{"2|" + "2026-01-02 03:04:08+00|true", "3|∅|true"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("metadata = %q, want %q", got, want)
	}
}

func TestLoadedAtStampedOnUpdate(t *testing.T) {
	e := newEnv(t)
	tbl := simpleTable("la")
	e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(tbl, v(1, 1), int64(1), "a", nil)}})
	first := e.rows(`SELECT _tm_loaded_at FROM ` + e.table("la"))
	time.Sleep(20 * time.Millisecond)
	e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(tbl, v(2, 1), int64(1), "b", nil)}})
	second := e.rows(`SELECT _tm_loaded_at FROM ` + e.table("la"))
	if reflect.DeepEqual(first, second) {
		t.Errorf("_tm_loaded_at not restamped on update: %q", first)
	}
	// A skipped change leaves it alone.
	e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(tbl, v(1, 5), int64(1), "old", nil)}})
	if third := e.rows(`SELECT _tm_loaded_at FROM ` + e.table("la")); !reflect.DeepEqual(second, third) {
		t.Errorf("_tm_loaded_at changed by a skipped change: %q → %q", second, third)
	}
}

func TestVersionGuard(t *testing.T) {
	tbl := simpleTable("guard")
	cases := []struct {
		name    string
		batches [][]tidemark.Change
		last    tidemark.ApplyStats
		rows    []string
	}{
		{"older update after newer",
			[][]tidemark.Change{{ins(tbl, v(2, 1), int64(1), "v2", nil)}, {ins(tbl, v(1, 1), int64(1), "v1", nil)}},
			tidemark.ApplyStats{Skipped: 1}, []string{"1|v2|2|1"}},
		{"same seq, lower index",
			[][]tidemark.Change{{ins(tbl, v(2, 5), int64(1), "2.5", nil)}, {ins(tbl, v(2, 4), int64(1), "2.4", nil)}},
			tidemark.ApplyStats{Skipped: 1}, []string{"1|2.5|2|5"}},
		{"same seq, higher index wins",
			[][]tidemark.Change{{ins(tbl, v(2, 4), int64(1), "2.4", nil)}, {ins(tbl, v(2, 5), int64(1), "2.5", nil)}},
			tidemark.ApplyStats{Updated: 1}, []string{"1|2.5|2|5"}},
		{"index compares only within seq",
			[][]tidemark.Change{{ins(tbl, v(2, 1), int64(1), "2.1", nil)}, {ins(tbl, v(1, 99), int64(1), "1.99", nil)}},
			tidemark.ApplyStats{Skipped: 1}, []string{"1|2.1|2|1"}},
		{"equal version is a no-op",
			[][]tidemark.Change{{ins(tbl, v(3, 1), int64(1), "a", nil)}, {ins(tbl, v(3, 1), int64(1), "b", nil)}},
			tidemark.ApplyStats{Skipped: 1}, []string{"1|a|3|1"}},
		{"older delete is skipped",
			[][]tidemark.Change{{ins(tbl, v(5, 1), int64(1), "v5", nil)}, {del(tbl, v(4, 1), int64(1), "v4", nil)}},
			tidemark.ApplyStats{Skipped: 1}, []string{"1|v5|5|1"}},
		{"seq above 2^32",
			[][]tidemark.Change{{ins(tbl, v(1<<40|7, 1), int64(1), "big", nil)}, {ins(tbl, v(1<<40|6, 9), int64(1), "smaller", nil)}},
			tidemark.ApplyStats{Skipped: 1}, []string{"1|big|1099511627783|1"}},
	}
	for _, mode := range []DeleteMode{DeleteHard, DeleteSoft} {
		for _, c := range cases {
			t.Run(string(mode)+"/"+c.name, func(t *testing.T) {
				e := newEnv(t, func(cfg *Config) { cfg.DeleteMode = mode })
				var st tidemark.ApplyStats
				for _, b := range c.batches {
					st = e.apply(&tidemark.Batch{Source: "s", Changes: b})
				}
				if st != c.last {
					t.Errorf("last stats = %+v, want %+v", st, c.last)
				}
				if got := e.rows(`SELECT id, name, _tm_seq, _tm_idx FROM ` + e.table("guard") + ` ORDER BY id`); !reflect.DeepEqual(got, c.rows) {
					t.Errorf("rows = %q, want %q", got, c.rows)
				}
			})
		}
	}
}

func TestReplayIsAllSkipped(t *testing.T) {
	for _, mode := range []DeleteMode{DeleteHard, DeleteSoft} {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, func(cfg *Config) { cfg.DeleteMode = mode })
			tbl := simpleTable("replay")
			b := &tidemark.Batch{Source: "s", Checkpoint: gtid(7), Changes: []tidemark.Change{
				ins(tbl, v(7, 1), int64(1), "a", int64(1)),
				ins(tbl, v(7, 2), int64(2), "b", int64(2)),
				upd(tbl, v(7, 3), row(int64(3), "c", nil), row(int64(3), "c2", nil)),
				del(tbl, v(7, 4), int64(4), "d", nil),
			}}
			// Row 3 and 4 exist from an earlier transaction.
			e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{
				ins(tbl, v(6, 1), int64(3), "c", nil), ins(tbl, v(6, 2), int64(4), "d", nil)}})
			first := e.apply(b)
			if first != (tidemark.ApplyStats{Inserted: 2, Updated: 1, Deleted: 1}) {
				t.Errorf("first apply = %+v", first)
			}
			before := e.rows(`SELECT id, name, qty, _tm_seq, _tm_idx, _tm_loaded_at FROM ` + e.table("replay") + ` ORDER BY id`)
			for i := 0; i < 2; i++ {
				again := e.apply(b)
				want := tidemark.ApplyStats{Skipped: 4}
				if again != want {
					t.Errorf("replay %d = %+v, want %+v", i, again, want)
				}
			}
			if after := e.rows(`SELECT id, name, qty, _tm_seq, _tm_idx, _tm_loaded_at FROM ` + e.table("replay") + ` ORDER BY id`); !reflect.DeepEqual(before, after) {
				t.Errorf("replay changed rows:\n%q\n%q", before, after)
			}
		})
	}
}

func TestKeyChange(t *testing.T) {
	tbl := simpleTable("keys")
	cases := []struct {
		name  string
		mode  DeleteMode
		batch []tidemark.Change
		want  tidemark.ApplyStats
		rows  []string // id|name|deleted (soft) or id|name
	}{
		{"hard: move 1 to 5", DeleteHard,
			[]tidemark.Change{upd(tbl, v(2, 1), row(int64(1), "a", nil), row(int64(5), "a", nil))},
			tidemark.ApplyStats{Inserted: 1}, []string{"2|b", "5|a"}},
		{"hard: swap 1 and 2 through 9", DeleteHard,
			[]tidemark.Change{
				upd(tbl, v(2, 1), row(int64(1), "a", nil), row(int64(9), "a", nil)),
				upd(tbl, v(2, 2), row(int64(2), "b", nil), row(int64(1), "b", nil)),
				upd(tbl, v(2, 3), row(int64(9), "a", nil), row(int64(2), "a", nil)),
			},
			// Change 1 (1→9) is superseded on both keys (key 1 by change 2's
			// upsert, key 9 by change 3's delete): coalesced. Changes 2 and 3
			// are counted by their upserts of keys 1 and 2: updated.
			tidemark.ApplyStats{Updated: 2, Coalesced: 1}, []string{"1|b", "2|a"}},
		{"hard: move then move back", DeleteHard,
			[]tidemark.Change{
				upd(tbl, v(2, 1), row(int64(1), "a", nil), row(int64(7), "a", nil)),
				upd(tbl, v(2, 2), row(int64(7), "a", nil), row(int64(1), "a2", nil)),
			},
			// Change 1's ops (del 1, up 7) are both superseded by change 2's (del 7, up 1).
			tidemark.ApplyStats{Updated: 1, Coalesced: 1}, []string{"1|a2", "2|b"}},
		{"hard: moved then new key updated", DeleteHard,
			[]tidemark.Change{
				upd(tbl, v(2, 1), row(int64(1), "a", nil), row(int64(5), "a", nil)),
				upd(tbl, v(2, 2), row(int64(5), "a", nil), row(int64(5), "a5", nil)),
			},
			// Change 1 keeps only its delete of key 1: counted as deleted.
			tidemark.ApplyStats{Deleted: 1, Inserted: 1}, []string{"2|b", "5|a5"}},
		{"soft: move 1 to 5", DeleteSoft,
			[]tidemark.Change{upd(tbl, v(2, 1), row(int64(1), "a", nil), row(int64(5), "a", nil))},
			tidemark.ApplyStats{Inserted: 1}, []string{"1|a|true", "2|b|false", "5|a|false"}},
		{"soft: move then move back", DeleteSoft,
			[]tidemark.Change{
				upd(tbl, v(2, 1), row(int64(1), "a", nil), row(int64(7), "a", nil)),
				upd(tbl, v(2, 2), row(int64(7), "a", nil), row(int64(1), "a2", nil)),
			},
			tidemark.ApplyStats{Updated: 1, Coalesced: 1}, []string{"1|a2|false", "2|b|false", "7|a|true"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, func(cfg *Config) { cfg.DeleteMode = c.mode })
			e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{
				ins(tbl, v(1, 1), int64(1), "a", nil), ins(tbl, v(1, 2), int64(2), "b", nil)}})
			st := e.apply(&tidemark.Batch{Source: "s", Changes: c.batch})
			if st != c.want {
				t.Errorf("stats = %+v, want %+v", st, c.want)
			}
			q := `SELECT id, name FROM ` + e.table("keys") + ` ORDER BY id`
			if c.mode == DeleteSoft {
				q = `SELECT id, name, _tm_deleted FROM ` + e.table("keys") + ` ORDER BY id`
			}
			if got := e.rows(q); !reflect.DeepEqual(got, c.rows) {
				t.Errorf("rows = %q, want %q", got, c.rows)
			}
			// Replaying the batch changes nothing.
			before := e.rows(q)
			e.apply(&tidemark.Batch{Source: "s", Changes: c.batch})
			if after := e.rows(q); !reflect.DeepEqual(before, after) {
				t.Errorf("replay changed rows: %q → %q", before, after)
			}
		})
	}
}

func TestSoftDelete(t *testing.T) {
	e := newEnv(t, softDeletes)
	tbl := simpleTable("soft")
	q := `SELECT id, name, qty, _tm_deleted, _tm_deleted_at::text, _tm_seq FROM ` + e.table("soft") + ` ORDER BY id`
	steps := []struct {
		name    string
		changes []tidemark.Change
		want    tidemark.ApplyStats
		rows    []string
	}{
		{"insert", []tidemark.Change{ins(tbl, v(1, 1), int64(1), "a", int64(1))},
			tidemark.ApplyStats{Inserted: 1}, []string{"1|a|1|false|∅|1"}},
		{"delete keeps the before image", []tidemark.Change{del(tbl, v(2, 1), int64(1), "a-before", int64(2))},
			tidemark.ApplyStats{Deleted: 1}, []string{"1|a-before|2|true|2026-01-02 03:04:07+00|2"}},
		{"older insert does not resurrect", []tidemark.Change{ins(tbl, v(1, 1), int64(1), "a", int64(1))},
			tidemark.ApplyStats{Skipped: 1}, []string{"1|a-before|2|true|2026-01-02 03:04:07+00|2"}},
		{"replayed delete is skipped", []tidemark.Change{del(tbl, v(2, 1), int64(1), "a-before", int64(2))},
			tidemark.ApplyStats{Skipped: 1}, []string{"1|a-before|2|true|2026-01-02 03:04:07+00|2"}},
		{"later insert brings it back", []tidemark.Change{ins(tbl, v(3, 1), int64(1), "again", int64(3))},
			tidemark.ApplyStats{Updated: 1}, []string{"1|again|3|false|∅|3"}},
		{"delete of an unknown row leaves a tombstone", []tidemark.Change{del(tbl, v(4, 1), int64(8), "gone", nil)},
			tidemark.ApplyStats{Deleted: 1}, []string{"1|again|3|false|∅|3", "8|gone|∅|true|2026-01-02 03:04:09+00|4"}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			st := e.apply(&tidemark.Batch{Source: "s", Changes: s.changes})
			if st != s.want {
				t.Errorf("stats = %+v, want %+v", st, s.want)
			}
			if got := e.rows(q); !reflect.DeepEqual(got, s.rows) {
				t.Errorf("rows = %q, want %q", got, s.rows)
			}
		})
	}
}

func TestCoalescing(t *testing.T) {
	tbl := simpleTable("co")
	cases := []struct {
		name    string
		changes []tidemark.Change
		want    tidemark.ApplyStats
		rows    []string
	}{
		{"same key three times", []tidemark.Change{
			ins(tbl, v(1, 1), int64(1), "a", nil),
			upd(tbl, v(1, 2), row(int64(1), "a", nil), row(int64(1), "b", nil)),
			upd(tbl, v(2, 1), row(int64(1), "b", nil), row(int64(1), "c", nil)),
		}, tidemark.ApplyStats{Inserted: 1, Coalesced: 2}, []string{"1|c|2|1"}},
		{"insert then delete", []tidemark.Change{
			ins(tbl, v(1, 1), int64(1), "a", nil),
			del(tbl, v(1, 2), int64(1), "a", nil),
		}, tidemark.ApplyStats{Skipped: 1, Coalesced: 1}, nil},
		{"delete then insert", []tidemark.Change{
			del(tbl, v(1, 1), int64(1), "a", nil),
			ins(tbl, v(1, 2), int64(1), "b", nil),
		}, tidemark.ApplyStats{Inserted: 1, Coalesced: 1}, []string{"1|b|1|2"}},
		{"out of order keeps the newest", []tidemark.Change{
			ins(tbl, v(3, 1), int64(1), "newest", nil),
			ins(tbl, v(2, 1), int64(1), "older", nil),
		}, tidemark.ApplyStats{Inserted: 1, Coalesced: 1}, []string{"1|newest|3|1"}},
		{"duplicate change", []tidemark.Change{
			ins(tbl, v(3, 1), int64(1), "x", nil),
			ins(tbl, v(3, 1), int64(1), "x", nil),
		}, tidemark.ApplyStats{Inserted: 1, Coalesced: 1}, []string{"1|x|3|1"}},
		{"different keys are not merged", []tidemark.Change{
			ins(tbl, v(1, 1), int64(1), "a", nil),
			ins(tbl, v(1, 2), int64(2), "b", nil),
			ins(tbl, v(1, 3), int64(1), "a2", nil),
		}, tidemark.ApplyStats{Inserted: 2, Coalesced: 1}, []string{"1|a2|1|3", "2|b|1|2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			st := e.apply(&tidemark.Batch{Source: "s", Changes: c.changes})
			if st != c.want {
				t.Errorf("stats = %+v, want %+v", st, c.want)
			}
			if got := e.rows(`SELECT id, name, _tm_seq, _tm_idx FROM ` + e.table("co") + ` ORDER BY id`); !reflect.DeepEqual(got, c.rows) {
				t.Errorf("rows = %q, want %q", got, c.rows)
			}
		})
	}
}

func TestCompositeKey(t *testing.T) {
	e := newEnv(t)
	tbl := &tidemark.Table{
		ID: tidemark.TableID{Database: "shop", Name: "order_lines"},
		Columns: []tidemark.Column{
			{Name: "note", Kind: tidemark.KindText, Nullable: true},
			{Name: "order id", Kind: tidemark.KindInt, Bits: 64},
			{Name: "line", Kind: tidemark.KindText},
		},
		Key: []int{1, 2},
	}
	e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{
		ins(tbl, v(1, 1), "x", int64(1), "a"),
		ins(tbl, v(1, 2), "y", int64(1), "b"),
		ins(tbl, v(1, 3), "z", int64(2), "a"),
	}})
	st := e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{
		upd(tbl, v(2, 1), row("y", int64(1), "b"), row("y2", int64(1), "b")),
		del(tbl, v(2, 2), "z", int64(2), "a"),
		upd(tbl, v(2, 3), row("x", int64(1), "a"), row("x", int64(3), "a")), // key change on one part
	}})
	if st != (tidemark.ApplyStats{Updated: 1, Deleted: 1, Inserted: 1}) {
		t.Errorf("stats = %+v", st)
	}
	got := e.rows(`SELECT "order id", line, note FROM ` + e.table("order_lines") + ` ORDER BY 1, 2`)
	want := []string{"1|b|y2", "3|a|x"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("rows = %q, want %q", got, want)
	}
	pk := e.rows(`SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = $1::regclass AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)`, e.table("order_lines"))
	if !reflect.DeepEqual(pk, []string{"order id", "line"}) {
		t.Errorf("primary key = %q", pk)
	}
}

func TestStatsIdentityRandom(t *testing.T) {
	// A model check: random inserts, updates (some changing the key) and
	// deletes over a small key space, in batches; the target must equal the
	// model, the stats must add up, and replaying every batch from the
	// start must converge to the same target.
	for _, mode := range []DeleteMode{DeleteHard, DeleteSoft} {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, func(cfg *Config) { cfg.DeleteMode = mode })
			tbl := simpleTable("model")
			model := map[int64]string{}
			rng := newRand(42)
			var batches []*tidemark.Batch
			seq := uint64(0)
			for bi := 0; bi < 30; bi++ {
				b := &tidemark.Batch{Source: "s", Checkpoint: gtid(bi + 1)}
				for ti := 0; ti < 1+rng.intn(3); ti++ { // transactions
					seq++
					for ci := 0; ci < 1+rng.intn(6); ci++ {
						ver := v(seq, uint32(ci+1))
						k := int64(rng.intn(12))
						name := fmt.Sprintf("n%d.%d", seq, ci)
						cur, exists := model[k]
						switch {
						case !exists:
							b.Changes = append(b.Changes, ins(tbl, ver, k, name, nil))
							model[k] = name
						case rng.intn(4) == 0:
							b.Changes = append(b.Changes, del(tbl, ver, k, cur, nil))
							delete(model, k)
						case rng.intn(3) == 0:
							nk := int64(rng.intn(12))
							if _, taken := model[nk]; taken && nk != k {
								nk = k
							}
							b.Changes = append(b.Changes, upd(tbl, ver, row(k, cur, nil), row(nk, name, nil)))
							delete(model, k)
							model[nk] = name
						default:
							b.Changes = append(b.Changes, upd(tbl, ver, row(k, cur, nil), row(k, name, nil)))
							model[k] = name
						}
					}
				}
				batches = append(batches, b)
			}
			var want []string
			for k := int64(0); k < 12; k++ {
				if n, ok := model[k]; ok {
					want = append(want, fmt.Sprintf("%d|%s", k, n))
				}
			}
			q := `SELECT id, name FROM ` + e.table("model") + ` ORDER BY id`
			if mode == DeleteSoft {
				q = `SELECT id, name FROM ` + e.table("model") + ` WHERE NOT _tm_deleted ORDER BY id`
			}
			for round := 0; round < 2; round++ {
				var total tidemark.ApplyStats
				for _, b := range batches {
					total.Add(e.apply(b)) // e.apply checks the identity
				}
				if got := e.rows(q); !reflect.DeepEqual(got, want) {
					t.Fatalf("round %d: target %q, model %q", round, got, want)
				}
				if round == 1 && total.Inserted+total.Updated > 0 && mode == DeleteSoft {
					t.Errorf("replay with soft deletes changed rows: %+v", total)
				}
				t.Logf("round %d: %+v", round, total)
			}
		})
	}
}

// rnd is a tiny deterministic generator (math/rand/v2 would do too; this
// keeps the sequence stable across Go versions).
type rnd struct{ s uint64 }

func newRand(seed uint64) *rnd { return &rnd{seed} }
func (r *rnd) intn(n int) int {
	r.s ^= r.s << 13
	r.s ^= r.s >> 7
	r.s ^= r.s << 17
	return int(r.s % uint64(n))
}

// TestExistingTableMissingColumn: a target table made before alignments
// (or by hand) that lacks a source column gets it added; one that lacks
// tidemark's metadata columns is refused, naming the table and column.
func TestExistingTableMissingColumn(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.conn.Exec(ctx, `CREATE SCHEMA `+tidemark.QuotePostgres(e.schema)+`; CREATE TABLE `+e.table("items")+
		` (id bigint PRIMARY KEY, name text, _tm_seq bigint NOT NULL, _tm_idx integer NOT NULL, _tm_commit_time timestamptz, _tm_loaded_at timestamptz NOT NULL DEFAULT now());
		CREATE TABLE `+e.table("plain")+` (id bigint PRIMARY KEY, name text, qty integer)`); err != nil {
		t.Fatal(err)
	}
	e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(simpleTable("items"), v(1, 1), int64(1), "a", int64(1))}})
	if got := e.rows("SELECT id, name, qty FROM " + e.table("items")); len(got) != 1 || got[0] != "1|a|1" {
		t.Fatalf("rows %v", got)
	}
	_, err := e.sink.Apply(ctx, &tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(simpleTable("plain"), v(1, 1), int64(1), "a", int64(1))}})
	if err == nil || !strings.Contains(err.Error(), e.schema+".plain") || !strings.Contains(err.Error(), `column "_tm_seq"`) {
		t.Fatalf("Apply = %v, want an error naming the table and column _tm_seq", err)
	}
}

func TestInvalidTables(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		name  string
		table *tidemark.Table
		want  string
	}{
		{"quote in table name", &tidemark.Table{ID: tidemark.TableID{Database: "d", Name: `x"; drop`}, Columns: simpleTable("x").Columns, Key: []int{0}}, "invalid identifier"},
		{"reserved column", &tidemark.Table{ID: tidemark.TableID{Database: "d", Name: "x"}, Columns: []tidemark.Column{{Name: "_tm_seq", Kind: tidemark.KindInt}}, Key: []int{0}}, "reserved"},
		{"no key", &tidemark.Table{ID: tidemark.TableID{Database: "d", Name: "x"}, Columns: simpleTable("x").Columns}, "no business key"},
		{"bad bit width", &tidemark.Table{ID: tidemark.TableID{Database: "d", Name: "x"}, Columns: []tidemark.Column{{Name: "b", Kind: tidemark.KindBit, Bits: 65}}, Key: []int{0}}, "BIT width"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			row := make([]any, len(c.table.Columns))
			_, err := e.sink.Apply(context.Background(), &tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(c.table, v(1, 1), row...)}})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Apply = %v, want an error containing %q", err, c.want)
			}
		})
	}
	_, err := e.sink.Apply(context.Background(), &tidemark.Batch{Source: "s", Changes: []tidemark.Change{
		{Op: tidemark.OpUpdate, Table: simpleTable("x"), Before: row(int64(1)), After: row(int64(1), "a", nil), Version: v(1, 1)}}})
	if err == nil || !strings.Contains(err.Error(), "before image has 1 values for 3 columns") {
		t.Errorf("short image: %v", err)
	}
}
