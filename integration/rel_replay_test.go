package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"tidemark/integration/harness"
)

// TestHardDeleteReplayNoResurrection: the daemon replays from an older
// checkpoint (here set back by hand, as a restore or a Fanout resuming
// from a sink that is behind would): the inserts of rows deleted since are
// replayed before their deletes. Hard-delete mode must not bring any of
// them back, not even until the replayed delete arrives: the I5 trigger
// records every INSERT of a key whose deleted version is newer.
//
// Was the documented window (README, "Hard deletes"): each replayed insert
// of a deleted row re-created it, and readers saw it until the replay
// reached its delete again.
func TestHardDeleteReplayNoResurrection(t *testing.T) {
	f := newFixture(t)
	db, start := f.newSource(t, "it_replay_")
	if err := harness.Exec(f.my, "CREATE DATABASE "+db, "USE "+db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
		"INSERT INTO t VALUES (0, 0)"); err != nil {
		t.Fatal(err)
	}
	// Small batches: a replayed insert and its delete are not coalesced
	// away in one batch.
	cfg := f.relConfig(t, db, db, relOpts{Start: start, NoBatch: true, Extra: "batch:\n  max_delay: 50ms\n  max_changes: 20\n"})
	d := f.startDaemon(t, cfg)
	f.caughtUpIn(t, db, d, 2*time.Minute)
	installI5(t, f, db, "t", "id")
	// The checkpoint before the inserts, to set back to later.
	if _, err := f.pg.Exec(f.ctx, "CREATE TEMP TABLE saved_cp AS SELECT * FROM tidemark.checkpoints WHERE source = $1", db); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"INSERT INTO t SELECT seq, seq FROM seq_1_to_100", "INSERT INTO t SELECT seq, seq FROM seq_101_to_200",
		"INSERT INTO t SELECT seq, seq FROM seq_201_to_300", "DELETE FROM t WHERE id <= 100", "UPDATE t SET v = -v WHERE id BETWEEN 101 AND 150", "DELETE FROM t WHERE id BETWEEN 141 AND 160",
		"INSERT INTO t VALUES (1, 1001)", "DELETE FROM t WHERE id = 1"} {
		if err := harness.Exec(f.my, "USE "+db, q); err != nil {
			t.Fatal(err)
		}
	}
	f.caughtUpIn(t, db, d, 2*time.Minute)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(d.stderr.String(), 20))
	}
	for _, q := range []string{"DELETE FROM tidemark.checkpoints WHERE source = '" + db + "'", "INSERT INTO tidemark.checkpoints SELECT * FROM saved_cp"} {
		if _, err := f.pg.Exec(f.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	regressions, resurrections := f.replayI5(t, db, cfg)
	f.compare(t, harness.TableSpec{Database: db, Table: "t"})
	report(t, "replay-after-hard-deletes", figures{"deleted_rows": 121, "replayed_from": "before the inserts",
		"i5_resurrections": resurrections, "i5_regressions": regressions})
}

// TestHardDeleteReplayAfterPrunedTombstones: as above, but the replay
// comes after the deletes' tombstones were pruned (later batches moved the
// checkpoint forward twice) and the checkpoint is deleted to start over
// (docs/FAILOVER.md), so the daemon replays from source.start_position. No
// tombstone is left for a replayed insert of a deleted row to lose to; the
// target still must not bring the row back, not even until the replay
// reaches its delete (nemesis seed 119: I5 'insert after newer delete').
func TestHardDeleteReplayAfterPrunedTombstones(t *testing.T) {
	f := newFixture(t)
	db, start := f.newSource(t, "it_replayp_")
	if err := harness.Exec(f.my, "CREATE DATABASE "+db, "USE "+db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
		"CREATE TABLE u (id INT PRIMARY KEY, v INT)", "INSERT INTO t VALUES (0, 0)"); err != nil {
		t.Fatal(err)
	}
	cfg := f.relConfig(t, db, db, relOpts{Start: start, NoBatch: true, Extra: "batch:\n  max_delay: 50ms\n  max_changes: 20\n"})
	d := f.startDaemon(t, cfg)
	f.caughtUpIn(t, db, d, 2*time.Minute)
	installI5(t, f, db, "t", "id")
	for _, q := range []string{"INSERT INTO t SELECT seq, seq FROM seq_1_to_100", "UPDATE t SET v = -v WHERE id BETWEEN 41 AND 60",
		"DELETE FROM t WHERE id <= 50", "UPDATE t SET id = id + 1000 WHERE id BETWEEN 91 AND 95"} {
		if err := harness.Exec(f.my, "USE "+db, q); err != nil {
			t.Fatal(err)
		}
	}
	f.caughtUpIn(t, db, d, 2*time.Minute)
	target := pgx.Identifier{db, "t"}.Sanitize()
	f.pruneTombstones(t, db, d, target)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(d.stderr.String(), 20))
	}
	if _, err := f.pg.Exec(f.ctx, "DELETE FROM tidemark.checkpoints WHERE source = $1", db); err != nil {
		t.Fatal(err)
	}
	// Every row the replay inserts into t: the target already holds every
	// live row, so each one is a deleted row brought back (I5 sees only
	// those whose insert is older than the row's last version).
	if _, err := f.pg.Exec(f.ctx, fmt.Sprintf(`CREATE TABLE %[1]s.replay_inserts (id int);
CREATE FUNCTION %[1]s.replay_insert() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN INSERT INTO %[1]s.replay_inserts VALUES (NEW.id); RETURN NULL; END $f$;
CREATE TRIGGER replay_insert AFTER INSERT ON %[2]s FOR EACH ROW EXECUTE FUNCTION %[1]s.replay_insert();`, pgx.Identifier{db}.Sanitize(), target)); err != nil {
		t.Fatal(err)
	}
	regressions, resurrections := f.replayI5(t, db, cfg)
	var back int
	var ids []int32
	if err := f.pg.QueryRow(f.ctx, "SELECT count(*), COALESCE(array_agg(id ORDER BY id), '{}') FROM "+pgx.Identifier{db, "replay_inserts"}.Sanitize()).Scan(&back, &ids); err != nil {
		t.Fatal(err)
	}
	if back > 0 {
		t.Errorf("the replay inserted %d deleted rows into t again: %v", back, ids)
	}
	f.compare(t, harness.TableSpec{Database: db, Table: "t"})
	f.compare(t, harness.TableSpec{Database: db, Table: "u"})
	report(t, "replay-after-pruned-tombstones", figures{"deleted_rows": 56, "replayed_from": "start_position (checkpoint deleted)",
		"rows_back": back, "i5_resurrections": resurrections, "i5_regressions": regressions})
}

// replayI5 starts the daemon on cfg, waits until it has caught up with the
// source, stops it and returns what the I5 trigger recorded in db (any
// record fails the test).
func (f *fixture) replayI5(t *testing.T, db, cfg string) (regressions, resurrections int) {
	t.Helper()
	d := f.startDaemon(t, cfg)
	f.caughtUpIn(t, db, d, 2*time.Minute)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(d.stderr.String(), 20))
	}
	return checkI5(t, f, db, false)
}

// pruneTombstones writes one row at a time into db's table u (id INT
// PRIMARY KEY, v INT), each a later batch of d, until the tombstones of
// the target table target (quoted) are pruned (tombstones.go: two later
// checkpoints), which raises its horizon to the newest of them.
func (f *fixture) pruneTombstones(t *testing.T, db string, d *daemonProc, target string) {
	t.Helper()
	for i := 1; i <= 20; i++ {
		if err := harness.Exec(f.my, "USE "+db, fmt.Sprintf("INSERT INTO u VALUES (%d, %d) ON DUPLICATE KEY UPDATE v = v + 1", i, i)); err != nil {
			t.Fatal(err)
		}
		f.caughtUpIn(t, db, d, 2*time.Minute)
		var n int
		if err := f.pg.QueryRow(f.ctx, "SELECT count(*) FROM tidemark.tombstones WHERE target = $1", target).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
	t.Fatalf("the deletes' tombstones of %s were not pruned after 20 later batches", target)
}
