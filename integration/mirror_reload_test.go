package integration

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// A full read into a target that already holds the table with its mirrored
// unique constraint (nemesis seeds 695949095153 and 226860739659,
// docs/RELIABILITY.md): a first run repeated after the checkpoint was
// deleted reads the whole table again, one chunk per commit. Two rows that
// swapped their unique values at the source meanwhile (and a value moved
// to another row) land in different chunks: after the first chunk's commit
// the target holds the new value twice (the stale row is rewritten by a
// later chunk). That intermediate state must not quarantine the table: the
// load drops the mirrored unique constraints and builds them again after
// it, when the target equals the source. A target row the load did not
// rewrite (newer than the load, so the version guard keeps it) that
// violates the constraint must still quarantine the table, loudly, when the
// constraint is built again.

// reloadUniqueFixture loads t (a nullable UNIQUE column u) with soft
// deletes and mirrored indexes, stops the daemon, and returns the config
// after deleting the source's checkpoint: the next start is a first run
// again, over the loaded target.
func reloadUniqueFixture(t *testing.T, prefix, extra string) (*fixture, string, string) {
	t.Helper()
	f := newFixture(t)
	db := testenv.Name(prefix)
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE t (id INT PRIMARY KEY, u VARCHAR(20) NULL, v INT, UNIQUE KEY uq_u (u))",
		"INSERT INTO t SELECT seq, IF(seq % 10 = 0, NULL, CONCAT('u', seq)), seq FROM seq_1_to_200")
	cfg := f.configYAMLWith(t, db, db, db, "UTC", tidemark.Position{}, "fallback:\n  enabled: true\n  chunk_rows: 10\n"+extra)
	setYAML(t, cfg, "    schema: "+db+"\n", "    schema: "+db+"\n    delete_mode: soft\n")
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)
	f.compare(t, harness.TableSpec{Database: db, Table: "t", SourceZone: "UTC", SoftDelete: true})
	f.waitIndexes(t, db, "t", "t_uq_u")
	if !f.deferredUnique(t, "t_uq_u") {
		t.Fatalf("the first load did not build the mirrored unique constraint t_uq_u\n%s", grepLines(d.stderr.String(), "mirror"))
	}
	f.stopOK(t, d)
	if _, err := f.pg.Exec(f.ctx, "DELETE FROM tidemark.checkpoints WHERE source = $1", db); err != nil {
		t.Fatal(err)
	}
	return f, db, cfg
}

func TestFirstRunAgainOverMirroredUniqueIndex(t *testing.T) {
	f, db, cfg := reloadUniqueFixture(t, "it_uqreload_", "")
	// While the daemon is stopped (its binlog is not read again: the
	// checkpoint is gone and the start is a snapshot): ids 1 and 200 swap
	// their values (different chunks of 10), id 5's value moves to id 150,
	// id 7's to a new row 300 and id 7 is deleted.
	f.exec(t, "USE "+db,
		"BEGIN",
		"UPDATE t SET u = NULL WHERE id = 1",
		"UPDATE t SET u = 'u1' WHERE id = 200",
		"UPDATE t SET u = 'u200' WHERE id = 1",
		"UPDATE t SET u = NULL WHERE id = 5",
		"UPDATE t SET u = 'u5' WHERE id = 150",
		"DELETE FROM t WHERE id = 7",
		"INSERT INTO t VALUES (300, 'u7', 300)",
		"COMMIT")
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)
	if mode, reason := f.tableState(t, db, db, "t"); mode != "streaming" {
		t.Fatalf("t: state %q reason %q after the first run over the loaded target\n%s", mode, reason, grepLines(d.stderr.String(), "quarantine"))
	}
	f.compare(t, harness.TableSpec{Database: db, Table: "t", SourceZone: "UTC", SoftDelete: true})
	streamsWithUnique(t, f, db, d)
}

// moveDuringLoad waits until the load is held at id 50's chunk, moves
// id 5's value (chunk 1, already in) to id 190 (a later chunk) at the
// source, and lets the load go on.
func moveDuringLoad(t *testing.T, f *fixture, db string, d *daemonProc, loadHeld func() bool, releaseLoad func()) {
	t.Helper()
	if !testenv.WaitFor(120*time.Second, func() bool { return d.exited() || loadHeld() }) || d.exited() {
		t.Fatalf("the load did not reach id 50's chunk:\n%s", tail(d.stderr.String(), 20))
	}
	f.exec(t, "USE "+db, "BEGIN", "UPDATE t SET u = NULL WHERE id = 5", "UPDATE t SET u = 'u5' WHERE id = 190", "COMMIT")
	releaseLoad()
}

// endsStreamingWithUnique checks that t streams after when (caught up,
// equal to the source), then streamsWithUnique.
func endsStreamingWithUnique(t *testing.T, f *fixture, db string, d *daemonProc, when string) {
	t.Helper()
	f.waitCaughtUp(t, db, d)
	if mode, reason := f.tableState(t, db, db, "t"); mode != "streaming" {
		t.Fatalf("t: state %q reason %q after %s\n%s", mode, reason, when, grepLines(d.stderr.String(), "quarantine"))
	}
	f.compare(t, harness.TableSpec{Database: db, Table: "t", SourceZone: "UTC", SoftDelete: true})
	streamsWithUnique(t, f, db, d)
}

// streamsWithUnique waits for t's mirrored unique constraint t_uq_u
// (deferred), then streams a swap of two values in one transaction with
// it, and stops the daemon.
func streamsWithUnique(t *testing.T, f *fixture, db string, d *daemonProc) {
	t.Helper()
	if got := keys(f.waitIndexes(t, db, "t", "t_uq_u")); got != "t_uq_u" || !f.deferredUnique(t, "t_uq_u") {
		t.Fatalf("after the load: indexes %s, want the deferred unique constraint t_uq_u\n%s", got, grepLines(d.stderr.String(), "unique"))
	}
	f.exec(t, "USE "+db, "BEGIN", "UPDATE t SET u = NULL WHERE id = 2", "UPDATE t SET u = 'u2' WHERE id = 3", "UPDATE t SET u = 'u3' WHERE id = 2", "COMMIT")
	f.waitCaughtUp(t, db, d)
	f.compare(t, harness.TableSpec{Database: db, Table: "t", SourceZone: "UTC", SoftDelete: true})
	f.stopOK(t, d)
}

// quarantinedOnUnique waits until t is quarantined for its mirrored
// unique constraint t_uq_u and returns the reason.
func quarantinedOnUnique(t *testing.T, f *fixture, db string, d *daemonProc) string {
	t.Helper()
	f.waitCaughtUp(t, db, d)
	var mode, reason string
	testenv.WaitFor(30*time.Second, func() bool {
		mode, reason = f.tableState(t, db, db, "t")
		return mode == "quarantined"
	})
	if mode != "quarantined" || !strings.Contains(reason, `rows of the target violate the mirrored unique index "t_uq_u"`) {
		t.Fatalf("t: state %q reason %q, want quarantined naming t_uq_u\n%s", mode, reason, grepLines(d.stderr.String(), "quarantine")+grepLines(d.stderr.String(), "unique"))
	}
	return reason
}

// plantUniqueViolation makes a target row the load does not rewrite:
// newer than anything the source will stamp (the version guard keeps
// it), holding id 4's value. Made by hand with the constraint away (it
// refuses it otherwise).
func plantUniqueViolation(t *testing.T, f *fixture, db string) {
	t.Helper()
	for _, stmt := range []string{
		`ALTER TABLE "` + db + `".t DROP CONSTRAINT t_uq_u`,
		`UPDATE "` + db + `".t SET u = 'u4', _tm_seq = 9000000000000000000 WHERE id = 3`,
	} {
		if _, err := f.pg.Exec(f.ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
}

func TestFirstRunAgainKeepsRealUniqueViolation(t *testing.T) {
	f, db, cfg := reloadUniqueFixture(t, "it_uqreal_", "")
	// A target row the load does not rewrite: newer than anything the
	// source will stamp (the version guard keeps it), holding id 4's
	// value. Made by hand with the constraint away (it refuses it
	// otherwise).
	plantUniqueViolation(t, f, db)
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	// Judged at the load's end, or (something written meanwhile, here or
	// in another database) once the stream has passed the load.
	quarantinedOnUnique(t, f, db, d)
	f.stopOK(t, d)
}

// holdWrites makes every write of a row of db.t that satisfies cond (SQL
// on NEW) wait, in a trigger, for the advisory lock key, which it takes
// on a connection of its own: blocked reports whether a write waits,
// release lets them go. With arm the table does not exist yet: an event
// trigger puts the row trigger on it when the daemon creates it.
func holdWrites(t *testing.T, f *fixture, db, name, cond string, key int, arm bool) (blocked func() bool, release func()) {
	t.Helper()
	trigger := `CREATE TRIGGER ` + name + ` BEFORE INSERT OR UPDATE ON "` + db + `".t FOR EACH ROW EXECUTE FUNCTION "` + db + `".` + name + `()`
	stmts := []string{`CREATE FUNCTION "` + db + `".` + name + `() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
IF ` + cond + ` THEN PERFORM pg_advisory_xact_lock(` + strconv.Itoa(key) + `); END IF; RETURN NEW; END $$`}
	if arm {
		stmts = append([]string{`CREATE SCHEMA IF NOT EXISTS "` + db + `"`}, stmts...)
		stmts = append(stmts,
			`CREATE FUNCTION "`+db+`".arm_`+name+`() RETURNS event_trigger LANGUAGE plpgsql AS $$ BEGIN
IF EXISTS (SELECT 1 FROM pg_event_trigger_ddl_commands() WHERE command_tag = 'CREATE TABLE' AND object_identity = '`+db+`.t') THEN
EXECUTE '`+trigger+`'; END IF; END $$`,
			`CREATE EVENT TRIGGER arm_`+name+`_`+db+` ON ddl_command_end WHEN TAG IN ('CREATE TABLE') EXECUTE FUNCTION "`+db+`".arm_`+name+`()`)
		t.Cleanup(func() { _, _ = f.pg.Exec(f.ctx, `DROP EVENT TRIGGER IF EXISTS arm_`+name+`_`+db) })
	} else {
		stmts = append(stmts, trigger)
	}
	for _, stmt := range stmts {
		if _, err := f.pg.Exec(f.ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	hold, err := f.env.PG(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hold.Close(f.ctx) })
	var holder int
	if err := hold.QueryRow(f.ctx, `SELECT pg_backend_pid() FROM pg_advisory_lock(`+strconv.Itoa(key)+`)`).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	blocked = func() bool {
		var n int
		_ = f.pg.QueryRow(f.ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, holder).Scan(&n)
		return n > 0
	}
	release = func() {
		if _, err := hold.Exec(f.ctx, `SELECT pg_advisory_unlock(`+strconv.Itoa(key)+`)`); err != nil {
			t.Fatal(err)
		}
	}
	return blocked, release
}

// TestFirstRunJudgesUniqueAfterTheStream (nemesis 695949095153): a first
// run's chunks are read at different times — a run killed and resumed
// reads its remaining ranges long after the rows it had copied, and any
// chunked read of a live source spans time. Until the stream, which
// resumes at the run's capture, has applied the changes made during the
// load, the target holds rows from several read times: a state the
// source never had. Here the first run is held at id 50's chunk (a
// trigger on the new target table waits for a lock the test holds) while
// the source moves id 5's value (chunk 1, already in) to id 190 (a later
// chunk, read after the move): at the load's end the target holds u5
// twice until the stream applies the move. The unique constraint must
// wait for the stream, not judge the load's end.
func TestFirstRunJudgesUniqueAfterTheStream(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_uqfirst_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE t (id INT PRIMARY KEY, u VARCHAR(20) NULL, v INT, UNIQUE KEY uq_u (u))",
		"INSERT INTO t SELECT seq, IF(seq % 10 = 0, NULL, CONCAT('u', seq)), seq FROM seq_1_to_200")
	cfg := f.configYAMLWith(t, db, db, db, "UTC", tidemark.Position{}, "fallback:\n  enabled: true\n  chunk_rows: 10\nsnapshot:\n  parallelism: 1\n")
	setYAML(t, cfg, "    schema: "+db+"\n", "    schema: "+db+"\n    delete_mode: soft\n")
	loadHeld, releaseLoad := holdWrites(t, f, db, "hold_load", "NEW.id = 50", 695949095156, true)
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	moveDuringLoad(t, f, db, d, loadHeld, releaseLoad)
	endsStreamingWithUnique(t, f, db, d, "the first run")
}

// A load's chunks are read at different times (nemesis 695949095153: a
// first run killed twice and resumed, its ranges read long after the rows
// it had copied; the same holds for any chunked read of a live source):
// until the stream has applied the changes made during the load, the
// target holds rows from several read times, a state the source never
// had. Here the first run again is held at id 50's chunk (a trigger on the
// target waits for a lock the test holds) while the source moves id 5's
// value (chunk 1, already in) to id 190 (a later chunk, read after the
// move): at the load's end the target holds u5 twice until the stream
// applies the move. The unique constraint must wait for the stream, not
// judge the load's end; the stream's write of the move is held too, and a
// kill -9 then must leave the constraint waiting, built by the next
// process once its stream has passed the load.
func TestFirstRunAgainJudgesUniqueAfterTheStream(t *testing.T) {
	f, db, cfg := reloadUniqueFixture(t, "it_uqmixed_", "snapshot:\n  parallelism: 1\n")
	// id 50 differs from its target row: the load writes it.
	f.exec(t, "USE "+db, "UPDATE t SET v = -50 WHERE id = 50")
	loadHeld, releaseLoad := holdWrites(t, f, db, "hold_load", "NEW.id = 50", 695949095153, false)
	streamHeld, releaseStream := holdWrites(t, f, db, "hold_stream", "NEW.id = 5 AND NEW.u IS NULL", 695949095154, false)
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	moveDuringLoad(t, f, db, d, loadHeld, releaseLoad)
	quarantined := func() bool { mode, _ := f.tableState(t, db, db, "t"); return mode == "quarantined" }
	if !testenv.WaitFor(120*time.Second, func() bool { return d.exited() || streamHeld() || quarantined() }) || d.exited() {
		t.Fatalf("the stream did not reach the move of u5:\n%s", tail(d.stderr.String(), 20))
	}
	if mode, reason := f.tableState(t, db, db, "t"); mode != "streaming" {
		t.Fatalf("t: state %q reason %q after the first run over the loaded target\n%s", mode, reason, grepLines(d.stderr.String(), "quarantine"))
	}
	if f.deferredUnique(t, "t_uq_u") {
		t.Fatalf("t_uq_u was built before the stream applied the changes made during the load\n%s", grepLines(d.stderr.String(), "unique"))
	}
	d.kill()
	releaseStream()
	d = f.startDaemon(t, cfg)
	endsStreamingWithUnique(t, f, db, d, "the restart")
}

// A real violation left by a load whose constraints wait for the stream
// (something was written during the load) quarantines the table when the
// stream passes the load: the pipeline quarantines it although the batch
// that builds the constraint holds none of its rows.
func TestFirstRunAgainHeldUniqueKeepsRealViolation(t *testing.T) {
	f, db, cfg := reloadUniqueFixture(t, "it_uqheldreal_", "snapshot:\n  parallelism: 1\n")
	plantUniqueViolation(t, f, db)
	f.exec(t, "USE "+db, "UPDATE t SET v = -50 WHERE id = 50")
	loadHeld, releaseLoad := holdWrites(t, f, db, "hold_load", "NEW.id = 50", 695949095155, false)
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	if !testenv.WaitFor(120*time.Second, func() bool { return d.exited() || loadHeld() }) || d.exited() {
		t.Fatalf("the first run again did not reach id 50's chunk:\n%s", tail(d.stderr.String(), 20))
	}
	// Another table's write during the load: the high watermark is past
	// the capture, and the batch that passes it holds no row of t.
	f.exec(t, "USE "+db, "CREATE TABLE other (id INT PRIMARY KEY)", "INSERT INTO other VALUES (1)")
	releaseLoad()
	reason := quarantinedOnUnique(t, f, db, d)
	if !strings.Contains(reason, "high watermark") {
		t.Fatalf("t was not judged once the stream passed the load: reason %q\n%s", reason, grepLines(d.stderr.String(), "unique"))
	}
	f.stopOK(t, d)
}
