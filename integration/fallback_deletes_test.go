package integration

import (
	"math/rand/v2"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestWindowCatchUpFindsDeletesWithoutKeydiff: the direct path, a table
// with a watermark column and delete_detection unset (the default). Rows
// are deleted while tidemark is down and the binlog is purged: the window
// catch-up cannot see them, and the target held rows of the table. Before,
// they stayed in the target with only WARN "hard deletes made while the
// binlog was unavailable were NOT captured"; now the catch-up takes the
// key diff (the target lists keys, the key is an integer) and the target
// equals the source.
func TestWindowCatchUpFindsDeletesWithoutKeydiff(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_fbdel_")
	f.dropLater(t, db, db)
	w := &harness.Workload{My: f.my, Database: db, Zone: "UTC", Rand: rand.New(rand.NewPCG(31, 32)), BigTxRows: 50}
	if err := w.Setup(); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(150); err != nil {
		t.Fatal(err)
	}
	cfg := f.configYAMLWith(t, db, db, db, "UTC", tidemark.Position{}, fallbackYAML(db, false))
	d := f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.stderr.String())
	}
	if err := w.Run(100); err != nil {
		t.Fatal(err)
	}
	if err := harness.Exec(f.my, "DELETE FROM "+db+".orders WHERE order_id BETWEEN 2 AND 40"); err != nil {
		t.Fatal(err)
	}
	f.purgeBinlogs(t)
	d = f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.stderr.String())
	}
	log := d.stderr.String()
	if !strings.Contains(log, "mode=window") {
		t.Fatalf("no window catch-up:\n%s", grepLines(log, "caught up"))
	}
	if strings.Contains(log, "NOT captured") {
		t.Errorf("a log line admits lost deletes:\n%s", grepLines(log, "NOT captured"))
	}
	diff := f.compare(t, harness.TableSpec{Database: db, Table: "orders", SourceZone: "UTC"})
	t.Logf("%s; %s", diff, grepLines(log, "table caught up"))
}

// TestWindowCatchUpRefusesUndiffableKey: the same gap for a table whose
// key the key diff cannot list (a DATETIME key) and whose target holds
// rows. Rows deleted meanwhile cannot be found: the table is quarantined
// with one error naming it, the setting and the resync, instead of a
// WARN beside a target that keeps the deleted rows.
func TestWindowCatchUpRefusesUndiffableKey(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_fbkey_")
	f.dropLater(t, db, db)
	f.exec(t, "CREATE DATABASE "+db,
		"CREATE TABLE "+db+".orders (at DATETIME(6) NOT NULL PRIMARY KEY, v INT NOT NULL, updated_at DATETIME(6) NOT NULL)",
		"INSERT INTO "+db+".orders SELECT '2026-01-01' + INTERVAL seq SECOND, seq, NOW(6) FROM "+db+".seq_1_to_50")
	cfg := f.configYAMLWith(t, db, db, db, "UTC", tidemark.Position{}, fallbackYAML(db, false))
	d := f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.stderr.String())
	}
	f.exec(t, "DELETE FROM "+db+".orders WHERE v <= 10", "UPDATE "+db+".orders SET v = v + 100, updated_at = NOW(6) WHERE v > 40")
	f.purgeBinlogs(t)
	d = f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.stderr.String())
	}
	log := d.stderr.String()
	if strings.Contains(log, "NOT captured") {
		t.Errorf("a log line admits lost deletes:\n%s", grepLines(log, "NOT captured"))
	}
	line := grepLines(log, "table quarantined")
	for _, want := range []string{db + ".orders", "delete_detection", "resync"} {
		if !strings.Contains(line, want) {
			t.Fatalf("the table was not quarantined naming %q:\n%s", want, tail(log, 12))
		}
	}
	t.Logf("%s", line)
}

// TestApplyWindowCatchUpRemovesDeletes: the scale-out topology, a table
// with a watermark column (the tailer has no target keys to diff). Rows
// are deleted while the tailer is down and the binlog is purged. Before,
// the window catch-up left them in the appliers' target with only WARN
// "… NOT captured"; now the table is read in full between snapshot
// boundaries, whose end removes them, and the target equals the source.
func TestApplyWindowCatchUpRemovesDeletes(t *testing.T) {
	f := newFixture(t)
	r, _ := f.newApplyRun(t, "it_applywin_", 109, 2, 50)
	f.forgetStates(t, r.db)
	if err := r.w.Run(60); err != nil {
		t.Fatal(err)
	}
	// A first run (no start position): its snapshot stores the table's
	// watermark, so the catch-up after the purge is a window.
	b, err := os.ReadFile(r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	startRE := regexp.MustCompile(`(?m)^  start_position: .*$`)
	if !startRE.Match(b) {
		t.Fatalf("config has no start_position:\n%s", b)
	}
	b = startRE.ReplaceAll(b, []byte(`  start_position: ""`))
	if err := os.WriteFile(r.cfg, append(b, fallbackYAML(r.db, false)...), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := harness.TableSpec{Database: r.db, Table: "orders", SourceZone: "UTC"}
	ps := &procSet{f: f, t: t}
	defer ps.killAll()
	tailer := ps.start("run", "--config", r.cfg)
	ps.start("apply", "--config", r.cfg)
	if err := r.w.Run(60); err != nil {
		t.Fatal(err)
	}
	ps.converge(spec, "before the tailer stops")
	if code := tailer.stop(t); code != 0 {
		t.Fatalf("tailer exit %d:\n%s", code, tail(tailer.stderr.String(), 10))
	}
	if err := r.w.Run(60); err != nil {
		t.Fatal(err)
	}
	f.exec(t, "DELETE FROM "+r.db+".orders WHERE order_id BETWEEN 2 AND 30")
	f.purgeBinlogs(t)
	ps.procs = ps.procs[1:]
	resumed := ps.start("run", "--config", r.cfg)
	ps.converge(spec, "after the catch-up of the purged gap")
	log := resumed.stderr.String()
	if !strings.Contains(log, "binlog position purged") {
		t.Fatalf("no catch-up of a purged position:\n%s", tail(log, 10))
	}
	if strings.Contains(log, "NOT captured") {
		t.Errorf("a log line admits lost deletes:\n%s", grepLines(log, "NOT captured"))
	}
	t.Logf("%s", grepLines(log, "table caught up"))
}

// TestKafkaAloneCatchUpOverPublishedTopic: Kafka alone (no PostgreSQL), a
// table with a watermark column. A first run into a topic that holds no
// record misses no delete and says nothing of it. Rows deleted while the
// daemon is down and the binlog purged cannot be found by a key diff
// (Kafka lists no keys): without control records the catch-up stops with
// one error naming the table and control_records (before: WARN "… NOT
// captured" and the consumers kept the rows); with them the table is
// read in full between snapshot boundaries and the daemon goes on.
func TestKafkaAloneCatchUpOverPublishedTopic(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_kafdel_")
	f.dropLater(t, db)
	w := &harness.Workload{My: f.my, Database: db, Zone: "UTC", Rand: rand.New(rand.NewPCG(41, 42)), BigTxRows: 50}
	if err := w.Setup(); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(60); err != nil {
		t.Fatal(err)
	}
	prefix := "tk" + strings.TrimPrefix(db, "it_kafdel_")
	cfg := f.kafkaOnlyConfig(t, db, prefix, tidemark.Position{}, "")
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, append(b, fallbackYAML(db, false)...), 0o600); err != nil {
		t.Fatal(err)
	}
	d := f.startDaemon(t, cfg)
	testenv.WaitFor(60*time.Second, func() bool { return strings.Contains(d.stderr.String(), "catch-up finished") || d.exited() })
	if code := d.stop(t); code != 0 {
		t.Fatalf("first run: exit %d\n%s", code, tail(d.stderr.String(), 10))
	}
	if s := d.stderr.String(); strings.Contains(s, "NOT captured") || !strings.Contains(s, "catch-up finished") {
		t.Fatalf("first run into an empty topic: want a catch-up and no word of missed deletes:\n%s", tail(s, 12))
	}
	f.exec(t, "DELETE FROM "+db+".orders WHERE order_id BETWEEN 2 AND 20")
	f.purgeBinlogs(t)
	d = f.startDaemon(t, cfg)
	if !testenv.WaitFor(90*time.Second, d.exited) {
		s := d.stderr.String()
		d.kill()
		t.Fatalf("the catch-up over a topic with records did not stop (deletes it cannot tell the consumers of):\n%s", grepLines(s, "fallback"))
	}
	line := grepLines(d.stderr.String(), "cannot be found")
	for _, want := range []string{db + ".orders", "control_records"} {
		if !strings.Contains(line, want) {
			t.Fatalf("the stop does not name %q:\n%s", want, tail(d.stderr.String(), 8))
		}
	}
	setYAML(t, cfg, "    tombstones: true\n", "    tombstones: true\n    control_records: true\n")
	d = f.startDaemon(t, cfg)
	testenv.WaitFor(90*time.Second, func() bool { return strings.Contains(d.stderr.String(), "catch-up finished") || d.exited() })
	// A full read between boundaries: the window turned into one (reason
	// "… read in full between snapshot boundaries"), or a snapshot when no
	// watermark was read back.
	if code := d.stop(t); code != 0 || !regexpContains(d.stderr.String(), `table caught up.*mode=snapshot`) {
		t.Fatalf("with control records: exit %d, want the table read in full between boundaries:\n%s", code, tail(d.stderr.String(), 15))
	}
	t.Logf("stopped without control records: %s", line)
}
