package checkpoint_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/checkpoint"
	"tidemark/internal/testenv"
)

// TestInitBesideOpenTransactions: a process starting (tidemark resync,
// an applier joining, a restarted tailer) runs Init while another holds a
// transaction open on the control tables (an applier stopped by SIGSTOP in
// the middle of a batch: CI at 598d7a9, TestApplyResyncOfBusyTable, the
// resync "create checkpoint tables …: timeout" three times in a row). With
// the control tables in place, Init must neither wait for that transaction
// nor make others wait behind it (ALTER TABLE … ADD COLUMN IF NOT EXISTS and
// CREATE INDEX IF NOT EXISTS lock the table even when there is nothing to
// add).
func TestInitBesideOpenTransactions(t *testing.T) {
	st, conn, _ := newStore(t)
	ctx := context.Background()
	if err := st.InitTombstones(ctx, newQuerier(conn)); err != nil {
		t.Fatal(err)
	}
	// The open transaction: a batch of an applier and a delete's tombstone,
	// and a DDL of the target (the sink holds the DDL lock across one).
	busy := testenv.PGConn(t)
	tx, err := busy.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	q := txQuerier(tx)
	if err := st.SaveOffset(ctx, q, tidemark.StreamOffset{Group: "g", Topic: "topic", Next: 10, Prev: -1, Epoch: -1}); err != nil {
		t.Fatal(err)
	}
	if err := st.SaveTableState(ctx, q, "s", tidemark.TableState{Table: tidemark.TableID{Database: "db", Name: "t"}, Mode: tidemark.TableStreaming}); err != nil {
		t.Fatal(err)
	}
	if err := st.SavePosition(ctx, q, "s", tidemark.Position{GTID: "0-1-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+st.Tombstones()+" (target, key, seq, idx, source, gen) VALUES ('x', 'k', 1, 0, 's', 0)"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", checkpoint.DDLLockKey); err != nil {
		t.Fatal(err)
	}

	other := testenv.PGConn(t)
	for _, step := range []struct {
		name string
		run  func(context.Context) error
	}{
		{"Init", func(ctx context.Context) error { return st.Init(ctx, newQuerier(other)) }},
		{"InitTombstones", func(ctx context.Context) error { return st.InitTombstones(ctx, newQuerier(other)) }},
	} {
		// Generous: the wait this test catches has no end at all.
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := step.run(sctx)
		cancel()
		if err != nil {
			t.Fatalf("%s beside an open transaction on the control tables: %v; want it to return at once", step.name, err)
		}
	}
}

// TestInitCheckListsEveryColumn: Init's check that the control tables are
// in place lists every column Init creates, so that a column added to the
// DDL but not to the check is caught here (Init would skip creating it on
// every existing installation).
func TestInitCheckListsEveryColumn(t *testing.T) {
	_, conn, schema := newStore(t)
	rows, err := conn.Query(context.Background(), `SELECT c.relname || '.' || a.attname FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped ORDER BY 1`, schema)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := checkpoint.ControlColumns()
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("columns Init created:\n%s\ncolumns its check looks for:\n%s", strings.Join(got, " "), strings.Join(want, " "))
	}
}

// TestInitUpgradesAnOlderSchema: control tables of an earlier release (a
// column missing) still get the column: the check does not skip Init then.
func TestInitUpgradesAnOlderSchema(t *testing.T) {
	st, conn, schema := newStore(t)
	ctx := context.Background()
	qs := tidemark.QuotePostgres(schema)
	if _, err := conn.Exec(ctx, "ALTER TABLE "+qs+".stream_offsets DROP COLUMN leader_epoch"); err != nil {
		t.Fatal(err)
	}
	if err := st.Init(ctx, newQuerier(conn)); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns
WHERE table_schema = $1 AND table_name = 'stream_offsets' AND column_name = 'leader_epoch'`, schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("Init over control tables without stream_offsets.leader_epoch: the column is still missing")
	}
}
