package integration

import (
	"testing"
	"time"

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
	d = f.startDaemon(t, cfg)
	f.caughtUpIn(t, db, d, 2*time.Minute)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(d.stderr.String(), 20))
	}
	regressions, resurrections := checkI5(t, f, db, false)
	f.compare(t, harness.TableSpec{Database: db, Table: "t"})
	report(t, "replay-after-hard-deletes", figures{"deleted_rows": 121, "replayed_from": "before the inserts",
		"i5_resurrections": resurrections, "i5_regressions": regressions})
}
