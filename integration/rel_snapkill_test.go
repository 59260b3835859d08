package integration

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestKillNineDuringFirstSnapshot (issue 22 §1b): tidemark with no
// checkpoint snapshots a 200k-row table under a light write load (inserts,
// updates and deletes, the deletes among the rows a snapshot copies first)
// and is SIGKILLed three times during its first-run snapshot, then left
// running. The interrupted first snapshot must end exactly like an
// uninterrupted one: no row deleted at the source stays in the target
// (with delete_detection unset), and no WARN admits missed deletes.
func TestKillNineDuringFirstSnapshot(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_snapkill_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE big (id INT AUTO_INCREMENT PRIMARY KEY, v INT NOT NULL, pad VARCHAR(60) NOT NULL)",
		"INSERT INTO big (id, v, pad) SELECT seq, seq, REPEAT('p', 50) FROM seq_1_to_200000")
	cfg := f.relConfig(t, db, db, relOpts{Extra: "fallback:\n  chunk_rows: 1000\n"})

	// The load: its own connection, a write every few milliseconds.
	var deletes int
	stopLoad := writeLoad(t, f, rand.New(rand.NewPCG(7, 8)), 3*time.Millisecond, func(i int, rnd *rand.Rand) string {
		switch i % 3 {
		case 0:
			deletes++
			return fmt.Sprintf("DELETE FROM %s.big WHERE id = %d", db, 1+rnd.IntN(60000))
		case 1:
			return fmt.Sprintf("UPDATE %s.big SET v = v + 1 WHERE id = %d", db, 1+rnd.IntN(150000))
		default:
			return fmt.Sprintf("INSERT INTO %s.big (v, pad) VALUES (%d, 'new')", db, i)
		}
	})
	logs := f.killDuringFirstRun(t, cfg, db, "catch-up started", 60, `SELECT count(*) FROM "`+db+`".big`, stopLoad)
	if strings.Contains(logs, "NOT captured") || strings.Contains(logs, "level=ERROR") {
		t.Errorf("a log line admits lost deletes or an error:\n%s", grepLines(logs, "NOT captured")+grepLines(logs, "level=ERROR"))
	}
	t.Logf("%d deletes in the load", deletes)
	// The table's target was empty: the first run loaded it before its
	// primary key, which the resumed run built after the load, removing
	// the rows of chunks applied again after a kill (sink/postgres
	// keyafter.go).
	if !strings.Contains(logs, "built the primary key of a table after its first load") {
		t.Errorf("the first run did not build big's primary key after its load:\n%s", grepLines(logs, "primary key"))
	}
	t.Logf("key after the load: %s", grepLines(logs, "a key loaded twice"))
	f.compare(t, harness.TableSpec{Database: db, Table: "big", SourceZone: "UTC"})
	var key string
	if err := f.pg.QueryRow(f.ctx, `SELECT string_agg(a.attname, ',') FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey::int2[])
WHERE i.indrelid = $1::regclass AND i.indisprimary`, `"`+db+`".big`).Scan(&key); err != nil || key != "id" {
		t.Errorf("big's target primary key = %q (%v), want id", key, err)
	}
}

// killDuringFirstRun starts the daemon with cfg three times and SIGKILLs
// it each time during its first run: after the log line marker and
// another minDelay to minDelay+150 ms; count (SQL on the target) says how
// many rows were in after each kill. Then it starts it once more and lets
// it catch up with source (checkpoint name) db, stops the write load
// (stopLoad), lets it catch up again and stops it. It returns the
// daemons' logs.
func (f *fixture) killDuringFirstRun(t *testing.T, cfg, db, marker string, minDelay int, count string, stopLoad func()) string {
	t.Helper()
	var logs strings.Builder
	for kills := 0; kills < 3; kills++ {
		d := f.startDaemon(t, cfg)
		if !testenv.WaitFor(30*time.Second, func() bool { return d.exited() || strings.Contains(d.stderr.String(), marker) }) || d.exited() {
			d.kill()
			t.Fatalf("the first run did not log %q:\n%s", marker, tail(d.stderr.String(), 20))
		}
		time.Sleep(time.Duration(minDelay+rand.IntN(150)) * time.Millisecond)
		done := strings.Contains(d.stderr.String(), "catch-up finished")
		d.kill()
		logs.WriteString(d.stderr.String())
		if done {
			t.Fatalf("run %d finished its first run before the kill:\n%s", kills, tail(d.stderr.String(), 10))
		}
		var n int
		_ = f.pg.QueryRow(f.ctx, count).Scan(&n)
		t.Logf("kill %d: SIGKILL during the first run, %d target rows", kills, n)
	}
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)
	time.Sleep(500 * time.Millisecond)
	stopLoad()
	f.waitCaughtUp(t, db, d)
	f.stopOK(t, d)
	return logs.String() + d.stderr.String()
}

// TestKillNineDuringFirstSnapshotOfTables (issue 25 §2, tables in
// parallel at a first run): with snapshot.parallelism 2 the first run
// reads several tables at once (one of them a table without a key, which
// it quarantines while the others go on), under a write load on every
// table, and is SIGKILLed three times during it, then left running. Every
// followable table must end equal to the source row by row, and the
// table without a key quarantined, naming why.
func TestKillNineDuringFirstSnapshotOfTables(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_snapkilltabs_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	sizes := map[string]int{"a": 80000, "b": 80000, "c": 20000, "d": 3000}
	sqls := []string{"CREATE DATABASE " + db, "USE " + db,
		"CREATE TABLE nokey (v INT NOT NULL)", "INSERT INTO nokey SELECT seq FROM seq_1_to_100"}
	for _, name := range []string{"a", "b", "c", "d"} {
		sqls = append(sqls, "CREATE TABLE "+name+" (id INT AUTO_INCREMENT PRIMARY KEY, v INT NOT NULL, pad VARCHAR(60) NOT NULL, KEY v (v))",
			fmt.Sprintf("INSERT INTO %s (id, v, pad) SELECT seq, seq, REPEAT('p', 50) FROM seq_1_to_%d", name, sizes[name]))
	}
	f.exec(t, sqls...)
	cfg := f.relConfig(t, db, db, relOpts{Extra: "fallback:\n  chunk_rows: 1000\nsnapshot:\n  parallelism: 2\n"})

	stopLoad := writeLoad(t, f, rand.New(rand.NewPCG(9, 10)), 3*time.Millisecond, func(i int, rnd *rand.Rand) string {
		name := []string{"a", "b", "c", "d"}[i%4]
		switch (i / 4) % 3 {
		case 0:
			return fmt.Sprintf("DELETE FROM %s.%s WHERE id = %d", db, name, 1+rnd.IntN(sizes[name]/2))
		case 1:
			return fmt.Sprintf("UPDATE %s.%s SET v = v + 1 WHERE id = %d", db, name, 1+rnd.IntN(sizes[name]))
		default:
			return fmt.Sprintf("INSERT INTO %s.%s (v, pad) VALUES (%d, 'new')", db, name, i)
		}
	})
	s := f.killDuringFirstRun(t, cfg, db, "catch-up reads tables at once", 100, `SELECT (SELECT count(*) FROM "`+db+`".a) + (SELECT count(*) FROM "`+db+`".b)`, stopLoad)
	if !strings.Contains(s, "catch-up reads tables at once") || !strings.Contains(s, "workers=2") {
		t.Fatalf("the first run did not read the tables at once:\n%s", grepLines(s, "catch-up"))
	}
	if strings.Contains(s, "NOT captured") {
		t.Errorf("a log line admits lost deletes:\n%s", grepLines(s, "NOT captured"))
	}
	for _, l := range strings.Split(grepLines(s, "level=ERROR"), "\n") {
		if l != "" && !strings.Contains(l, "table="+db+".nokey") {
			t.Errorf("an error other than nokey's quarantine: %s", l)
		}
	}
	if mode, reason := f.tableState(t, db, db, "nokey"); mode != "quarantined" || reason == "" {
		t.Errorf("nokey is %q (%s), want quarantined with a reason", mode, reason)
	}
	for _, name := range []string{"a", "b", "c", "d"} {
		f.compare(t, harness.TableSpec{Database: db, Table: name, SourceZone: "UTC"})
	}
}
