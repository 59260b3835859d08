package integration

import (
	"strings"
	"testing"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// A full read into a target that already holds the table with its mirrored
// unique constraint (nemesis seeds 695949095153 and 226860739659,
// docs/RELIABILITY.md): a first run repeated after the checkpoint was
// deleted reads the whole table again, one chunk per commit. Two rows that
// swapped their unique values at the source meanwhile (and a value moved
// to another row) land in different chunks: after the first chunk's commit
// the target holds the new value twice (the stale row is rewritten by a
// later chunk). That intermediate state must not quarantine the table: the
// load drops the mirrored unique constraints and builds them again after
// it, when the target equals the source. A target row the load did not
// rewrite (newer than the load, so the version guard keeps it) that
// violates the constraint must still quarantine the table, loudly, when the
// constraint is built again.

// reloadUniqueFixture loads t (a nullable UNIQUE column u) with soft
// deletes and mirrored indexes, stops the daemon, and returns the config
// after deleting the source's checkpoint: the next start is a first run
// again, over the loaded target.
func reloadUniqueFixture(t *testing.T, prefix string) (*fixture, string, string) {
	t.Helper()
	f := newFixture(t)
	db := testenv.Name(prefix)
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE t (id INT PRIMARY KEY, u VARCHAR(20) NULL, v INT, UNIQUE KEY uq_u (u))",
		"INSERT INTO t SELECT seq, IF(seq % 10 = 0, NULL, CONCAT('u', seq)), seq FROM seq_1_to_200")
	cfg := f.configYAMLWith(t, db, db, db, "UTC", tidemark.Position{}, "fallback:\n  enabled: true\n  chunk_rows: 10\n")
	setYAML(t, cfg, "    schema: "+db+"\n", "    schema: "+db+"\n    delete_mode: soft\n")
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)
	f.compare(t, harness.TableSpec{Database: db, Table: "t", SourceZone: "UTC", SoftDelete: true})
	f.waitIndexes(t, db, "t", "t_uq_u")
	if !f.deferredUnique(t, "t_uq_u") {
		t.Fatalf("the first load did not build the mirrored unique constraint t_uq_u\n%s", grepLines(d.stderr.String(), "mirror"))
	}
	f.stopOK(t, d)
	if _, err := f.pg.Exec(f.ctx, "DELETE FROM tidemark.checkpoints WHERE source = $1", db); err != nil {
		t.Fatal(err)
	}
	return f, db, cfg
}

func TestFirstRunAgainOverMirroredUniqueIndex(t *testing.T) {
	f, db, cfg := reloadUniqueFixture(t, "it_uqreload_")
	// While the daemon is stopped (its binlog is not read again: the
	// checkpoint is gone and the start is a snapshot): ids 1 and 200 swap
	// their values (different chunks of 10), id 5's value moves to id 150,
	// id 7's to a new row 300 and id 7 is deleted.
	f.exec(t, "USE "+db,
		"BEGIN",
		"UPDATE t SET u = NULL WHERE id = 1",
		"UPDATE t SET u = 'u1' WHERE id = 200",
		"UPDATE t SET u = 'u200' WHERE id = 1",
		"UPDATE t SET u = NULL WHERE id = 5",
		"UPDATE t SET u = 'u5' WHERE id = 150",
		"DELETE FROM t WHERE id = 7",
		"INSERT INTO t VALUES (300, 'u7', 300)",
		"COMMIT")
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)
	if mode, reason := f.tableState(t, db, db, "t"); mode != "streaming" {
		t.Fatalf("t: state %q reason %q after the first run over the loaded target\n%s", mode, reason, grepLines(d.stderr.String(), "quarantine"))
	}
	f.compare(t, harness.TableSpec{Database: db, Table: "t", SourceZone: "UTC", SoftDelete: true})
	if got := keys(f.waitIndexes(t, db, "t", "t_uq_u")); got != "t_uq_u" || !f.deferredUnique(t, "t_uq_u") {
		t.Fatalf("after the load: indexes %s, want the deferred unique constraint t_uq_u\n%s", got, grepLines(d.stderr.String(), "mirror"))
	}
	// The table streams with its constraint: a swap in one transaction.
	f.exec(t, "USE "+db, "BEGIN", "UPDATE t SET u = NULL WHERE id = 2", "UPDATE t SET u = 'u2' WHERE id = 3", "UPDATE t SET u = 'u3' WHERE id = 2", "COMMIT")
	f.waitCaughtUp(t, db, d)
	f.compare(t, harness.TableSpec{Database: db, Table: "t", SourceZone: "UTC", SoftDelete: true})
	f.stopOK(t, d)
}

func TestFirstRunAgainKeepsRealUniqueViolation(t *testing.T) {
	f, db, cfg := reloadUniqueFixture(t, "it_uqreal_")
	// A target row the load does not rewrite: newer than anything the
	// source will stamp (the version guard keeps it), holding id 4's
	// value. Made by hand with the constraint away (it refuses it
	// otherwise).
	for _, stmt := range []string{
		`ALTER TABLE "` + db + `".t DROP CONSTRAINT t_uq_u`,
		`UPDATE "` + db + `".t SET u = 'u4', _tm_seq = 9000000000000000000 WHERE id = 3`,
	} {
		if _, err := f.pg.Exec(f.ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)
	mode, reason := f.tableState(t, db, db, "t")
	if mode != "quarantined" || !strings.Contains(reason, `rows of the target violate the mirrored unique index "t_uq_u"`) {
		t.Fatalf("t: state %q reason %q, want quarantined naming t_uq_u\n%s", mode, reason, grepLines(d.stderr.String(), "quarantine"))
	}
	f.stopOK(t, d)
}
