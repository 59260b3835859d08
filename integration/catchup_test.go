package integration

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
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
	db := testenv.Name("it_nullwm_")
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
	db := testenv.Name("it_nocol_")
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

// TestManualCatchupBesideDaemon: `tidemark catchup` while the daemon
// streams the same source. The catch-up reads row K, the application
// deletes K, the daemon applies the delete, and the catch-up then writes K
// back, stamped with its older captured version: nothing in the target is
// left for it to lose to, and K stays for good. The catch-up must refuse to
// run beside a daemon (and say what to do instead); the target must still
// equal the source.
func TestManualCatchupBesideDaemon(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_mcu_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE t (id INT PRIMARY KEY, v INT, pad VARCHAR(200), updated_at DATETIME(6), KEY (updated_at))",
		"INSERT INTO t SELECT seq, seq, REPEAT('x', 200), NOW(6) FROM seq_1_to_20000")
	cfg := f.configYAMLWith(t, db, db, db, "UTC", tidemark.Position{}, fmt.Sprintf(`fallback:
  chunk_rows: 4000
  lookback: 1h
  tables:
    %[1]s.t: {column: updated_at}
`, db))
	// I5 watches the catch-ups for regressions. The resurrection itself
	// is not one it can see (its tombstone holds the deleted row's last
	// version, older than the catch-up's, not the delete's): I1 finds it.
	watchI5(t, f, db)
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitRunningCaughtUp(t, db, d)
	i5Watched(t, f, db, "t")

	// Deletes of random rows while the catch-up runs.
	del, err := f.env.MySQL()
	if err != nil {
		t.Fatal(err)
	}
	defer del.Close()
	stop := make(chan struct{})
	deleted := make(chan int, 1)
	go func() {
		n := 0
		defer func() { deleted <- n }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := del.Execute(fmt.Sprintf("DELETE FROM %s.t WHERE id = %d", db, 1+(i*7919)%20000)); err != nil {
				return
			}
			n++
		}
	}()
	var outs []string
	var codes []int
	for i := 0; i < 3; i++ {
		cmd := exec.Command(binPath, "catchup", "--config", cfg, "--table", db+".t")
		cmd.Env = append(cmd.Environ(), "TM_IT_MYSQL_PASSWORD="+f.env.MySQLPassword, "TM_IT_PG_DSN="+f.env.PGDSN)
		out, _ := cmd.CombinedOutput()
		outs = append(outs, string(out))
		codes = append(codes, cmd.ProcessState.ExitCode())
	}
	close(stop)
	n := <-deleted
	f.waitRunningCaughtUp(t, db, d)
	diff, err := harness.Compare(f.ctx, f.my, f.pg, harness.TableSpec{Database: db, Table: "t", SourceZone: "UTC"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rows deleted during 3 catch-ups; exit codes %v; target: %s", n, codes, diff)
	if !diff.Equal() {
		t.Errorf("deleted rows came back: %s\n%s", diff, strings.Join(diff.Examples, "\n"))
	}
	checkI5(t, f, db, false)
	for i, out := range outs {
		if codes[i] != 1 || !strings.Contains(out, "a tidemark daemon is streaming source "+db) || !strings.Contains(out, "tidemark resync --table") {
			t.Fatalf("catch-up beside a streaming daemon: exit %d, want 1 and a refusal naming the source:\n%s", codes[i], out)
		}
	}
	f.stopOK(t, d)
}

// TestFirstRunLogsOnlyWhatHappened: the log of a first start on a fresh
// target, then of a start after a purge. A first snapshot into an empty
// target cannot have missed a delete and must not warn about it; the
// retention probe has nothing to measure before the first checkpoint (not a
// warning); a DROP TABLE IF EXISTS of a table that never reached the target
// dropped nothing (no line saying it did); and the restart after a purge,
// which the fallback recovers, logs no ERROR (go-mysql's failed KILL of a
// dump connection the server had already closed was one). The full
// catch-up over a target that holds rows finds the delete made meanwhile.
func TestFirstRunLogsOnlyWhatHappened(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_log_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE t (id INT PRIMARY KEY, v INT)", "INSERT INTO t SELECT seq, seq FROM seq_1_to_50")
	cfg := f.configYAML(t, db, db, db, "UTC", tidemark.Position{})
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitRunningCaughtUp(t, db, d)
	f.exec(t, "DROP TABLE IF EXISTS "+db+".never_there", "INSERT INTO "+db+".t VALUES (51, 51)")
	f.waitRunningCaughtUp(t, db, d)
	f.compareTable(t, db, "t")
	f.stopOK(t, d)
	first := d.stderr.String()
	for _, bad := range []string{"level=WARN", "level=ERROR", "table dropped in the target", "dropping target table"} {
		if strings.Contains(first, bad) {
			t.Errorf("first run logged %q:\n%s", bad, grepLines(first, bad))
		}
	}
	if !strings.Contains(first, "mode=full rows=50") {
		t.Fatalf("no snapshot of the 50 rows:\n%s", first)
	}

	f.exec(t, "DELETE FROM "+db+".t WHERE id = 1")
	f.purgeBinlogs(t)
	d = f.startDaemon(t, cfg)
	f.waitRunningCaughtUp(t, db, d)
	f.stopOK(t, d)
	second := d.stderr.String()
	if strings.Contains(second, "level=ERROR") {
		t.Errorf("a purged position the fallback recovered logged an ERROR:\n%s", grepLines(second, "level=ERROR"))
	}
	// A full re-read (no watermark column) over a target that holds rows
	// finds the hard delete made while the binlog was gone with a key
	// diff, delete_detection unset: nothing to warn about.
	if strings.Contains(second, "NOT captured") || !regexpContains(second, `table caught up.*table=`+db+`\.t.*deletes=1`) {
		t.Errorf("the full catch-up over a target with rows should find the delete with a key diff:\n%s", second)
	}
	f.compareTable(t, db, "t")
}
