package integration

import (
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestFirstRunResumeFindsItsTargetReplaced: a first run reads table k to
// its end and is killed while it reads t, with t's progress recorded past
// its first chunks. While no daemon runs, someone starts the target over
// by hand: k's target table is dropped, t's truncated (tidemark's own
// tables, and so the interrupted run's records, are kept). The resumed run
// must not trust the records for targets that are no longer the ones they
// were written for: before, k was skipped as done and t was read only
// after its recorded cursor, and both targets ended short of the source
// with every state streaming. Both are read again in full, and both end
// equal to the source.
func TestFirstRunResumeFindsItsTargetReplaced(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_frtgt_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE k (id INT PRIMARY KEY, v INT)",
		"INSERT INTO k SELECT seq, seq FROM seq_1_to_50",
		"CREATE TABLE t (id INT PRIMARY KEY, v INT)",
		"INSERT INTO t SELECT seq, seq FROM seq_1_to_200")
	cfg := f.configYAMLWith(t, db, db, db, "UTC", tidemark.Position{}, "fallback:\n  enabled: true\n  chunk_rows: 10\nsnapshot:\n  parallelism: 1\n  progress_every: 1ms\n")
	loadHeld, releaseLoad := holdWrites(t, f, db, "hold_load", "NEW.id = 150", 250512, true)
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	recorded := func(tb, like string) bool {
		var n int
		_ = f.pg.QueryRow(f.ctx, `SELECT count(*) FROM tidemark.tables WHERE source = $1 AND database = $1 AND table_name = $2 AND snapshot_cursor LIKE $3`, db, tb, like).Scan(&n)
		return n == 1
	}
	if !testenv.WaitFor(120*time.Second, func() bool {
		return d.exited() || loadHeld() && recorded("k", `%"done":true%`) && recorded("t", `%"after"%`)
	}) || d.exited() {
		t.Fatalf("the first run did not read k to its end and record t's progress up to id 150:\n%s", tail(d.stderr.String(), 20))
	}
	d.kill()
	releaseLoad()
	for _, stmt := range []string{`DROP TABLE "` + db + `".k`, `TRUNCATE "` + db + `".t`} {
		if _, err := f.pg.Exec(f.ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	d = f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	f.exec(t, "USE "+db, "UPDATE k SET v = 0 WHERE id = 3", "DELETE FROM t WHERE id = 4")
	f.waitCaughtUp(t, db, d)
	f.streamingAndEqual(t, d, db, "k", "t")
	if !strings.Contains(d.stderr.String(), "not the one") {
		t.Errorf("the resumed run did not say why it read the tables again:\n%s", tail(d.stderr.String(), 30))
	}
	f.stopOK(t, d)
}

// TestSnapshotResumeFindsItsTargetTruncated: a resync of big beside the
// stream, under the write load, is killed (SIGKILL) once its recorded
// progress covers a third of big; while no daemon runs big's target is
// truncated by hand. The next start must not resume after the recorded
// chunks, whose rows are gone: before, it did, and big ended streaming
// with a third of its rows missing. It redoes the snapshot from its first
// chunk, says why, and big then equals the source row by row.
func TestSnapshotResumeFindsItsTargetTruncated(t *testing.T) {
	f := newFixture(t)
	db, cfg, d := snapFixture(t, f, "it_snaptrunc_")
	defer cleanupDaemon(&d)
	stopLoad := f.startResync(t, d, db, cfg)
	f.waitBigRows(t, d, db, snapBigRows/3)
	f.waitCursorAfter(t, d, db)
	d.kill()
	if _, err := f.pg.Exec(f.ctx, `TRUNCATE "`+db+`".big`); err != nil {
		t.Fatal(err)
	}
	d = f.startDaemon(t, cfg)
	logs := f.endResync(t, d, db, stopLoad)
	if !strings.Contains(logs, "not the one its chunk cursor was recorded against") {
		t.Errorf("the restarted run did not say why it redid the snapshot:\n%s", grepLines(logs, "snapshot"))
	}
	f.compare(t, harness.TableSpec{Database: db, Table: "big", SourceZone: "UTC"})
	f.compare(t, harness.TableSpec{Database: db, Table: "small", SourceZone: "UTC"})
}

// streamingAndEqual fails the test unless each of db's tables (source db)
// is recorded streaming and, within a minute, equals the source row by
// row.
func (f *fixture) streamingAndEqual(t *testing.T, d *daemonProc, db string, tables ...string) {
	t.Helper()
	for _, tb := range tables {
		if mode, reason := f.tableState(t, db, db, tb); mode != "streaming" {
			t.Fatalf("%s: state %q reason %q\n%s", tb, mode, reason, grepLines(d.stderr.String(), "level=ERROR")+grepLines(d.stderr.String(), "key"))
		}
		var diff *harness.Diff
		testenv.WaitFor(60*time.Second, func() bool {
			dd, err := harness.Compare(f.ctx, f.my, f.pg, harness.TableSpec{Database: db, Table: tb, SourceZone: "UTC"})
			if err != nil {
				t.Fatal(err)
			}
			diff = dd
			return dd.Equal()
		})
		if !diff.Equal() {
			t.Fatalf("%s differs from the source: %s\n%s\n%s", tb, diff, strings.Join(diff.Examples, "\n"), grepLines(d.stderr.String(), "target"))
		}
	}
}
