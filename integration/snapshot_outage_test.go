package integration

import (
	"strings"
	"testing"
	"time"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestSourceOutageDuringFirstSnapshot (nemesis seed 26): the source is
// unreachable for 5 s — a MariaDB restart, a failover behind a fixed
// address — while tidemark takes its first-run snapshot. The snapshot's
// reads must wait for the source as the stream does, and end with the
// table equal to the source; the daemon must not stop (it stopped with
// "initial snapshot of …: catch up …: query source: … connection reset"
// after five attempts within about a second).
func TestSourceOutageDuringFirstSnapshot(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_snapout_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE big (id INT AUTO_INCREMENT PRIMARY KEY, v INT NOT NULL, pad VARCHAR(60) NOT NULL)",
		"INSERT INTO big (id, v, pad) SELECT seq, seq, REPEAT('p', 50) FROM seq_1_to_100000")
	myP, err := harness.NewFaultProxy("mariadb-snapout", f.env.MySQLAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(myP.Close)
	cfg := f.relConfig(t, db, db, relOpts{Addr: myP.Addr, Extra: "fallback:\n  chunk_rows: 500\n"})
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	if !testenv.WaitFor(30*time.Second, func() bool { return d.exited() || strings.Contains(d.stderr.String(), "catch-up started") }) || d.exited() {
		t.Fatalf("the snapshot did not start:\n%s", tail(d.stderr.String(), 20))
	}
	time.Sleep(100 * time.Millisecond)
	if strings.Contains(d.stderr.String(), "catch-up finished") {
		t.Fatalf("the snapshot finished before the outage:\n%s", tail(d.stderr.String(), 10))
	}
	// Every connection, open or new, is reset for 5 s.
	mustAdd(t, myP, harness.Toxic{Name: "down", Type: "reset_peer", Attributes: map[string]any{"timeout": 0}})
	if err := myP.ResetAll(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	if err := myP.Remove("down"); err != nil {
		t.Fatal(err)
	}
	if d.exited() {
		t.Fatalf("the daemon stopped during a 5 s source outage in its first-run snapshot:\n%s", grepLines(d.stderr.String(), "level=ERROR"))
	}
	f.exec(t, "UPDATE "+db+".big SET v = v + 1 WHERE id <= 10", "DELETE FROM "+db+".big WHERE id BETWEEN 11 AND 20")
	f.waitCaughtUp(t, db, d)
	f.stopOK(t, d)
	if s := d.stderr.String(); strings.Contains(s, "level=ERROR") {
		t.Errorf("an error was logged:\n%s", grepLines(s, "level=ERROR"))
	}
	f.compare(t, harness.TableSpec{Database: db, Table: "big", SourceZone: "UTC"})
}
