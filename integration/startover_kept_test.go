package integration

import (
	"fmt"
	"strings"
	"testing"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestStartOverKeepsAddedAndKeptColumns is nemesis seed 5's schema part
// (TestStartOverReplaysHistoryAcrossSchemaChanges, seed 219, has no column
// the source dropped): a table with a column added (ADD COLUMN … DATE,
// then rows written with values) and one dropped (drop_columns: keep, so
// the target keeps the column and its values), then the checkpoint
// deleted and a restart from source.start_position, before the table was
// created. The replay of the table's history over a target that already
// holds its end must leave both columns as they are. Before 7dadb31, the
// replayed CREATE's layout (without the added column, with the dropped
// one) realigned the target: the kept column, "added again", was dropped
// with its values and re-added empty, and the added column was marked
// kept; the replayed ADD COLUMN then dropped it with every value and
// re-added it, and the replayed rows that carried the values lost to the
// target's newer versions: the column ended NULL in the rows written after
// it was added, nothing said.
//
// The seed drew a table name of exactly 63 bytes (PostgreSQL's limit); the
// same campaign with the short name ends alike, and so do both tables
// here: the name is not the cause, and a 63-byte name replicates.
func TestStartOverKeepsAddedAndKeptColumns(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_startkept_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	long := "t1_long_name_" + strings.Repeat("x", 63-len("t1_long_name_"))
	tables := []string{"t1", long}
	start, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	f.exec(t, "CREATE DATABASE "+db, "USE "+db)
	for _, tb := range tables {
		f.exec(t,
			"CREATE TABLE "+tb+" (order_id INT NOT NULL, line_item_id INT NOT NULL, c0_char CHAR(8), c2_time TIME, PRIMARY KEY (order_id, line_item_id))",
			"INSERT INTO "+tb+" SELECT seq, 1, CONCAT('c', seq), SEC_TO_TIME(seq) FROM seq_1_to_40")
	}
	cfg := f.configYAML(t, db, db, db, "UTC", start)
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)
	for _, tb := range tables {
		f.exec(t,
			"ALTER TABLE "+tb+" ADD COLUMN c3_date DATE",
			"INSERT INTO "+tb+" SELECT seq, 2, CONCAT('n', seq), NULL, DATE('2026-01-01') + INTERVAL seq DAY FROM seq_1_to_30",
			"UPDATE "+tb+" SET c3_date = DATE('2025-01-01') + INTERVAL order_id DAY WHERE line_item_id = 1 AND order_id <= 20",
			"ALTER TABLE "+tb+" DROP COLUMN c0_char",
			"UPDATE "+tb+" SET c2_time = '01:02:03' WHERE order_id <= 5")
	}
	f.waitCaughtUp(t, db, d)
	kept := map[string]int{}
	for _, tb := range tables {
		f.compareTable(t, db, tb)
		kept[tb] = f.pgCount(t, db, tb, "c0_char IS NOT NULL")
		if kept[tb] != 70 {
			t.Fatalf("%s: %d rows hold the kept column c0_char before the start-over, want 70", tb, kept[tb])
		}
	}
	f.stopOK(t, d)

	// Start over: no checkpoint, the configured start position (before the
	// CREATE TABLEs). The epoch floor stays.
	if _, err := f.pg.Exec(f.ctx, "DELETE FROM tidemark.checkpoints WHERE source = $1", db); err != nil {
		t.Fatal(err)
	}
	d = f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	log := d.stderr.String()
	if q := grepLines(log, "quarantined"); q != "" {
		t.Errorf("a table was quarantined replaying its history:\n%s", q)
	}
	for _, tb := range tables {
		diff, err := harness.Compare(f.ctx, f.my, f.pg, harness.TableSpec{Database: db, Table: tb, SourceZone: "UTC"})
		if err != nil {
			t.Fatal(err)
		}
		if !diff.Equal() {
			t.Errorf("%s (%d bytes) differs from the source after the replay from start_position: %s\n%s", tb, len(tb), diff, strings.Join(diff.Examples, "\n"))
		}
		if n := f.pgCount(t, db, tb, "c3_date IS NULL"); n != 20 {
			t.Errorf("%s (%d bytes): %d rows have c3_date NULL in the target after the replay, the source 20", tb, len(tb), n)
		}
		if n := f.pgCount(t, db, tb, "c0_char IS NOT NULL"); n != kept[tb] {
			t.Errorf("%s (%d bytes): the kept column c0_char holds %d values after the replay, %d before", tb, len(tb), n, kept[tb])
		}
	}
	if t.Failed() {
		t.Logf("daemon log:\n%s", grepLines(log, "schema change"))
	}
	f.stopOK(t, d)
}

// pgCount counts the rows of a target table that satisfy cond (SQL); 0 when
// the condition names a column the table lacks is an error.
func (f *fixture) pgCount(t *testing.T, schema, table, cond string) int {
	t.Helper()
	var n int
	if err := f.pg.QueryRow(f.ctx, fmt.Sprintf(`SELECT count(*) FROM %q.%q WHERE %s`, schema, table, cond)).Scan(&n); err != nil {
		t.Fatalf("count rows of %s.%s where %s: %v", schema, table, cond, err)
	}
	return n
}
