package integration

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
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
	load, err := f.env.MySQL()
	if err != nil {
		t.Fatal(err)
	}
	defer load.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var loadErr error
	var deletes int
	wg.Add(1)
	go func() {
		defer wg.Done()
		rnd := rand.New(rand.NewPCG(7, 8))
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			var q string
			switch i % 3 {
			case 0:
				q = fmt.Sprintf("DELETE FROM %s.big WHERE id = %d", db, 1+rnd.IntN(60000))
				deletes++
			case 1:
				q = fmt.Sprintf("UPDATE %s.big SET v = v + 1 WHERE id = %d", db, 1+rnd.IntN(150000))
			default:
				q = fmt.Sprintf("INSERT INTO %s.big (v, pad) VALUES (%d, 'new')", db, i)
			}
			if _, err := load.Execute(q); err != nil {
				loadErr = err
				return
			}
			time.Sleep(3 * time.Millisecond)
		}
	}()

	var logs strings.Builder
	kills := 0
	for kills < 3 {
		d := f.startDaemon(t, cfg)
		if !testenv.WaitFor(30*time.Second, func() bool { return d.exited() || strings.Contains(d.stderr.String(), "catch-up started") }) || d.exited() {
			d.kill()
			t.Fatalf("the snapshot did not start:\n%s", tail(d.stderr.String(), 20))
		}
		time.Sleep(time.Duration(60+rand.IntN(150)) * time.Millisecond)
		done := strings.Contains(d.stderr.String(), "catch-up finished")
		d.kill()
		logs.WriteString(d.stderr.String())
		if done {
			t.Fatalf("run %d finished its snapshot before the kill:\n%s", kills, tail(d.stderr.String(), 10))
		}
		var n int
		_ = f.pg.QueryRow(f.ctx, `SELECT count(*) FROM "`+db+`".big`).Scan(&n)
		t.Logf("kill %d: SIGKILL during the first-run snapshot, %d target rows", kills, n)
		kills++
	}
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	if loadErr != nil {
		t.Fatal(loadErr)
	}
	f.waitCaughtUp(t, db, d)
	f.stopOK(t, d)
	logs.WriteString(d.stderr.String())
	if s := logs.String(); strings.Contains(s, "NOT captured") || strings.Contains(s, "level=ERROR") {
		t.Errorf("a log line admits lost deletes or an error:\n%s", grepLines(s, "NOT captured")+grepLines(s, "level=ERROR"))
	}
	t.Logf("%d deletes in the load", deletes)
	f.compare(t, harness.TableSpec{Database: db, Table: "big", SourceZone: "UTC"})
}
