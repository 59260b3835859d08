package integration

import (
	"strings"
	"testing"

	"tidemark"
	"tidemark/internal/testenv"
)

// TestFullReadOverMirroredUniqueIndex is nemesis seeds 695949095153 and
// 226860739659: a full read (here a first run again, after the
// checkpoint was deleted) runs over a target that holds the whole table
// with its mirrored unique constraint built, and the source has moved
// unique values between rows since. Read in key order, a chunk upserts
// row 5 with the value the target's row 95 still holds (rewritten by a
// later chunk of the same load); the constraint, checked at each chunk's
// commit, failed and the table was quarantined ("rows of the target
// violate the mirrored unique index"): an intermediate state of the
// load, not a wrong target. Now a load drops the mirrored unique
// constraints of the table it writes and the end of the load builds them
// again (where a real violation still quarantines). Both forms: a UNIQUE
// constraint (delete_mode hard) and an exclusion constraint over live
// rows (soft). The fix is 9927b09 (TestFirstRunAgainOverMirroredUniqueIndex
// covers soft mode); this one adds the UNIQUE form and values swapped
// between rows ten chunks apart.
func TestFullReadOverMirroredUniqueIndex(t *testing.T) {
	for _, mode := range []string{"hard", "soft"} {
		t.Run(mode, func(t *testing.T) {
			f := newFixture(t)
			db := testenv.Name("it_reuniq_")
			f.dropLater(t, db, db)
			f.forgetStates(t, db)
			f.exec(t, "CREATE DATABASE "+db, "USE "+db,
				"CREATE TABLE t (id INT PRIMARY KEY, u VARCHAR(20) NULL, v INT, UNIQUE KEY uq_u (u))",
				"INSERT INTO t SELECT seq, IF(seq % 10 = 0, NULL, CONCAT('u', seq)), seq FROM seq_1_to_100")
			dm := f.daemon(db, db, db, "UTC", tidemark.Position{}, "fallback:\n  chunk_rows: 10\n")
			dm.Target.Postgres.DeleteMode = mode
			cfg := dm.Write(t)
			d := f.startDaemon(t, cfg)
			defer cleanupDaemon(&d)
			f.waitCaughtUp(t, db, d)
			f.compareTable(t, db, "t")
			if got := keys(f.waitIndexes(t, db, "t", "t_uq_u")); got != "t_uq_u" {
				t.Fatalf("target indexes after the first load %q, want t_uq_u", got)
			}
			f.stopOK(t, d)

			// The source swaps the unique values of rows 5 and 95 (ten
			// chunks apart) and moves row 20's NULL-free value to row 30;
			// the first run is done again over the full target.
			f.exec(t, "USE "+db, "BEGIN",
				"UPDATE t SET u = 'tmp' WHERE id = 95",
				"UPDATE t SET u = 'u95' WHERE id = 5",
				"UPDATE t SET u = 'u5' WHERE id = 95",
				"UPDATE t SET u = NULL WHERE id = 21",
				"UPDATE t SET u = 'u21' WHERE id = 30",
				"COMMIT")
			if _, err := f.pg.Exec(f.ctx, "DELETE FROM tidemark.checkpoints WHERE source = $1", db); err != nil {
				t.Fatal(err)
			}
			d = f.startDaemon(t, cfg)
			f.waitCaughtUp(t, db, d)
			log := d.stderr.String()
			if q := grepLines(log, "quarantined"); q != "" {
				t.Fatalf("the table was quarantined by the full read:\n%s", q)
			}
			f.compareTable(t, db, "t")
			if got := keys(f.waitIndexes(t, db, "t", "t_uq_u")); got != "t_uq_u" {
				t.Fatalf("target indexes after the second load %q, want t_uq_u\n%s", got, grepLines(log, "mirror"))
			}
			if !f.deferredUnique(t, "t_uq_u") {
				t.Fatal("t_uq_u is not a deferred unique or exclusion constraint after the second load")
			}
			if !strings.Contains(log, "mirroring the indexes of the source") {
				t.Errorf("the unique constraint was not built again after the load:\n%s", grepLines(log, "mirror"))
			}
			f.stopOK(t, d)
		})
	}
}
