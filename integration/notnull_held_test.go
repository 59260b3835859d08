package integration

import (
	"testing"
	"time"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestFirstRunResumedHoldsNotNullForTheStream (nemesis seed 16): a first
// run killed inside its snapshot of t (chunks 1–4 in, in the layout of
// then), then, while no daemon runs, the source adds a NOT NULL column
// with a default and deletes a row the run had copied. The resumed run
// reads the table in the new layout: the target gains the column nullable
// and the deleted row it had copied holds NULL in it until the stream,
// which resumes at the run's capture, applies the delete (and the ALTER's
// backfill). Setting the NOT NULL at the load's end judged that mixed
// state and quarantined t ("column c holds NULL"); it must wait, like the
// unique constraints, until the stream has passed the load's high
// watermark, then hold. (The ALTER's backfill reloads t here; a NULL the
// stream does not explain quarantines the table when the stream passes
// the load: TestHeldNotNull in sink/postgres.)
func TestFirstRunResumedHoldsNotNullForTheStream(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_nnheld_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE t (id INT PRIMARY KEY, v INT)",
		"INSERT INTO t SELECT seq, seq FROM seq_1_to_200")
	cfg := f.configYAMLWith(t, db, db, db, "UTC", tidemark.Position{}, "fallback:\n  enabled: true\n  chunk_rows: 10\nsnapshot:\n  parallelism: 1\n")
	loadHeld, releaseLoad := holdWrites(t, f, db, "hold_load", "NEW.id = 50", 16016, true)
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	if !testenv.WaitFor(120*time.Second, func() bool { return d.exited() || loadHeld() }) || d.exited() {
		t.Fatalf("the first run did not reach id 50's chunk:\n%s", tail(d.stderr.String(), 20))
	}
	d.kill()
	releaseLoad()
	f.exec(t, "USE "+db,
		"ALTER TABLE t ADD COLUMN c INT NOT NULL DEFAULT 7",
		"DELETE FROM t WHERE id = 5",
		"UPDATE t SET v = -v WHERE id = 120")
	d = f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	notNull := func() bool {
		var nn bool
		err := f.pg.QueryRow(f.ctx, `SELECT attnotnull FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'c'`, `"`+db+`".t`).Scan(&nn)
		return err == nil && nn
	}
	var diff *harness.Diff
	ok := testenv.WaitFor(120*time.Second, func() bool {
		if mode, _ := f.tableState(t, db, db, "t"); mode == "quarantined" || d.exited() {
			return true
		}
		dd, err := harness.Compare(f.ctx, f.my, f.pg, harness.TableSpec{Database: db, Table: "t", SourceZone: "UTC"})
		if err != nil {
			t.Fatal(err)
		}
		diff = dd
		return dd.Equal() && notNull()
	})
	if mode, reason := f.tableState(t, db, db, "t"); mode != "streaming" {
		t.Fatalf("t: state %q reason %q after the resumed first run\n%s", mode, reason, grepLines(d.stderr.String(), "NULL"))
	}
	if !ok || diff == nil || !diff.Equal() {
		t.Fatalf("t did not converge: %v\n%s", diff, tail(d.stderr.String(), 20))
	}
	if !notNull() {
		t.Fatalf("column c of the target is still nullable\n%s", grepLines(d.stderr.String(), "NULL"))
	}
	f.stopOK(t, d)
}
