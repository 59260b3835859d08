package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"tidemark/integration/harness"
)

// TestStartOverReplaysTruncateOverNewerRows is nemesis seed 75894702205:
// rows written, a TRUNCATE, rows written after it (some deleted again,
// hard deletes), the deletes' tombstones pruned, then the checkpoint
// deleted and a restart from source.start_position, before the TRUNCATE:
// the daemon replays it over a target that already holds the rows written
// after it. A replayed TRUNCATE truncated the whole target, and the
// replayed inserts after it were then skipped by the tombstone horizon (a
// key without a row, a change older than the pruned deletes): t ended
// without the rows written after the TRUNCATE, nothing said. Now a
// TRUNCATE removes only the target rows at its version or older, and
// raises the table's tombstone horizon to its version (hard deletes), so
// a replayed insert older than it is skipped (t2: no tombstone of its
// own) rather than brought back until the replay reaches the TRUNCATE.
func TestStartOverReplaysTruncateOverNewerRows(t *testing.T) {
	f := newFixture(t)
	db, start := f.newSource(t, "it_replaytr_")
	if err := harness.Exec(f.my, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE t (id INT PRIMARY KEY, v INT)", "CREATE TABLE t2 (id INT PRIMARY KEY, v INT)",
		"CREATE TABLE u (id INT PRIMARY KEY, v INT)"); err != nil {
		t.Fatal(err)
	}
	cfg := f.relConfig(t, db, db, relOpts{Start: start, NoBatch: true, Extra: "batch:\n  max_delay: 50ms\n  max_changes: 20\n"})
	d := f.startDaemon(t, cfg)
	f.caughtUpIn(t, db, d, 2*time.Minute)
	for _, q := range []string{"INSERT INTO t SELECT seq, seq FROM seq_1_to_100", "INSERT INTO t2 SELECT seq, seq FROM seq_1_to_50",
		"UPDATE t SET v = -v WHERE id <= 30", "DELETE FROM t WHERE id BETWEEN 91 AND 95",
		"TRUNCATE TABLE t", "TRUNCATE TABLE t2",
		"INSERT INTO t SELECT seq, seq FROM seq_101_to_200", "INSERT INTO t2 SELECT seq, seq FROM seq_51_to_80",
		"DELETE FROM t WHERE id BETWEEN 101 AND 110", "UPDATE t SET v = -v WHERE id > 190"} {
		if err := harness.Exec(f.my, "USE "+db, q); err != nil {
			t.Fatal(err)
		}
	}
	f.caughtUpIn(t, db, d, 2*time.Minute)
	f.compare(t, harness.TableSpec{Database: db, Table: "t"})
	f.compare(t, harness.TableSpec{Database: db, Table: "t2"})
	// t's tombstones pruned: its horizon is then past the inserts after
	// the TRUNCATE.
	f.pruneTombstones(t, db, d, pgx.Identifier{db, "t"}.Sanitize())
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(d.stderr.String(), 20))
	}

	// Start over: no checkpoint, the configured start position (before
	// the CREATE TABLEs).
	if _, err := f.pg.Exec(f.ctx, "DELETE FROM tidemark.checkpoints WHERE source = $1", db); err != nil {
		t.Fatal(err)
	}
	// Every row the replay inserts into t or t2: the targets already hold
	// every live row, so each one is a row older than the TRUNCATE brought
	// back, or a newer one the replayed TRUNCATE removed.
	schema := pgx.Identifier{db}.Sanitize()
	if _, err := f.pg.Exec(f.ctx, fmt.Sprintf(`CREATE TABLE %[1]s.replay_inserts (tbl text, id int);
CREATE FUNCTION %[1]s.replay_insert() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN INSERT INTO %[1]s.replay_inserts VALUES (TG_TABLE_NAME, NEW.id); RETURN NULL; END $f$;
CREATE TRIGGER replay_insert AFTER INSERT ON %[1]s.t FOR EACH ROW EXECUTE FUNCTION %[1]s.replay_insert();
CREATE TRIGGER replay_insert AFTER INSERT ON %[1]s.t2 FOR EACH ROW EXECUTE FUNCTION %[1]s.replay_insert();`, schema)); err != nil {
		t.Fatal(err)
	}
	log := f.replayFromStart(t, db, cfg)
	f.compareReplayed(t, db, "t", "t2", "u")
	rows, err := f.pg.Query(f.ctx, "SELECT tbl, count(*), min(id), max(id) FROM "+schema+".replay_inserts GROUP BY tbl ORDER BY tbl")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var tbl string
		var n, lo, hi int
		if err := rows.Scan(&tbl, &n, &lo, &hi); err != nil {
			t.Fatal(err)
		}
		t.Errorf("the replay inserted %d rows into %s again (ids %d..%d)", n, tbl, lo, hi)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if t.Failed() {
		t.Logf("daemon log of the replay:\n%s", grepLines(log, "TRUNCATE"))
	}
}

// replayFromStart starts the daemon on cfg, whose checkpoint of source db
// the test deleted, waits until it has caught up with the source, stops it
// and returns its log.
func (f *fixture) replayFromStart(t *testing.T, db, cfg string) string {
	t.Helper()
	d := f.startDaemon(t, cfg)
	f.caughtUpIn(t, db, d, 2*time.Minute)
	log := d.stderr.String()
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(log, 20))
	}
	return log
}

// compareReplayed compares the tables of db with the source after a
// replay, each difference an error.
func (f *fixture) compareReplayed(t *testing.T, db string, tables ...string) {
	t.Helper()
	for _, tb := range tables {
		diff, err := harness.Compare(f.ctx, f.my, f.pg, harness.TableSpec{Database: db, Table: tb})
		if err != nil {
			t.Fatal(err)
		}
		if !diff.Equal() {
			t.Errorf("%s differs from the source after the replay from start_position: %s\n%s", tb, diff, strings.Join(diff.Examples, "\n"))
		}
	}
}
