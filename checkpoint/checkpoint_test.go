package checkpoint_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"tidemark"
	"tidemark/checkpoint"
	"tidemark/internal/testenv"
)

func newStore(t *testing.T) (*checkpoint.Store, *pgx.Conn, string) {
	t.Helper()
	schema := testenv.Schema(t)
	st, err := checkpoint.New(checkpoint.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	conn := testenv.PGConn(t)
	if err := st.Init(context.Background(), newQuerier(conn)); err != nil {
		t.Fatal(err)
	}
	return st, conn, schema
}

func TestNewValidatesSchema(t *testing.T) {
	for _, tc := range []struct {
		schema string
		ok     bool
	}{
		{"", true},
		{"tidemark", true},
		{"my schema", true},
		{`bad"name`, false},
		{"x;drop", false},
		{" lead", false},
		{strings.Repeat("a", 64), false},
	} {
		t.Run(tc.schema, func(t *testing.T) {
			st, err := checkpoint.New(checkpoint.Config{Schema: tc.schema})
			if tc.ok != (err == nil) {
				t.Fatalf("New(%q) error = %v, want ok=%t", tc.schema, err, tc.ok)
			}
			if err != nil {
				if !errors.Is(err, tidemark.ErrInvalidIdentifier) || !strings.Contains(err.Error(), "schema") {
					t.Errorf("error %q should wrap ErrInvalidIdentifier and name the field", err)
				}
				return
			}
			if tc.schema == "" && st.Schema() != checkpoint.DefaultSchema {
				t.Errorf("default schema = %q", st.Schema())
			}
		})
	}
}

func TestPositionRoundTrip(t *testing.T) {
	st, conn, _ := newStore(t)
	ctx := context.Background()
	q := newQuerier(conn)

	if _, ok, err := st.LoadPosition(ctx, q, "nothing"); err != nil || ok {
		t.Fatalf("LoadPosition of unknown source = ok %t, err %v; want false, nil", ok, err)
	}
	for _, tc := range []struct {
		name   string
		source string
		pos    tidemark.Position
	}{
		{"gtid", "a", tidemark.Position{GTID: "0-1001-42,1-1002-7"}},
		{"filepos", "b", tidemark.Position{File: "mysql-bin.000042", Offset: 1234567}},
		{"both", "c", tidemark.Position{GTID: "0-1001-43", File: "mysql-bin.000043", Offset: 4}},
		{"mysql gtid", "d", tidemark.Position{GTID: "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-42"}},
		{"source with quotes", `it's "quoted"; --`, tidemark.Position{GTID: "0-1-1"}},
		{"overwrite", "a", tidemark.Position{GTID: "0-1001-50"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := st.SavePosition(ctx, q, tc.source, tc.pos); err != nil {
				t.Fatal(err)
			}
			got, ok, err := st.LoadPosition(ctx, q, tc.source)
			if err != nil || !ok || got != tc.pos {
				t.Fatalf("LoadPosition = %+v, %t, %v; want %+v", got, ok, err, tc.pos)
			}
		})
	}
	// The split-out columns describe the same position.
	var gtid, file *string
	var pos *int64
	if err := conn.QueryRow(ctx, `SELECT gtid, file, pos FROM `+tidemark.QuotePostgres(st.Schema())+`.checkpoints WHERE source = 'c'`).Scan(&gtid, &file, &pos); err != nil {
		t.Fatal(err)
	}
	if gtid == nil || *gtid != "0-1001-43" || file == nil || *file != "mysql-bin.000043" || pos == nil || *pos != 4 {
		t.Errorf("split columns = %v %v %v", gtid, file, pos)
	}
}

func TestSavePositionRejects(t *testing.T) {
	st, conn, _ := newStore(t)
	ctx := context.Background()
	q := newQuerier(conn)
	for _, tc := range []struct {
		name   string
		source string
		pos    tidemark.Position
	}{
		{"empty source", "", tidemark.Position{GTID: "0-1-1"}},
		{"zero position", "s", tidemark.Position{}},
		{"offset overflow", "s", tidemark.Position{File: "mysql-bin.000001", Offset: 1 << 63}},
		{"unparseable", "s", tidemark.Position{GTID: "a;b=c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := st.SavePosition(ctx, q, tc.source, tc.pos); err == nil {
				t.Fatal("SavePosition succeeded, want an error")
			}
		})
	}
	if _, ok, _ := st.LoadPosition(ctx, q, "s"); ok {
		t.Error("a rejected position was stored")
	}
}

func TestLoadPositionBadValue(t *testing.T) {
	st, conn, schema := newStore(t)
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `INSERT INTO `+tidemark.QuotePostgres(schema)+`.checkpoints (source, position) VALUES ('x', 'gtid=garbage')`); err != nil {
		t.Fatal(err)
	}
	_, ok, err := st.LoadPosition(ctx, newQuerier(conn), "x")
	if err == nil || ok {
		t.Fatalf("LoadPosition of a bad value = ok %t, err %v; want an error", ok, err)
	}
	for _, want := range []string{`source "x"`, schema + ".checkpoints", "parse position"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestWatermarks(t *testing.T) {
	st, conn, _ := newStore(t)
	ctx := context.Background()
	q := newQuerier(conn)
	tbl := tidemark.TableID{Database: "shop", Name: "orders"}
	other := tidemark.TableID{Database: "shop", Name: "items"}
	ist := time.FixedZone("IST", 5*3600+1800)

	if _, ok, err := st.LoadWatermark(ctx, q, "src", tbl); err != nil || ok {
		t.Fatalf("LoadWatermark of nothing = %t, %v", ok, err)
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC)
	steps := []struct {
		name  string
		table tidemark.TableID
		value time.Time
		want  time.Time
	}{
		{"first", tbl, t0, t0},
		{"forward", tbl, t0.Add(time.Hour), t0.Add(time.Hour)},
		{"backward is ignored", tbl, t0.Add(-time.Hour), t0.Add(time.Hour)},
		{"other zone, same instant", tbl, t0.Add(2 * time.Hour).In(ist), t0.Add(2 * time.Hour)},
		{"other table is independent", other, t0.Add(-24 * time.Hour), t0.Add(-24 * time.Hour)},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			if err := st.SaveWatermark(ctx, q, "src", tidemark.Watermark{Table: s.table, Value: s.value}); err != nil {
				t.Fatal(err)
			}
			got, ok, err := st.LoadWatermark(ctx, q, "src", s.table)
			if err != nil || !ok {
				t.Fatalf("LoadWatermark = %t, %v", ok, err)
			}
			if !got.Equal(s.want) || got.Location() != time.UTC {
				t.Errorf("LoadWatermark = %v (%v), want %v in UTC", got, got.Location(), s.want)
			}
		})
	}
	if _, ok, _ := st.LoadWatermark(ctx, q, "other-source", tbl); ok {
		t.Error("watermarks leak between sources")
	}
	if err := st.SaveWatermark(ctx, q, "src", tidemark.Watermark{Table: tbl}); err == nil {
		t.Error("a zero watermark was accepted")
	}
}

// TestRollbackDiscards checks that the store writes only through the
// caller's transaction.
func TestRollbackDiscards(t *testing.T) {
	st, conn, _ := newStore(t)
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SavePosition(ctx, txQuerier(tx), "s", tidemark.Position{GTID: "0-1-9"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := st.LoadPosition(ctx, newQuerier(conn), "s"); ok || err != nil {
		t.Fatalf("after rollback: ok %t, err %v; want nothing stored", ok, err)
	}
}

// TestInitConcurrent runs Init from several sessions at once on a schema that
// does not exist yet: without the advisory lock, CREATE SCHEMA IF NOT EXISTS
// races into a unique violation.
func TestInitConcurrent(t *testing.T) {
	schema := testenv.Schema(t)
	st, err := checkpoint.New(checkpoint.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	conns := make([]*pgx.Conn, n)
	for i := range conns {
		conns[i] = testenv.PGConn(t)
	}
	for round := 0; round < 3; round++ {
		var wg sync.WaitGroup
		errs := make([]error, n)
		start := make(chan struct{})
		for i := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = st.Init(context.Background(), newQuerier(conns[i]))
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, session %d: %v", round, i, err)
			}
		}
		if round == 0 {
			// Drop it again so the next round races on creation too.
			if _, err := conns[0].Exec(context.Background(), `DROP SCHEMA `+tidemark.QuotePostgres(schema)+` CASCADE`); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := st.SavePosition(context.Background(), newQuerier(conns[0]), "s", tidemark.Position{GTID: "0-1-1"}); err != nil {
		t.Fatal(err)
	}
}

func TestTableStates(t *testing.T) {
	st, conn, _ := newStore(t)
	ctx := context.Background()
	q := newQuerier(conn)
	a := tidemark.TableID{Database: "shop", Name: "orders"}
	b := tidemark.TableID{Database: "shop", Name: "order"} // a keyword
	if got, err := st.LoadTableStates(ctx, q, "src"); err != nil || len(got) != 0 {
		t.Fatalf("empty: %v %v", got, err)
	}
	big := tidemark.Version{Seq: 1<<62 + 7, Index: 3}
	for _, s := range []tidemark.TableState{
		{Table: a, Mode: tidemark.TableQuarantined, Reason: `column "v": int → smallint`},
		{Table: b, Mode: tidemark.TableStreaming, Floor: big},
		{Table: a, Mode: tidemark.TableResyncRequested}, // replaces
	} {
		if err := st.SaveTableState(ctx, q, "src", s); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.SaveTableState(ctx, q, "other", tidemark.TableState{Table: a, Mode: tidemark.TableStreaming}); err != nil {
		t.Fatal(err)
	}
	got, err := st.LoadTableStates(ctx, q, "src")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Table != b || got[0].Floor != big || got[0].Mode != tidemark.TableStreaming ||
		got[1].Table != a || got[1].Mode != tidemark.TableResyncRequested || got[1].Reason != "" || got[1].UpdatedAt.IsZero() {
		t.Fatalf("states %+v", got)
	}
	if err := st.SaveTableState(ctx, q, "src", tidemark.TableState{Table: a, Mode: "paused"}); err == nil {
		t.Error("an unknown mode was accepted")
	}
	if err := st.DeleteTableState(ctx, q, "src", a); err != nil {
		t.Fatal(err)
	}
	if err := st.SaveWatermark(ctx, q, "src", tidemark.Watermark{Table: b, Value: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteWatermark(ctx, q, "src", b); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := st.LoadWatermark(ctx, q, "src", b); ok {
		t.Error("watermark still there")
	}
	got, _ = st.LoadTableStates(ctx, q, "src")
	if len(got) != 1 || got[0].Table != b {
		t.Fatalf("after delete: %+v", got)
	}
	if got, _ := st.LoadTableStates(ctx, q, "other"); len(got) != 1 {
		t.Fatalf("other source: %+v", got)
	}
}

// TestSwapTableState: a state is added only where none is recorded, and
// swapped only from the mode expected; the recorded one stays otherwise.
func TestSwapTableState(t *testing.T) {
	st, conn, _ := newStore(t)
	ctx := context.Background()
	q := newQuerier(conn)
	a := tidemark.TableID{Database: "shop", Name: "orders"}
	swap := func(old tidemark.TableMode, s tidemark.TableState) bool {
		t.Helper()
		ok, err := st.SwapTableState(ctx, q, "src", old, s)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	mode := func() tidemark.TableMode {
		t.Helper()
		got, err := st.LoadTableStates(ctx, q, "src")
		if err != nil || len(got) != 1 {
			t.Fatalf("states %+v, %v", got, err)
		}
		return got[0].Mode
	}
	if !swap("", tidemark.TableState{Table: a, Mode: tidemark.TableSnapshotting, Cursor: "c"}) || mode() != tidemark.TableSnapshotting {
		t.Fatal("a first state was not added")
	}
	if swap("", tidemark.TableState{Table: a, Mode: tidemark.TableStreaming}) || mode() != tidemark.TableSnapshotting {
		t.Fatal("a recorded state was overwritten by an add")
	}
	if err := st.SaveTableState(ctx, q, "src", tidemark.TableState{Table: a, Mode: tidemark.TableResyncRequested}); err != nil {
		t.Fatal(err)
	}
	if swap(tidemark.TableSnapshotting, tidemark.TableState{Table: a, Mode: tidemark.TableStreaming}) || mode() != tidemark.TableResyncRequested {
		t.Fatal("a resync request was overwritten by a swap from snapshotting")
	}
	if !swap(tidemark.TableResyncRequested, tidemark.TableState{Table: a, Mode: tidemark.TableStreaming}) || mode() != tidemark.TableStreaming {
		t.Fatal("a swap from the recorded mode did not record")
	}
	if _, err := st.SwapTableState(ctx, q, "src", "paused", tidemark.TableState{Table: a, Mode: tidemark.TableStreaming}); err == nil {
		t.Error("an unknown expected mode was accepted")
	}
}

// TestEpochFloor: SavePosition raises the source's epoch floor with the
// checkpoint and refuses, in the caller's transaction, a checkpoint below
// it; deleting the checkpoint row leaves the floor (review finding 10).
func TestEpochFloor(t *testing.T) {
	st, conn, schema := newStore(t)
	ctx := context.Background()
	q := newQuerier(conn)
	a := tidemark.SourceIdentity{Flavor: "mariadb", Server: "1001", Domain: "0", Scheme: "gtid", Basename: "mysql-bin"}
	b := a
	b.Server = "1002"
	if _, ok, err := st.LoadEpochFloor(ctx, q, "s"); err != nil || ok {
		t.Fatalf("floor of an unknown source: %t, %v", ok, err)
	}
	for _, p := range []tidemark.Position{
		{GTID: "0-1001-5", Source: a},
		{GTID: "0-1001-9", Epoch: 1, Source: b},
		{GTID: "0-1001-10", Epoch: 1, Source: b},
	} {
		if err := st.SavePosition(ctx, q, "s", p); err != nil {
			t.Fatalf("save %s: %v", p, err)
		}
	}
	floor, ok, err := st.LoadEpochFloor(ctx, q, "s")
	if err != nil || !ok || floor.Epoch != 1 || floor.Source != b {
		t.Fatalf("floor = %+v, %t, %v; want epoch 1 on %s", floor, ok, err, b)
	}
	if _, err := conn.Exec(ctx, `DELETE FROM `+tidemark.QuotePostgres(schema)+`.checkpoints`); err != nil {
		t.Fatal(err)
	}
	for _, p := range []tidemark.Position{
		{GTID: "0-1001-11", Source: b},           // epoch 0 below 1
		{GTID: "0-1001-11", Epoch: 1, Source: a}, // epoch 1 of another server
	} {
		err := st.SavePosition(ctx, q, "s", p)
		if !errors.Is(err, tidemark.ErrEpochRegressed) || !strings.Contains(err.Error(), "epoch 1") {
			t.Fatalf("save %s below the floor: %v, want ErrEpochRegressed naming epoch 1", p, err)
		}
		if _, ok, _ := st.LoadPosition(ctx, q, "s"); ok {
			t.Fatalf("save %s below the floor wrote the checkpoint", p)
		}
	}
	if err := st.SavePosition(ctx, q, "s", tidemark.Position{GTID: "0-1001-1", Epoch: 2, Source: a}); err != nil {
		t.Fatal(err)
	}
	if floor, _, _ := st.LoadEpochFloor(ctx, q, "s"); floor.Epoch != 2 || floor.Source != a {
		t.Fatalf("floor after epoch 2 = %+v", floor)
	}
}
