package integration

import (
	"fmt"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// purgeBinlogs rotates the binlog and purges every file before the new one:
// any checkpoint taken before this point is gone from the server.
func (f *fixture) purgeBinlogs(t *testing.T) {
	t.Helper()
	if err := harness.Exec(f.my, "FLUSH BINARY LOGS"); err != nil {
		t.Fatal(err)
	}
	r, err := f.my.Execute(f.binlogStatusSQL())
	if err != nil {
		t.Fatal(err)
	}
	file, _ := r.GetString(0, 0)
	// The server skips files still open by a dump thread (a replica that
	// disconnected is noticed at its next heartbeat): retry until only the
	// current file is left.
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := harness.Exec(f.my, "PURGE BINARY LOGS TO '"+file+"'"); err != nil {
			t.Fatal(err)
		}
		r, err := f.my.Execute("SHOW BINARY LOGS")
		if err != nil {
			t.Fatal(err)
		}
		if r.RowNumber() == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("binlogs before %s still there after 20 s (%d files)", file, r.RowNumber())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func fallbackYAML(db string, keydiff bool) string {
	del := ""
	if keydiff {
		del = ", delete_detection: keydiff"
	}
	return fmt.Sprintf(`fallback:
  chunk_rows: 500
  lookback: 15m
  tables:
    %s.orders: {column: updated_at%s}
`, db, del)
}

func (f *fixture) runCatchup(t *testing.T, config string, extra ...string) string {
	t.Helper()
	cmd := exec.Command(binPath, append([]string{"catchup", "--config", config}, extra...)...)
	cmd.Env = append(cmd.Environ(), "TM_IT_MYSQL_PASSWORD="+f.env.MySQLPassword, "TM_IT_PG_DSN="+f.env.PGDSN)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("catchup: %v\n%s", err, out)
	}
	return string(out)
}

// TestFallbackAfterPurge: tidemark is stopped, rows are inserted, updated
// and deleted (one transaction commits late with an old timestamp inside the
// lookback), the binlogs are purged; on restart tidemark catches up with
// bounded reads and a key diff, reattaches to the binlog, and keeps
// streaming.
func TestFallbackAfterPurge(t *testing.T) {
	eachSource(t, testFallbackAfterPurge)
}

func testFallbackAfterPurge(t *testing.T, f *fixture) {
	db := testenv.Name("it_fb_")
	f.dropLater(t, db, db)
	w := &harness.Workload{My: f.my, Database: db, Zone: "Asia/Kolkata", Rand: rand.New(rand.NewPCG(21, 22)), BigTxRows: 100}
	if err := w.Setup(); err != nil {
		t.Fatal(err)
	}
	if err := harness.Exec(f.my, "CREATE INDEX upd ON orders (updated_at)"); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(200); err != nil {
		t.Fatal(err)
	}
	// No checkpoint and no start position: the first run takes a snapshot
	// (storing the watermark), then streams.
	cfg := f.configYAMLWith(t, db, db, db, "Asia/Kolkata", tidemark.Position{}, fallbackYAML(db, true))
	d := f.startDaemon(t, cfg, "TZ=UTC")
	f.waitCaughtUp(t, db, d)
	if err := w.Run(100); err != nil {
		t.Fatal(err)
	}
	f.waitCaughtUp(t, db, d)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.stderr.String())
	}
	// While tidemark is down: more changes, a late commit, then a purge.
	late, err := f.env.MySQL()
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if err := harness.Exec(late, "USE "+db, "SET time_zone = 'Asia/Kolkata'", "BEGIN",
		"INSERT INTO orders VALUES (0, 2, 'late', 5.00, 'new', 'late commit', NOW(6) - INTERVAL 10 MINUTE, NULL)"); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(200); err != nil {
		t.Fatal(err)
	}
	if err := harness.Exec(f.my, "DELETE FROM orders WHERE order_id BETWEEN 2 AND 40"); err != nil {
		t.Fatal(err)
	}
	if err := harness.Exec(late, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	f.purgeBinlogs(t)

	d = f.startDaemon(t, cfg, "TZ=UTC")
	f.waitCaughtUp(t, db, d)
	// Streaming continues after the catch-up.
	if err := w.Run(50); err != nil {
		t.Fatal(err)
	}
	f.waitCaughtUp(t, db, d)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.stderr.String())
	}
	log := d.stderr.String()
	for _, want := range []string{"binlog position purged", "mode=window", "catch-up finished", "caught up; resuming the binlog"} {
		if !strings.Contains(log, want) {
			t.Fatalf("log lacks %q:\n%s", want, grepLines(log, "caught up"))
		}
	}
	m := regexp.MustCompile(`deletes=(\d+)`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("no key-diff deletes reported:\n%s", grepLines(log, "caught up"))
	}
	if n, _ := strconv.Atoi(m[1]); n < 39 {
		t.Fatalf("key diff found %d deletes, want ≥ 39 (the 39 deleted while down)", n)
	}
	diff := f.compare(t, harness.TableSpec{Database: db, Table: "orders", SourceZone: "Asia/Kolkata"})
	t.Logf("after purge and fallback: %s", diff)
}

// TestFallbackWithoutFallbackStops: a purged position with the fallback off
// is a clear error and a non-zero exit, and nothing is skipped.
func TestFallbackDisabledStops(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_nofb_")
	f.dropLater(t, db, db)
	start, _ := harness.SourcePosition(f.my)
	w := &harness.Workload{My: f.my, Database: db, Zone: "UTC", BigTxRows: 10}
	if err := w.Setup(); err != nil {
		t.Fatal(err)
	}
	cfg := f.configYAMLWith(t, db, db, db, "UTC", start, "fallback:\n  enabled: false\n")
	d := f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	d.stop(t)
	before, _, _ := harness.StoredCheckpoint(f.ctx, f.pg, "", db)
	if err := w.Run(20); err != nil {
		t.Fatal(err)
	}
	f.purgeBinlogs(t)
	d = f.startDaemon(t, cfg)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		d.kill()
		t.Fatalf("daemon kept running on a purged position with the fallback off:\n%s", d.stderr.String())
	}
	if code := d.cmd.ProcessState.ExitCode(); code == 0 {
		t.Fatalf("exit 0 on a purged position; stderr:\n%s", d.stderr.String())
	}
	if !strings.Contains(d.stderr.String(), "purged") {
		t.Fatalf("error does not say the position was purged:\n%s", d.stderr.String())
	}
	after, _, _ := harness.StoredCheckpoint(f.ctx, f.pg, "", db)
	if after != before {
		t.Fatalf("checkpoint moved from %v to %v although nothing was applied", before, after)
	}
}

// TestFallbackIncidentRerun runs the same catch-up window ten times (the
// hourly re-runs with overlap of the incident): nothing changes in the
// target, and SUM(amount) equals the source.
func TestFallbackIncidentRerun(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_rerun_")
	f.dropLater(t, db, db)
	w := &harness.Workload{My: f.my, Database: db, Zone: "Asia/Kolkata", Rand: rand.New(rand.NewPCG(31, 32)), BigTxRows: 200}
	if err := w.Setup(); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(100); err != nil {
		t.Fatal(err)
	}
	cfg := f.configYAMLWith(t, db, db, db, "Asia/Kolkata", tidemark.Position{}, fallbackYAML(db, false))
	out := f.runCatchup(t, cfg) // first: a snapshot
	if !strings.Contains(out, "snapshot") {
		t.Fatalf("first catch-up was not a snapshot:\n%s", out)
	}
	var loaded0 string
	if err := f.pg.QueryRow(f.ctx, "SELECT max(_tm_loaded_at)::text || count(*)::text FROM "+db+".orders").Scan(&loaded0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		out = f.runCatchup(t, cfg, "--table", db+".orders")
		if !strings.Contains(out, "window") {
			t.Fatalf("re-run %d was not a window read:\n%s", i, out)
		}
	}
	var loaded string
	if err := f.pg.QueryRow(f.ctx, "SELECT max(_tm_loaded_at)::text || count(*)::text FROM "+db+".orders").Scan(&loaded); err != nil {
		t.Fatal(err)
	}
	if loaded != loaded0 {
		t.Fatalf("re-running the same window changed the target (%s → %s)", loaded0, loaded)
	}
	diff := f.compare(t, harness.TableSpec{Database: db, Table: "orders", SourceZone: "Asia/Kolkata"})
	if diff.SourceSum != diff.TargetSum {
		t.Fatalf("SUM(amount) %s in source, %s in target", diff.SourceSum, diff.TargetSum)
	}
	t.Logf("10 re-runs: %s; last report:\n%s", diff, out)
}

// TestFallbackFarFutureAndEmpty: a far-future row never drags the watermark
// past the captured bound (rows written after it still arrive), and an
// empty table persists no watermark.
func TestFallbackFarFutureAndEmpty(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_future_")
	f.dropLater(t, db, db)
	if err := harness.Exec(f.my, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE orders (id INT PRIMARY KEY, amount DECIMAL(10,2), updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))",
		"CREATE TABLE empty_t (id INT PRIMARY KEY, updated_at DATETIME NULL)",
		"INSERT INTO orders (id, amount) VALUES (1, 1.00), (2, 2.00)",
		"INSERT INTO orders VALUES (3, 3.00, '2037-12-31 00:00:00')"); err != nil {
		t.Fatal(err)
	}
	extra := fmt.Sprintf("fallback:\n  future_tolerance: 1m\n  tables:\n    %s.orders: {column: updated_at}\n    %s.empty_t: {column: updated_at}\n", db, db)
	cfg := f.configYAMLWith(t, db, db, db, "UTC", tidemark.Position{}, extra)
	f.runCatchup(t, cfg)
	out := f.runCatchup(t, cfg, "--table", db+".orders", "--table", db+".empty_t")
	if !strings.Contains(out, "empty") {
		t.Fatalf("empty table not reported empty:\n%s", out)
	}
	var wm time.Time
	if err := f.pg.QueryRow(f.ctx, "SELECT value FROM tidemark.watermarks WHERE source = $1 AND table_name = 'orders'", db).Scan(&wm); err != nil {
		t.Fatal(err)
	}
	if wm.After(time.Now().Add(5 * time.Minute)) {
		t.Fatalf("watermark dragged to %s by a far-future row", wm)
	}
	var n int
	if err := f.pg.QueryRow(f.ctx, "SELECT count(*) FROM tidemark.watermarks WHERE source = $1 AND table_name = 'empty_t'", db).Scan(&n); err != nil || n != 0 {
		t.Fatalf("empty table persisted %d watermarks (%v)", n, err)
	}
	// A row written after the catch-up, with a current timestamp, arrives.
	if err := harness.Exec(f.my, "INSERT INTO orders (id, amount) VALUES (4, 4.00)"); err != nil {
		t.Fatal(err)
	}
	f.runCatchup(t, cfg, "--table", db+".orders")
	f.compare(t, harness.TableSpec{Database: db, Table: "orders"})
}

// TestTamperedCheckpointIsRejected: a control-table value that does not
// parse stops tidemark with an error naming the table; nothing is dropped.
func TestTamperedCheckpointIsRejected(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_tamper_")
	f.dropLater(t, db, db)
	start, _ := harness.SourcePosition(f.my)
	w := &harness.Workload{My: f.my, Database: db, Zone: "UTC", BigTxRows: 10}
	if err := w.Setup(); err != nil {
		t.Fatal(err)
	}
	cfg := f.configYAML(t, db, db, db, "UTC", start)
	d := f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	d.stop(t)
	evil := "2026-01-01'; DROP TABLE " + db + ".orders; --"
	if _, err := f.pg.Exec(f.ctx, "UPDATE tidemark.checkpoints SET position = $1 WHERE source = $2", evil, db); err != nil {
		t.Fatal(err)
	}
	d = f.startDaemon(t, cfg)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		d.kill()
		t.Fatal("daemon started on a tampered checkpoint")
	}
	if d.cmd.ProcessState.ExitCode() == 0 || !strings.Contains(d.stderr.String(), "checkpoints") {
		t.Fatalf("want a non-zero exit naming the control table; got %d:\n%s", d.cmd.ProcessState.ExitCode(), d.stderr.String())
	}
	var n int
	if err := f.pg.QueryRow(f.ctx, "SELECT count(*) FROM "+db+".orders").Scan(&n); err != nil || n == 0 {
		t.Fatalf("target table damaged: %d rows, %v", n, err)
	}
	// The watermark column is timestamptz: the same text cannot even be
	// stored there.
	if _, err := f.pg.Exec(f.ctx, "INSERT INTO tidemark.watermarks (source, database, table_name, value) VALUES ($1, $2, 'orders', $3)", db, db, evil); err == nil {
		t.Fatal("a tampered watermark was stored")
	}
}

// TestKillDuringCatchUp kills the daemon with SIGKILL several times during
// its first-run snapshot (and once during a catch-up after a purge); the
// restarts converge to a target equal to the source.
func TestKillDuringCatchUp(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_killcu_")
	f.dropLater(t, db, db)
	w := &harness.Workload{My: f.my, Database: db, Zone: "Asia/Kolkata", Rand: rand.New(rand.NewPCG(41, 42)), BigTxRows: 1000}
	if err := w.Setup(); err != nil {
		t.Fatal(err)
	}
	if err := harness.Exec(f.my, "CREATE INDEX upd ON orders (updated_at)",
		"INSERT INTO orders SELECT 1000000 + seq, 1, 'bulk', seq / 100, 'paid', NULL, NOW(6), NULL FROM seq_1_to_60000"); err != nil {
		t.Fatal(err)
	}
	cfg := f.configYAMLWith(t, db, db, db, "Asia/Kolkata", tidemark.Position{}, fallbackYAML(db, true))
	rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for i := 0; i < 3; i++ {
		d := f.startDaemon(t, cfg)
		time.Sleep(time.Duration(100+rnd.IntN(400)) * time.Millisecond)
		d.kill()
	}
	d := f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	if err := w.Run(100); err != nil {
		t.Fatal(err)
	}
	f.waitCaughtUp(t, db, d)
	d.stop(t)
	// A purge while down, then kills during the catch-up.
	if err := w.Run(100); err != nil {
		t.Fatal(err)
	}
	if err := harness.Exec(f.my, "UPDATE orders SET amount = amount + 1, updated_at = NOW(6) WHERE order_id > 1000000 AND order_id % 7 = 0"); err != nil {
		t.Fatal(err)
	}
	f.purgeBinlogs(t)
	for i := 0; i < 2; i++ {
		d := f.startDaemon(t, cfg)
		time.Sleep(time.Duration(50+rnd.IntN(200)) * time.Millisecond)
		d.kill()
	}
	d = f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.stderr.String())
	}
	diff := f.compare(t, harness.TableSpec{Database: db, Table: "orders", SourceZone: "Asia/Kolkata"})
	t.Logf("after kills during snapshot and catch-up: %s", diff)
}
