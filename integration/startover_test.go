package integration

import (
	"fmt"
	"strings"
	"testing"

	"tidemark/integration/harness"
)

// TestStartOverReplaysHistoryAcrossSchemaChanges is nemesis seed 219: the
// source's checkpoint is deleted while the daemon is down
// (docs/FAILOVER.md: "to start over") and the daemon restarts from
// source.start_position, before the tables were created, so it replays
// their whole history into target tables that already hold its end —
// across the ALTERs. Each row is decoded with its own table map, and the
// version guard skips the replayed rows; but the schema changes were not
// guarded. Rows of a layout from before a DECIMAL widening were taken as a
// narrowing of the (widened) target column and quarantined the table;
// rows from before an ADD COLUMN made the target mark the column as
// dropped (kept), and the replayed ADD COLUMN then dropped the kept
// column with every value, the replayed updates that carried the values
// losing to the rows' newer versions: the column ended NULL in every row,
// nothing said. A renamed column went the same way. Now a layout or an
// ALTER older than the one the target table is aligned to is history the
// table already holds: the rows are written into the table as it is
// (under the version guard), the ALTER leaves it alone.
func TestStartOverReplaysHistoryAcrossSchemaChanges(t *testing.T) {
	f := newFixture(t)
	db, start := f.newSource(t, "it_startover_")
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE widened (id INT PRIMARY KEY, amt DECIMAL(18,4))",
		"CREATE TABLE added (id INT PRIMARY KEY, v INT)",
		"CREATE TABLE renamed (id INT PRIMARY KEY, at DATETIME(6))",
		"INSERT INTO widened SELECT seq, seq + 0.1234 FROM seq_1_to_50",
		"INSERT INTO added SELECT seq, seq FROM seq_1_to_50",
		"INSERT INTO renamed SELECT seq, TIMESTAMP('2026-01-01') + INTERVAL seq MINUTE FROM seq_1_to_50")
	cfg := f.configYAML(t, db, db, db, "UTC", start)
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)
	f.exec(t,
		"ALTER TABLE widened MODIFY amt DECIMAL(22,6)",
		"UPDATE widened SET amt = amt + 0.000001 WHERE id <= 10",
		"ALTER TABLE added ADD COLUMN at DATETIME(6)",
		"UPDATE added SET at = TIMESTAMP('2026-02-01') + INTERVAL id MINUTE",
		"ALTER TABLE renamed RENAME COLUMN at TO at2",
		"UPDATE renamed SET at2 = at2 + INTERVAL 1 DAY WHERE id <= 10")
	f.waitCaughtUp(t, db, d)
	for _, tb := range []string{"widened", "added", "renamed"} {
		f.compareTable(t, db, tb)
	}
	f.stopOK(t, d)

	// Start over: no checkpoint, the configured start position (before
	// the CREATE TABLEs). The epoch floor stays.
	if _, err := f.pg.Exec(f.ctx, "DELETE FROM tidemark.checkpoints WHERE source = $1", db); err != nil {
		t.Fatal(err)
	}
	f.exec(t, "UPDATE added SET v = v + 1 WHERE id <= 5")
	d = f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	log := d.stderr.String()
	if q := grepLines(log, "quarantined"); q != "" {
		t.Errorf("a table was quarantined replaying its history:\n%s", q)
	}
	if !strings.Contains(log, "a replayed schema change older than the target table's schema") {
		t.Errorf("the replayed ALTERs were not recognized as history the target holds:\n%s", grepLines(log, "schema change"))
	}
	for _, tb := range []string{"widened", "added", "renamed"} {
		diff, err := harness.Compare(f.ctx, f.my, f.pg, harness.TableSpec{Database: db, Table: tb, SourceZone: "UTC"})
		if err != nil {
			t.Fatal(err)
		}
		if !diff.Equal() {
			t.Errorf("%s differs from the source after the replay from start_position: %s\n%s", tb, diff, strings.Join(diff.Examples, "\n"))
		}
	}
	for tb, c := range map[string]string{"added": "at", "renamed": "at2"} {
		var nulls int
		if err := f.pg.QueryRow(f.ctx, fmt.Sprintf(`SELECT count(*) FROM %q.%q WHERE %q IS NULL`, db, tb, c)).Scan(&nulls); err != nil {
			t.Fatal(err)
		}
		if nulls != 0 {
			t.Errorf("%s.%s: %d rows NULL in the target after the replay (none in the source)", tb, c, nulls)
		}
	}
	if t.Failed() {
		t.Logf("daemon log:\n%s", grepLines(log, "schema change"))
	}
	f.stopOK(t, d)
}
