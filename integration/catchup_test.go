package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/integration/harness"
)

// waitRunningCaughtUp is waitCaughtUp that fails at once when the daemon
// exits instead of waiting for the timeout.
func (f *fixture) waitRunningCaughtUp(t *testing.T, source string, d *daemonProc) {
	t.Helper()
	target, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(120 * time.Second)
	for {
		if d.exited() {
			t.Fatalf("daemon exited (code %d):\n%s", d.cmd.ProcessState.ExitCode(), tail(d.stderr.String(), 40))
		}
		err := harness.WaitCaughtUp(f.ctx, f.pg, "", source, target, time.Second)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v\ndaemon stderr (tail):\n%s", err, tail(d.stderr.String(), 40))
		}
	}
}

// TestNullWatermarkColumn: rows whose watermark column is NULL. A first-run
// snapshot copies a table whose column is NULL in every row (it used to copy
// nothing: MAX(column) was NULL, the table was taken for empty), and a
// catch-up window after a purge brings the changes made to undated rows
// while tidemark was down (no window predicate selected them).
func TestNullWatermarkColumn(t *testing.T) {
	f := newFixture(t)
	db := randName("it_nullwm_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE allnull (id INT PRIMARY KEY, v INT, updated_at DATETIME(6) NULL, KEY (updated_at))",
		"CREATE TABLE partial (id INT PRIMARY KEY, v INT, updated_at DATETIME(6) NULL, KEY (updated_at))",
		"INSERT INTO allnull SELECT seq, seq, NULL FROM seq_1_to_20",
		"INSERT INTO partial SELECT seq, seq, IF(seq % 2 = 0, NULL, NOW(6) - INTERVAL 1 HOUR) FROM seq_1_to_20")
	cfg := f.configYAMLWith(t, db, db, db, "UTC", tidemark.Position{}, fmt.Sprintf(`fallback:
  chunk_rows: 7
  lookback: 1m
  tables:
    %[1]s.allnull: {column: updated_at}
    %[1]s.partial: {column: updated_at}
`, db))
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitRunningCaughtUp(t, db, d)
	f.compareTable(t, db, "allnull")
	f.compareTable(t, db, "partial")
	if !strings.Contains(d.stderr.String(), `msg="the watermark column is NULL (or a zero date) in every row`) {
		t.Fatalf("no warning for the all-NULL watermark column:\n%s", d.stderr.String())
	}
	f.stopOK(t, d)

	// While tidemark is down: updated undated rows, a new one, a dated
	// change; then the binlog is purged.
	f.exec(t, "USE "+db,
		"UPDATE partial SET v = v + 100 WHERE updated_at IS NULL",
		"INSERT INTO partial VALUES (21, 21, NULL), (22, 22, NOW(6))",
		"UPDATE allnull SET v = v + 100 WHERE id <= 5",
		"INSERT INTO allnull VALUES (21, 21, NULL)")
	f.purgeBinlogs(t)
	d = f.startDaemon(t, cfg)
	f.waitRunningCaughtUp(t, db, d)
	f.compareTable(t, db, "allnull")
	f.compareTable(t, db, "partial")
	if !regexpContains(d.stderr.String(), `msg="table caught up" .*table=`+db+`\.partial mode=window rows=\d+ .*undated_rows=11`) {
		t.Fatalf("the window did not report the 11 undated rows it read:\n%s", grepLines(d.stderr.String(), "caught up"))
	}
	f.stopOK(t, d)
}

// TestMissingWatermarkColumnQuarantines: a watermark column that is not in
// the source table (a typo in the config, or dropped by an ALTER) made every
// automatic catch-up fail, and the daemon exited 1 at every start. The table
// is quarantined with one message naming the column; the others go on.
func TestMissingWatermarkColumnQuarantines(t *testing.T) {
	f := newFixture(t)
	db := randName("it_nocol_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE t1 (id INT PRIMARY KEY, v INT, updated_at DATETIME(6))",
		"CREATE TABLE t2 (id INT PRIMARY KEY, v INT, updated_at DATETIME(6))",
		"INSERT INTO t1 SELECT seq, seq, NOW(6) FROM seq_1_to_10",
		"INSERT INTO t2 SELECT seq, seq, NOW(6) FROM seq_1_to_10")
	cfg := f.configYAMLWith(t, db, db, db, "UTC", tidemark.Position{}, fmt.Sprintf(`fallback:
  tables:
    %[1]s.t1: {column: updated_att}
    %[1]s.t2: {column: updated_at}
`, db))
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitRunningCaughtUp(t, db, d)
	f.compareTable(t, db, "t2")
	mode, reason := f.tableState(t, db, db, "t1")
	if mode != "quarantined" || !strings.Contains(reason, `watermark column "updated_att" (fallback.tables.`+db+`.t1.column) is not in the source table`) {
		t.Fatalf("t1: state %q, reason %q\n%s", mode, reason, d.stderr.String())
	}
	if n := strings.Count(d.stderr.String(), "level=ERROR"); n != 1 || !regexpContains(d.stderr.String(), `level=ERROR msg="table quarantined.*table=`+db+`\.t1`) {
		t.Fatalf("want exactly one ERROR line, the quarantine of t1; got %d:\n%s", n, d.stderr.String())
	}
	f.exec(t, "USE "+db, "INSERT INTO t2 VALUES (11, 11, NOW(6))", "UPDATE t2 SET v = 0 WHERE id = 1")
	f.waitRunningCaughtUp(t, db, d)
	f.compareTable(t, db, "t2")
	f.stopOK(t, d)

	// Restarted after a purge: the catch-up leaves the quarantined table
	// out and the daemon streams.
	f.exec(t, "USE "+db, "INSERT INTO t2 VALUES (12, 12, NOW(6))")
	f.purgeBinlogs(t)
	d = f.startDaemon(t, cfg)
	f.waitRunningCaughtUp(t, db, d)
	f.compareTable(t, db, "t2")
	f.stopOK(t, d)
}
