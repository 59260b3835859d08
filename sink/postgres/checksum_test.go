package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"tidemark"
)

// TestAssertNoDuplicateKeys shows that the post-load assertion really
// queries: with the primary key in place it passes; after the key is dropped
// and a key inserted twice, it fails naming the table and the key — also
// when only the rows loaded since a time are checked, and not when the
// duplicate is older than that.
func TestAssertNoDuplicateKeys(t *testing.T) {
	e, ctx, tbl := dupsTable(t, "dups")
	applied := e.sink.AppliedTables()
	if len(applied) != 1 || applied[0].ID != tbl.ID {
		t.Fatalf("applied tables %v", applied)
	}
	if err := e.sink.AssertNoDuplicateKeys(ctx, tbl, time.Time{}); err != nil {
		t.Fatalf("clean table: %v", err)
	}
	if _, err := e.conn.Exec(ctx, "ALTER TABLE "+e.table("dups")+" DROP CONSTRAINT dups_pkey"); err != nil {
		t.Fatal(err)
	}
	if err := e.sink.AssertNoDuplicateKeys(ctx, tbl, time.Time{}); err != nil {
		t.Fatalf("no duplicate yet: %v", err)
	}
	var before time.Time
	if err := e.conn.QueryRow(ctx, "SELECT now()").Scan(&before); err != nil {
		t.Fatal(err)
	}
	if _, err := e.conn.Exec(ctx, "INSERT INTO "+e.table("dups")+" (id, name, qty, _tm_seq, _tm_idx) VALUES (2, 'b again', 2, 9, 1), (2, 'b thrice', 2, 9, 2)"); err != nil {
		t.Fatal(err)
	}
	for _, since := range []time.Time{{}, before} {
		err := e.sink.AssertNoDuplicateKeys(ctx, tbl, since)
		if !errors.Is(err, tidemark.ErrDuplicateKeys) {
			t.Fatalf("since %v: %v, want ErrDuplicateKeys", since, err)
		}
		if msg := err.Error(); !strings.Contains(msg, e.schema+".dups") || !strings.Contains(msg, "(2)×3") || !strings.Contains(msg, "1 keys") {
			t.Fatalf("since %v: error does not name table, key and count: %s", since, msg)
		}
	}
	if err := e.sink.AssertNoDuplicateKeys(ctx, tbl, before.Add(time.Hour)); err != nil {
		t.Fatalf("no row loaded since then: %v", err)
	}
}

// dupsTable applies three rows (keys 1, 2, 3) to a new target table.
func dupsTable(t *testing.T, name string) (*env, context.Context, *tidemark.Table) {
	e := newEnv(t)
	tbl := simpleTable(name)
	e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(1), Changes: []tidemark.Change{
		ins(tbl, v(1, 1), int64(1), "a", int64(1)),
		ins(tbl, v(1, 2), int64(2), "b", int64(2)),
		ins(tbl, v(1, 3), int64(3), "c", int64(3)),
	}})
	return e, context.Background(), tbl
}

// TestTargetCanonicalText checks the target's canonical text of every kind
// (the source side must produce the same; the end-to-end verify test in
// cmd/tidemark checks that they agree).
func TestTargetCanonicalText(t *testing.T) {
	for _, soft := range []bool{false, true} {
		name := "hard"
		var opts []envOption
		if soft {
			name = "soft"
			opts = append(opts, softDeletes)
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, opts...)
			ctx := context.Background()
			tbl := &tidemark.Table{ID: tidemark.TableID{Database: "shop", Name: "kinds"}, Key: []int{0, 1}, Columns: []tidemark.Column{
				{Name: "id", Kind: tidemark.KindInt, Bits: 64}, {Name: "name", Kind: tidemark.KindText},
				{Name: "u", Kind: tidemark.KindUint, Bits: 64, Nullable: true}, {Name: "amount", Kind: tidemark.KindDecimal, Precision: 12, Scale: 2, Nullable: true},
				{Name: "f", Kind: tidemark.KindFloat, Nullable: true}, {Name: "d", Kind: tidemark.KindDouble, Nullable: true},
				{Name: "bits", Kind: tidemark.KindBit, Bits: 64, Nullable: true}, {Name: "y", Kind: tidemark.KindYear, Nullable: true},
				{Name: "day", Kind: tidemark.KindDate, Nullable: true}, {Name: "tm", Kind: tidemark.KindTime, Nullable: true},
				{Name: "dt", Kind: tidemark.KindDateTime, Nullable: true}, {Name: "ts", Kind: tidemark.KindTimestamp, Nullable: true},
				{Name: "j", Kind: tidemark.KindJSON, Nullable: true}, {Name: "bin", Kind: tidemark.KindBytes, Nullable: true},
			}}
			dt := time.Date(2026, 3, 10, 18, 28, 0, 500000000, time.UTC) // 23:58:00.5 in Asia/Kolkata
			e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(1), Changes: []tidemark.Change{
				ins(tbl, v(1, 1), int64(1), "é x", uint64(18446744073709551615), tidemark.Decimal("-12.30"), float32(3.1415927), 0.1,
					uint64(1<<63|5), int64(2024), time.Date(1960, 5, 1, 0, 0, 0, 0, time.UTC), -(time.Hour + 500*time.Millisecond),
					dt, dt, tidemark.JSON(`{"b": 2.50, "a": [1, "x"]}`), []byte{0, 0xAB}),
				ins(tbl, v(1, 2), int64(2), "gone", nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil),
			}})
			e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(2), Changes: []tidemark.Change{
				del(tbl, v(2, 1), int64(2), "gone", nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil),
			}})
			vf := NewVerifier(e.sink)
			spec := &tidemark.VerifySpec{Table: tbl, TargetSchema: e.schema, Zones: map[string]string{"dt": "Asia/Kolkata"}}
			rows, err := vf.Rows(ctx, spec, [][]string{{"1", "é x"}, {"2", "gone"}})
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) != 1 {
				t.Fatalf("rows %v: the deleted row must not be found", rows)
			}
			got := rows["1\x00é x"]
			want := []string{"1", "é x", "18446744073709551615", "-12.30", "3.1415927410125732", "0.1", "9223372036854775813", "2024",
				"1960-05-01", "-3600500000", "2026-03-10 23:58:00.500000", "2026-03-10 18:28:00.500000", `{"a": [1, "x"], "b": 2.50}`, "00ab"}
			for i, w := range want {
				if got[i] == nil || *got[i] != w {
					g := "NULL"
					if got[i] != nil {
						g = *got[i]
					}
					t.Errorf("column %s: canonical %q, want %q", tbl.Columns[i].Name, g, w)
				}
			}
			cs, err := vf.Checksum(ctx, spec, tidemark.KeyRange{})
			if err != nil {
				t.Fatal(err)
			}
			ds, err := vf.Digests(ctx, spec, tidemark.KeyRange{})
			if err != nil {
				t.Fatal(err)
			}
			if cs.Rows != 1 || len(ds) != 1 || ds[0].Hash != cs.Sum || len(ds[0].Go) != 3 || *ds[0].Go[0] != "3.1415927410125732" {
				t.Fatalf("checksum %+v, digests %+v", cs, ds)
			}
			// Key ranges: (1, "é x") is above (1, "a") and not above
			// (1, "é x") in byte order.
			for _, tc := range []struct {
				r    tidemark.KeyRange
				rows int64
			}{
				{tidemark.KeyRange{Lo: []string{"1", "a"}}, 1},
				{tidemark.KeyRange{Lo: []string{"1", "é x"}}, 0},
				{tidemark.KeyRange{Hi: []string{"1", "é x"}}, 1},
				{tidemark.KeyRange{Hi: []string{"1", "z"}}, 0}, // 'z' < 'é' in bytes
				{tidemark.KeyRange{Lo: []string{"0", "zzz"}, Hi: []string{"1", "é y"}}, 1},
			} {
				c, err := vf.Checksum(ctx, spec, tc.r)
				if err != nil {
					t.Fatal(err)
				}
				if c.Rows != tc.rows {
					t.Errorf("range %s: %d rows, want %d", tc.r, c.Rows, tc.rows)
				}
			}
			// Daily totals by UTC day of the DATETIME.
			spec.EventTime = "dt"
			days, err := vf.DailyTotals(ctx, spec, []string{"amount"})
			if err != nil {
				t.Fatal(err)
			}
			if len(days) != 1 || days[0].Day != "2026-03-10" || days[0].Count != 1 || days[0].Sums[0] != "-12.30" {
				t.Fatalf("daily totals %+v", days)
			}
			spec.Since, spec.Until = dt.Add(time.Second), dt.Add(time.Hour)
			if days, err = vf.DailyTotals(ctx, spec, nil); err != nil || len(days) != 0 {
				t.Fatalf("window after the row: %+v %v", days, err)
			}
		})
	}
}

func TestTableStatuses(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	tbl := simpleTable("st")
	e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(1), Changes: []tidemark.Change{
		ins(tbl, v(1, 1), int64(1), "a", int64(1)),
		ins(tbl, v(7, 1), int64(2), "b", int64(2)),
	}})
	sts, err := e.sink.TableStatuses(ctx, "s", []string{e.schema})
	if err != nil {
		t.Fatal(err)
	}
	if len(sts) != 1 || sts[0].Schema != e.schema || sts[0].Name != "st" {
		t.Fatalf("statuses %+v", sts)
	}
	st := sts[0]
	if !st.LastCommit.Equal(commitT0.Add(7*time.Second)) && !st.LastCommit.Equal(commitT0.Add(time.Second)) {
		t.Fatalf("last commit %s", st.LastCommit)
	}
	if st.Lag != st.LastLoaded.Sub(st.LastCommit) || st.Lag <= 0 {
		t.Fatalf("lag %s (loaded %s, commit %s)", st.Lag, st.LastLoaded, st.LastCommit)
	}
	now, err := e.sink.Now(ctx)
	if err != nil || time.Since(now).Abs() > time.Minute {
		t.Fatalf("target clock %s: %v", now, err)
	}
}

// TestAssertNoDuplicateKeysAfterConnectionLoss: the post-load assertion
// survives the loss of its PostgreSQL connection (soak seed 567077772393:
// a standby's first-run snapshot stopped with "post-load assertion: find
// duplicate keys in …: unexpected EOF" while PostgreSQL restarted): the
// sink's sessions are terminated, and the assertion still answers.
func TestAssertNoDuplicateKeysAfterConnectionLoss(t *testing.T) {
	e, ctx, tbl := dupsTable(t, "dups_conn")
	// Hold every idle session of the sink's pool, end them on the server,
	// and hand them back: the next query runs on a connection the server
	// has closed (just released, so the pool does not ping it first).
	held := e.sink.pool.AcquireAllIdle(ctx)
	if len(held) == 0 {
		t.Fatal("the sink's pool has no idle session after an apply")
	}
	for _, c := range held {
		var ok bool
		if err := e.conn.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", c.Conn().PgConn().PID()).Scan(&ok); err != nil || !ok {
			t.Fatalf("terminate the sink's session %d: %t %v", c.Conn().PgConn().PID(), ok, err)
		}
	}
	for _, c := range held {
		c.Release()
	}
	if err := e.sink.AssertNoDuplicateKeys(ctx, tbl, time.Time{}); err != nil {
		t.Fatalf("post-load assertion after the sink's sessions ended: %v", err)
	}
}
