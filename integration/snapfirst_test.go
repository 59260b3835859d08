package integration

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestFirstRunSnapshotQuarantinesKeylessTable (nemesis seed
// 112235448234): a table with neither a primary key nor business_keys in
// the source when tidemark takes its first-run snapshot is quarantined on
// its own, as the stream does (TestTableWithoutKey): one error naming the
// table and the fix (business_keys), its state recorded with the reason,
// and the other table is snapshotted and streamed. The scale-out tailer
// stopped instead ("initial snapshot of …: catch up ….nokey: … table has
// no primary key (configure business_keys for it)", exit 1): its catch-up
// had nowhere to record a quarantine.
func TestFirstRunSnapshotQuarantinesKeylessTable(t *testing.T) {
	for _, topology := range []string{"postgres", "scale-out"} {
		t.Run(topology, func(t *testing.T) {
			f := newFixture(t)
			ps := &procSet{f: f, t: t}
			defer ps.killAll()
			var db string
			var w *harness.Workload
			var tailer *daemonProc
			var start func()
			if topology == "postgres" {
				db, _ = f.newSource(t, "it_frnokey_")
				w = newWorkload(t, f, db, "UTC", 20)
				cfg := f.relConfig(t, db, db, relOpts{Extra: "fallback:\n  enabled: true\n  chunk_rows: 100\n"})
				start = func() { tailer = ps.start("run", "--config", cfg) }
			} else {
				r, _ := f.newApplyRun(t, "it_frnokeyk_", 112, 2, 50)
				db, w = r.db, r.w
				firstRunConfig(t, r.cfg, 100)
				start = func() {
					ps.start("apply", "--config", r.cfg)
					tailer = ps.start("run", "--config", r.cfg)
				}
			}
			f.forgetStates(t, db)
			if err := w.Run(60); err != nil {
				t.Fatal(err)
			}
			f.exec(t, "CREATE TABLE "+db+".nokey (a INT, b VARCHAR(10))", "INSERT INTO "+db+".nokey VALUES (1, 'x'), (1, 'x'), (2, 'y')")
			start()
			if !testenv.WaitFor(120*time.Second, func() bool {
				return tailer.exited() || strings.Contains(tailer.stderr.String(), "catch-up finished")
			}) || tailer.exited() {
				t.Fatalf("the first-run snapshot did not finish:\n%s", grepLines(tailer.stderr.String(), "level=ERROR")+tail(tailer.stderr.String(), 10))
			}
			// The stream goes on for orders; nokey's new rows are skipped.
			if err := w.Run(40); err != nil {
				t.Fatal(err)
			}
			f.exec(t, "INSERT INTO "+db+".nokey VALUES (3, 'z')")
			ps.converge(harness.TableSpec{Database: db, Table: "orders", SourceZone: "UTC"}, "after the first-run snapshot")
			mode, reason := f.tableState(t, db, db, "nokey")
			if mode != string(tidemark.TableQuarantined) || !strings.Contains(reason, "no primary key") || !strings.Contains(reason, "business_keys") {
				t.Errorf("nokey: state %q, reason %q; want quarantined for its missing key, naming business_keys", mode, reason)
			}
			log := tailer.stderr.String()
			var quarantines []string
			for _, l := range strings.Split(grepLines(log, "level=ERROR"), "\n") {
				if strings.Contains(l, db+".nokey") {
					quarantines = append(quarantines, l)
				}
			}
			if len(quarantines) != 1 || !strings.Contains(quarantines[0], "quarantined") || !strings.Contains(quarantines[0], "business_keys") {
				t.Errorf("want one error quarantining %s.nokey that names business_keys, got:\n%s", db, strings.Join(quarantines, "\n"))
			}
			if other := withoutLines(grepLines(log, "level=ERROR"), db+".nokey"); strings.TrimSpace(other) != "" {
				t.Errorf("other errors:\n%s", other)
			}
		})
	}
}

// firstRunConfig turns a config with a start position into a first run:
// no start position, the fallback on (it snapshots every table first, in
// chunks of chunkRows rows).
func firstRunConfig(t *testing.T, cfgPath string, chunkRows int) {
	t.Helper()
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	startRE := regexp.MustCompile(`(?m)^  start_position: .*$`)
	if !startRE.Match(b) {
		t.Fatalf("config has no start_position:\n%s", b)
	}
	b = startRE.ReplaceAll(b, []byte(`  start_position: ""`))
	if err := os.WriteFile(cfgPath, append(b, fmt.Sprintf("fallback:\n  enabled: true\n  chunk_rows: %d\n", chunkRows)...), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestFirstRunSnapshotTableRenamedAway (nemesis seed 107849400749): a
// gh-ost cut-over (RENAME TABLE t2 TO _t2_del, _t2_gho TO t2) runs after
// the first-run snapshot listed the tables and before it reads _t2_gho.
// The snapshot must leave the table it no longer finds out — the binlog
// carries the RENAME after the position the stream resumes at, and the
// stream follows it — instead of stopping ("table not found on source").
// Each table's rows end up under its current name, once: t2 holds the
// ghost's rows, _t2_del the original's, and _t2_gho is nowhere.
//
// The window is made deterministic with a lock: the test holds LOCK
// TABLES a_big WRITE, so the snapshot (tables in name order: a_big, t2,
// _t2_gho) waits on its first read until the test has renamed the tables
// and unlocks. a_big itself is renamed to a_moved while that read waits
// (the read then fails with ER_NO_SUCH_TABLE, after the table's schema
// was read).
func TestFirstRunSnapshotTableRenamedAway(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_frgone_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE a_big (id INT PRIMARY KEY, v INT NOT NULL)",
		"INSERT INTO a_big VALUES (1, 1), (2, 2), (3, 3)",
		"CREATE TABLE t2 (id INT PRIMARY KEY, v VARCHAR(20) NOT NULL)",
		"INSERT INTO t2 VALUES (1, 'original'), (2, 'original'), (3, 'original')",
		"CREATE TABLE _t2_gho (id INT PRIMARY KEY, v VARCHAR(20) NOT NULL)",
		"INSERT INTO _t2_gho VALUES (1, 'ghost'), (2, 'ghost'), (4, 'ghost')")
	lock, err := f.env.MySQL()
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := harness.Exec(lock, "LOCK TABLES "+db+".a_big WRITE"); err != nil {
		t.Fatal(err)
	}
	// One table at a time (snapshot.parallelism 1): the locked a_big holds the
	// read back so that the RENAME lands before _t2_gho's turn; with tables
	// read at once (c22b681) another worker may read _t2_gho first, which is
	// right but leaves this window untested (CI check 2026-12-02 09:59).
	d := f.daemon(db, db, db, "UTC", tidemark.Position{}, "snapshot:\n  parallelism: 1\nfallback:\n  enabled: true\n  chunk_rows: 2\n")
	d.Target.Postgres.More = map[string]any{"ddl": map[string]any{"drop_table": "apply"}}
	cfg := d.Write(t)
	ps := &procSet{f: f, t: t}
	defer ps.killAll()
	dp := ps.start("run", "--config", cfg)
	// The snapshot listed the tables and waits for a_big.
	if !testenv.WaitFor(60*time.Second, func() bool { return dp.exited() || f.waitingForMDL("SELECT %`"+db+"`.`a_big`%") }) || dp.exited() {
		t.Fatalf("the first-run snapshot did not wait for a_big:\n%s", tail(dp.stderr.String(), 20))
	}
	f.exec(t, "USE "+db, "RENAME TABLE t2 TO _t2_del, _t2_gho TO t2", "INSERT INTO t2 VALUES (5, 'after')", "UPDATE _t2_del SET v = 'del' WHERE id = 1")
	// a_big itself is renamed away while the snapshot's read of it waits:
	// the RENAME (an exclusive lock) goes first when the lock is released,
	// and the read finds no table (ER_NO_SUCH_TABLE).
	mover, err := f.env.MySQL()
	if err != nil {
		t.Fatal(err)
	}
	defer mover.Close()
	moved := make(chan error, 1)
	go func() { moved <- harness.Exec(mover, "RENAME TABLE "+db+".a_big TO "+db+".a_moved") }()
	if !testenv.WaitFor(60*time.Second, func() bool { return f.waitingForMDL("RENAME TABLE %a_big%") }) {
		t.Fatal("the RENAME of a_big does not wait for the lock")
	}
	if err := harness.Exec(lock, "UNLOCK TABLES"); err != nil {
		t.Fatal(err)
	}
	if err := <-moved; err != nil {
		t.Fatal(err)
	}
	f.exec(t, "INSERT INTO "+db+".a_moved VALUES (4, 4)")
	if !testenv.WaitFor(60*time.Second, func() bool {
		return dp.exited() || strings.Contains(dp.stderr.String(), "catch-up finished")
	}) || dp.exited() {
		t.Fatalf("the first-run snapshot did not finish:\n%s", grepLines(dp.stderr.String(), "level=ERROR")+tail(dp.stderr.String(), 10))
	}
	for _, gone := range []string{"a_big", "_t2_gho"} {
		if !strings.Contains(grepLines(dp.stderr.String(), "left out of the catch-up"), "table="+db+"."+gone) {
			t.Errorf("the snapshot did not leave %s out:\n%s", gone, tail(dp.stderr.String(), 20))
		}
	}
	// t2, _t2_del and a_moved, renamed into the stream, are snapshotted
	// again beside it.
	for _, tb := range []string{"a_moved", "t2", "_t2_del"} {
		ps.converge(harness.TableSpec{Database: db, Table: tb, SourceZone: "UTC"}, tb)
	}
	for _, gone := range []string{"a_big", "_t2_gho"} {
		var has bool
		if err := f.pg.QueryRow(f.ctx, "SELECT to_regclass($1) IS NOT NULL", `"`+db+`"."`+gone+`"`).Scan(&has); err != nil {
			t.Fatal(err)
		}
		if has {
			t.Errorf("the target still has %s.%s, renamed away in the source", db, gone)
		}
	}
	if s := dp.stderr.String(); strings.Contains(s, "level=ERROR") {
		t.Errorf("an error was logged:\n%s", grepLines(s, "level=ERROR"))
	}
	if code := dp.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(dp.stderr.String(), 20))
	}
}

// waitingForMDL reports whether a statement like pattern waits for a
// metadata lock on the source.
func (f *fixture) waitingForMDL(pattern string) bool {
	r, err := f.my.Execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'Waiting for table metadata lock' AND INFO LIKE ?", pattern)
	if err != nil {
		return false
	}
	n, _ := r.GetInt(0, 0)
	return n > 0
}
