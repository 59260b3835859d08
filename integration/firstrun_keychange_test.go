package integration

import (
	"testing"
	"time"

	"tidemark"
	"tidemark/internal/testenv"
)

// TestFirstRunResumedAfterKeyChange (nemesis soak seed 343743032218): a
// first run reads table k (primary key (a, b)) to its end, and is killed
// while it reads t. While no daemon runs, k is dropped and created again
// with another key (id) and other rows. The resumed run reads k again in
// full (its recorded key is not the table's), into the target table the
// interrupted run made with the old key: the sink refused the changed
// business key and k was quarantined ("business key changed from (a, b)
// to (id)"), though every row of that target was the run's own. The
// resumed run must drop it and load the new k from empty; the stream,
// from the run's capture, then replays the DROP and CREATE (ddl.drop_table:
// apply) and what follows, and both tables end equal to the source.
func TestFirstRunResumedAfterKeyChange(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_frkey_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE k (a INT NOT NULL, b INT NOT NULL, v INT, PRIMARY KEY (a, b))",
		"INSERT INTO k SELECT seq, seq % 7, seq FROM seq_1_to_50",
		"CREATE TABLE t (id INT PRIMARY KEY, v INT)",
		"INSERT INTO t SELECT seq, seq FROM seq_1_to_200")
	cfg := f.configYAMLWith(t, db, db, db, "UTC", tidemark.Position{}, "fallback:\n  enabled: true\n  chunk_rows: 10\n  tables:\n    "+db+".k: {delete_detection: keydiff}\n    "+db+".t: {delete_detection: keydiff}\nsnapshot:\n  parallelism: 1\n")
	setYAML(t, cfg, "    schema: "+db+"\n", "    schema: "+db+"\n    ddl: {drop_table: apply}\n")
	loadHeld, releaseLoad := holdWrites(t, f, db, "hold_load", "NEW.id = 50", 343743, true)
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	kDone := func() bool {
		var n int
		_ = f.pg.QueryRow(f.ctx, `SELECT count(*) FROM tidemark.tables WHERE source = $1 AND database = $1 AND table_name = 'k' AND snapshot_cursor LIKE '%"done":true%'`, db).Scan(&n)
		return n == 1
	}
	if !testenv.WaitFor(120*time.Second, func() bool { return d.exited() || loadHeld() && kDone() }) || d.exited() {
		t.Fatalf("the first run did not read k to its end and reach t's id 50:\n%s", tail(d.stderr.String(), 20))
	}
	d.kill()
	releaseLoad()
	f.exec(t, "USE "+db,
		"DROP TABLE k",
		"CREATE TABLE k (id INT PRIMARY KEY, u INT NULL, v INT, UNIQUE KEY (u))",
		"INSERT INTO k SELECT seq, IF(seq % 5 = 0, NULL, seq), seq FROM seq_1_to_30",
		"UPDATE t SET v = -v WHERE id = 120")
	d = f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	f.exec(t, "USE "+db, "UPDATE k SET v = 0 WHERE id = 3", "DELETE FROM k WHERE id = 4")
	f.waitCaughtUp(t, db, d)
	f.streamingAndEqual(t, d, db, "k", "t")
	f.stopOK(t, d)
}
