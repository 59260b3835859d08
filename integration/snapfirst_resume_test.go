package integration

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// firstResumeRows is the size of the table whose first-run snapshot is
// killed: with 500-row chunks in two ranges it takes seconds.
const firstResumeRows = 240000

// TestFirstRunResumesAfterKill9 (issue 25 §1, "resumes from the last
// chunk, not from the start", for the first run): tidemark with no
// checkpoint snapshots big (240k rows, snapshot.parallelism 2) under a
// write load of inserts, updates, deletes and key changes, and is
// SIGKILLed once a third of big is in the target and its progress was
// recorded. While it is down, rows of both ranges that it had already
// copied are deleted at the source. The next start must resume each range
// after its recorded cursor with the same capture (it reads fewer rows
// than big holds, and says so), and big must then equal the source row by
// row: the deleted rows are gone although no key diff runs (the stream
// from the capture carries their deletes). Before, the next start redid
// the whole table.
func TestFirstRunResumesAfterKill9(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_frresume_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE big (id INT AUTO_INCREMENT PRIMARY KEY, v INT NOT NULL, pad VARCHAR(60) NOT NULL)",
		fmt.Sprintf("INSERT INTO big (id, v, pad) SELECT seq, seq, REPEAT('p', 50) FROM seq_1_to_%d", firstResumeRows),
		"CREATE TABLE small (id INT PRIMARY KEY, v INT NOT NULL)",
		"INSERT INTO small VALUES (1, 1)")
	// Progress every 100 ms: the default second is most of the whole
	// read on a fast machine (CI 2026-12-04: no cursor written between a
	// third and three quarters of big, killed then, and the next start
	// had nothing to resume).
	cfg := f.relConfig(t, db, db, relOpts{Extra: "fallback:\n  chunk_rows: 500\nsnapshot:\n  parallelism: 2\n  progress_every: 100ms\n"})
	stopLoad := snapLoad(t, f, db)
	loadStopped := false
	defer func() {
		if !loadStopped {
			stopLoad()
		}
	}()
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	target := func() int {
		var n int
		_ = f.pg.QueryRow(f.ctx, `SELECT count(*) FROM "`+db+`".big`).Scan(&n)
		return n
	}
	if !testenv.WaitFor(120*time.Second, func() bool { return d.exited() || target() >= firstResumeRows/3 }) || d.exited() {
		t.Fatalf("big's first-run snapshot did not get a third of its rows in:\n%s", tail(d.stderr.String(), 20))
	}
	// Kill once the progress was recorded again (at most every 100 ms),
	// or, by a version that records none, once three quarters of big are
	// in.
	cursor := func() string {
		var c string
		_ = f.pg.QueryRow(f.ctx, "SELECT snapshot_cursor FROM tidemark.tables WHERE source = $1 AND database = $1 AND table_name = 'big'", db).Scan(&c)
		return c
	}
	first := cursor()
	var recorded bool
	testenv.WaitFor(60*time.Second, func() bool {
		c := cursor()
		recorded = c != "" && c != first
		return recorded || target() >= 3*firstResumeRows/4 || d.exited()
	})
	held := target()
	d.kill()
	killed := d.stderr.String()
	if strings.Contains(killed, "catch-up finished") {
		t.Fatalf("the first run finished before the kill:\n%s", tail(killed, 10))
	}
	t.Logf("SIGKILL during the first-run snapshot: big's target held %d rows, progress recorded: %v", held, recorded)
	// Rows both ranges had copied are deleted (and some updated) while
	// tidemark is down.
	var lo, hi []string
	rows, err := f.pg.Query(f.ctx, `(SELECT id FROM "`+db+`".big WHERE id <= $1 ORDER BY id LIMIT 50) UNION ALL (SELECT id FROM "`+db+`".big WHERE id > $1 ORDER BY id LIMIT 50)`, firstResumeRows/2)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		if id <= firstResumeRows/2 {
			lo = append(lo, strconv.Itoa(id))
		} else {
			hi = append(hi, strconv.Itoa(id))
		}
	}
	rows.Close()
	if len(lo) == 0 || len(hi) == 0 {
		t.Fatalf("the killed run had not copied rows of both ranges (below the middle %d, above %d)", len(lo), len(hi))
	}
	ids := strings.Join(append(lo, hi...), ",")
	f.exec(t, "DELETE FROM "+db+".big WHERE id IN ("+ids+")",
		"UPDATE "+db+".big SET v = -v WHERE id IN (SELECT id FROM (SELECT id FROM "+db+".big WHERE id > 100 ORDER BY id LIMIT 20) x)")
	d = f.startDaemon(t, cfg)
	if !testenv.WaitFor(180*time.Second, func() bool { return d.exited() || strings.Contains(d.stderr.String(), "catch-up finished") }) || d.exited() {
		t.Fatalf("the restarted first run did not finish:\n%s", tail(d.stderr.String(), 20))
	}
	f.waitCaughtUp(t, db, d)
	stopLoad()
	loadStopped = true
	f.waitCaughtUp(t, db, d)
	f.stopOK(t, d)
	logs := d.stderr.String()
	var size int
	if err := f.pg.QueryRow(f.ctx, `SELECT count(*) FROM "`+db+`".big`).Scan(&size); err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`msg="table caught up"[^\n]*table=` + db + `\.big [^\n]*`).FindString(logs)
	m := regexp.MustCompile(` rows=(\d+)`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("no 'table caught up … rows=' line of big after the restart:\n%s", grepLines(logs, "catch"))
	}
	read, _ := strconv.Atoi(m[1])
	if !strings.Contains(logs, "resuming an interrupted first-run snapshot") || read >= size-firstResumeRows/4 {
		t.Fatalf("the restarted first run read %d rows of big's %d: it redid the table instead of resuming each range after its cursor:\n%s",
			read, size, grepLines(logs, "catch")+grepLines(logs, "first-run"))
	}
	t.Logf("after the kill the first run resumed: %d rows of big read of %d (%s)", read, size, line)
	if strings.Contains(line, "deletes=") {
		t.Errorf("the resumed table ran a key diff: the stream from the capture carries the deletes made while tidemark was down:\n%s", line)
	}
	for i, s := range []string{killed, logs} {
		if strings.Contains(s, "level=ERROR") || strings.Contains(s, "NOT captured") {
			t.Errorf("run %d logged an error:\n%s", i, grepLines(s, "level=ERROR")+grepLines(s, "NOT captured"))
		}
	}
	f.compare(t, harness.TableSpec{Database: db, Table: "big", SourceZone: "UTC"})
	f.compare(t, harness.TableSpec{Database: db, Table: "small", SourceZone: "UTC"})
}
