package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestFirstRunSnapshotColumnRenamed (nemesis seed 543902467764): a column
// of a table is renamed after the first-run snapshot read the table's
// layout and before its chunks are read. The chunks' SELECT named the
// columns of the layout read at the start, and the tailer stopped ("read
// ….a_big: query source: ERROR 1054 (42S22): Unknown column 'c4_text' in
// 'SELECT'"). The snapshot of that table must restart from its first chunk
// with the new layout (docs/SNAPSHOTS.md, a schema change during a
// snapshot), the other table go on, and both end equal to the source: the
// stream replays the RENAME and the changes after the capture.
//
// The window is made deterministic with a lock: the test holds LOCK
// TABLES a_big WRITE, so the snapshot (tables read at once, two workers)
// reads a_big's layout and then waits on its first statement on the table;
// the locking session renames the column (ALTER TABLE is allowed under its
// own write lock), writes a row, and unlocks.
//
// The second case adds a NOT NULL column with a default instead: the read
// raises no error then, but the sink's ensure of the new layout (from a
// range read after the ALTER) over the rows of the older one failed ("column
// \"z\" holds NULL in the target where the source declares NOT NULL") and,
// once the read restarted, failed again over the rows of the first read;
// the restart now drops the target table first when it held no rows before
// the run (every row in it is the first read's).
//
// Each case also writes a row in the older layout after the capture and
// before the ALTER (the locking session, first), so the stream brings rows
// of a layout older than the one the snapshot loaded (nemesis soak seed
// 537566202643: MODIFY COLUMN c1_bool TINYINT(1) → SMALLINT between a
// first run's capture and its read of the table; the stream's older rows
// then looked like a narrowing, "column \"c1_bool\": int(16 bits) → int(8
// bits) cannot be followed losslessly", and the table was quarantined).
// The widen case is that ALTER.
func TestFirstRunSnapshotColumnRenamed(t *testing.T) {
	for _, c := range firstRunColumnCases {
		t.Run(c.name, func(t *testing.T) { firstRunColumnChange(t, false, c.alter, c.insert, c.update) })
	}
}

// TestApplyFirstRunSnapshotColumnChanged is TestFirstRunSnapshotColumnRenamed
// in the scale-out topology (run → Kafka → apply → PostgreSQL): the
// snapshot's schema record must announce its layout with a version above
// the stream's rows of the older layout (nemesis soak seed 537566202643).
//
// In the widen case the first read's SELECT waits on the table's lock and
// runs after the MODIFY: its rows are of the new layout. Published with
// the older layout's schema, the appliers quarantined a_big ("convert
// value of ….a_big.v: 32-bit integer out of integer range"); the reader
// now checks each chunk's result types against the layout
// (ErrLayoutChanged: the read restarts), and the restarted read's layout
// is announced with its own version (tidemark.Table.Since), above the
// capture's, so the appliers evolve the target to it.
func TestApplyFirstRunSnapshotColumnChanged(t *testing.T) {
	for _, c := range firstRunColumnCases {
		t.Run(c.name, func(t *testing.T) { firstRunColumnChange(t, true, c.alter, c.insert, c.update) })
	}
}

var firstRunColumnCases = []struct{ name, alter, insert, update string }{
	{"rename", "RENAME COLUMN c4_text TO c4_new", "(2001, 'after', 2001)", "c4_new = 'updated'"},
	{"add_not_null", "ADD COLUMN z INT NOT NULL DEFAULT 7", "(2001, 'after', 2001, 8)", "z = 9"},
	{"widen", "MODIFY COLUMN v BIGINT NOT NULL", "(2001, 'after', 9000000001)", "v = 9000000000"},
}

func firstRunColumnChange(t *testing.T, apply bool, alter, insert, update string) {
	f := newFixture(t)
	var db, cfg string
	if apply {
		r, _ := f.newApplyRun(t, "it_frcolapply_", 537, 2, 50)
		db, cfg = r.db, r.cfg
	} else {
		db = testenv.Name("it_frcolren_")
		f.dropLater(t, db, db)
		f.exec(t, "CREATE DATABASE "+db)
	}
	f.forgetStates(t, db)
	f.exec(t, "USE "+db,
		"CREATE TABLE a_big (id INT PRIMARY KEY, c4_text VARCHAR(20) NOT NULL, v INT NOT NULL)",
		"CREATE TABLE b_small (id INT PRIMARY KEY, v VARCHAR(20) NOT NULL)",
		"INSERT INTO b_small VALUES (1, 'one'), (2, 'two'), (3, 'three')")
	var vals []string
	for i := 1; i <= 2000; i++ {
		vals = append(vals, fmt.Sprintf("(%d, 'text %d', %d)", i, i, i))
	}
	f.exec(t, "INSERT INTO "+db+".a_big VALUES "+strings.Join(vals, ","))
	lock, err := f.env.MySQL()
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := harness.Exec(lock, "LOCK TABLES "+db+".a_big WRITE"); err != nil {
		t.Fatal(err)
	}
	ps := &procSet{f: f, t: t}
	defer ps.killAll()
	if apply {
		firstRunConfig(t, cfg, 100)
		ps.start("apply", "--config", cfg)
	} else {
		d := f.daemon(db, db, db, "UTC", tidemark.Position{}, "snapshot:\n  parallelism: 2\nfallback:\n  enabled: true\n  chunk_rows: 100\n")
		cfg = d.Write(t)
	}
	dp := ps.start("run", "--config", cfg)
	if !testenv.WaitFor(60*time.Second, func() bool { return dp.exited() || f.waitingForMDL("SELECT %`"+db+"`.`a_big`%") }) || dp.exited() {
		t.Fatalf("the first-run snapshot did not wait for a_big:\n%s", tail(dp.stderr.String(), 20))
	}
	if err := harness.Exec(lock, "INSERT INTO "+db+".a_big VALUES (2002, 'older layout', 2002)", "UPDATE "+db+".a_big SET v = 77 WHERE id = 2",
		"ALTER TABLE "+db+".a_big "+alter,
		"INSERT INTO "+db+".a_big VALUES "+insert, "UNLOCK TABLES"); err != nil {
		t.Fatal(err)
	}
	f.exec(t, "UPDATE "+db+".a_big SET "+update+" WHERE id = 1", "INSERT INTO "+db+".b_small VALUES (4, 'four')")
	if !testenv.WaitFor(120*time.Second, func() bool {
		return dp.exited() || strings.Contains(dp.stderr.String(), "catch-up finished")
	}) || dp.exited() {
		t.Fatalf("the first-run snapshot did not finish:\n%s", grepLines(dp.stderr.String(), "level=ERROR")+tail(dp.stderr.String(), 10))
	}
	if !strings.Contains(grepLines(dp.stderr.String(), "restarting the snapshot of a table from its first chunk"), "table="+db+".a_big") {
		t.Errorf("the snapshot of a_big did not restart:\n%s", tail(dp.stderr.String(), 20))
	}
	for _, tb := range []string{"a_big", "b_small"} {
		ps.converge(harness.TableSpec{Database: db, Table: tb, SourceZone: "UTC"}, tb)
	}
	for _, p := range ps.procs {
		if s := p.stderr.String(); strings.Contains(s, "level=ERROR") {
			t.Errorf("an error was logged:\n%s", grepLines(s, "level=ERROR"))
		}
	}
	if code := dp.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(dp.stderr.String(), 20))
	}
}
