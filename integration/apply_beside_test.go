package integration

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// Snapshots beside the stream with Kafka (docs/SNAPSHOTS.md "With
// Kafka"): in the scale-out topology the tailer reads a resynced table in
// key-range chunks between its stream batches, publishing each chunk
// (filtered against the table's changes newer than the chunk's capture)
// between the table's snapshot_begin and snapshot_end records, so the
// other tables keep reaching the appliers; the end removes the rows older
// than the first chunk's version. The fan-out (PostgreSQL + Kafka) does
// the same into both targets.

// besideTopology creates big (snapBigRows rows) and small in a scale-out
// run (4 partitions), starts the tailer and two appliers and waits until
// the target holds both tables.
func besideTopology(t *testing.T, tag string, seed uint64) (*fixture, *kafkaRun, *procSet) {
	t.Helper()
	f := newFixture(t)
	r, _ := f.newApplyRun(t, tag, seed, 4, 5000)
	f.forgetStates(t, r.db)
	appendYAML(t, r.cfg, fmt.Sprintf("fallback:\n  chunk_rows: %d\n", snapChunkRows))
	f.exec(t, "USE "+r.db,
		"CREATE TABLE big (id INT AUTO_INCREMENT PRIMARY KEY, v INT NOT NULL, pad VARCHAR(60) NOT NULL)",
		fmt.Sprintf("INSERT INTO big (id, v, pad) SELECT seq, seq, REPEAT('p', 50) FROM seq_1_to_%d", snapBigRows),
		"CREATE TABLE small (id INT PRIMARY KEY, v INT NOT NULL)",
		"INSERT INTO small VALUES (1, 1)")
	ps := &procSet{f: f, t: t}
	for _, args := range [][]string{{"run", "--config", r.cfg}, {"apply", "--config", r.cfg}, {"apply", "--config", r.cfg}} {
		ps.start(args...)
	}
	ps.converge(harness.TableSpec{Database: r.db, Table: "big", SourceZone: "UTC"}, "big streamed")
	ps.converge(harness.TableSpec{Database: r.db, Table: "small", SourceZone: "UTC"}, "small streamed")
	return f, r, ps
}

// appendYAML appends top-level sections to a config file.
func appendYAML(t *testing.T, cfgPath, more string) {
	t.Helper()
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, append(b, []byte("\n"+more)...), 0o600); err != nil {
		t.Fatal(err)
	}
}

// besideResync starts the write load on big and asks the tailer to resync
// it; it returns once big is snapshotting, with the load's stop.
func (f *fixture) besideResync(t *testing.T, tailer *daemonProc, r *kafkaRun) (stopLoad func()) {
	t.Helper()
	stopLoad = snapLoad(t, f, r.db)
	f.waitState(t, tailer, r.db, r.db, "big", "streaming")
	f.requestResync(t, r.cfg, r.db+".big")
	f.waitState(t, tailer, r.db, r.db, "big", "snapshotting")
	return stopLoad
}

// smallWhileBigSnapshots writes row 2 of small and fails the test unless
// the target table db.small (PostgreSQL schema db) has it while big is
// still snapshotting: the stream did not wait for big's snapshot. small's
// row is looked at first, then big's state, so a row seen with big still
// snapshotting was applied during the snapshot (big turns streaming once
// and stays).
func (f *fixture) smallWhileBigSnapshots(t *testing.T, d *daemonProc, db string) {
	t.Helper()
	f.exec(t, "INSERT INTO "+db+".small VALUES (2, 42)")
	var seen bool
	var state string
	if !testenv.WaitFor(120*time.Second, func() bool {
		var n int
		_ = f.pg.QueryRow(f.ctx, `SELECT count(*) FROM "`+db+`".small WHERE id = 2`).Scan(&n)
		state, _ = f.tableState(t, db, db, "big")
		seen = n == 1
		return seen || state != "snapshotting" || d.exited()
	}) {
		t.Fatalf("neither small's row nor the end of big's snapshot in 120 s:\n%s", tail(d.stderr.String(), 20))
	}
	if !seen || state != "snapshotting" {
		t.Fatalf("small's row was not in the target while big was snapshotting (big is %q, row seen: %v): the stream waited for the snapshot\n%s",
			state, seen, tail(d.stderr.String(), 10))
	}
}

// besideEnd waits for big to stream again, stops the load and waits until
// both tables equal the source row by row; no process logged an ERROR.
// It returns the tailer's log.
func besideEnd(t *testing.T, f *fixture, r *kafkaRun, ps *procSet, tailer *daemonProc, stopLoad func()) string {
	t.Helper()
	f.waitSnapshotEnd(t, tailer, r.db)
	stopLoad()
	ps.converge(harness.TableSpec{Database: r.db, Table: "big", SourceZone: "UTC"}, "big after its resync")
	ps.converge(harness.TableSpec{Database: r.db, Table: "small", SourceZone: "UTC"}, "small after big's resync")
	for i, d := range ps.procs {
		if l := grepLines(d.stderr.String(), "level=ERROR"); l != "" {
			t.Errorf("process %d logged an error:\n%s", i, l)
		}
	}
	logs := tailer.stderr.String()
	t.Log(grepLines(logs, "table snapshotted"))
	return logs
}

// snapshottedChunks returns rows_read and chunks of the last "table
// snapshotted" line of a log with a chunk count (a snapshot beside the
// stream).
func snapshottedChunks(t *testing.T, logs string) (read, chunks int) {
	t.Helper()
	all := regexp.MustCompile(`msg="table snapshotted[^\n]*rows_read=(\d+)[^\n]*chunks=(\d+)`).FindAllStringSubmatch(logs, -1)
	if len(all) == 0 {
		t.Fatalf("no 'table snapshotted … rows_read= … chunks=' line (a snapshot beside the stream):\n%s", grepLines(logs, "snapshot"))
	}
	m := all[len(all)-1]
	read, _ = strconv.Atoi(m[1])
	chunks, _ = strconv.Atoi(m[2])
	return read, chunks
}

// TestApplySnapshotBesideStream: in the scale-out topology (tailer, two
// appliers, 4 partitions) a resync of big (hundreds of chunks, under
// inserts, updates, deletes and key changes) runs beside the stream: a row
// written to small after the snapshot started reaches the appliers'
// target while big is still snapshotting; both tables then equal the
// source row by row. Before, the tailer's resync ran inside its apply loop
// (Resnapshot between the boundaries) and small's row waited for it.
func TestApplySnapshotBesideStream(t *testing.T) {
	f, r, ps := besideTopology(t, "it_applybeside_", 251)
	defer ps.killAll()
	tailer := ps.procs[0]
	stopLoad := f.besideResync(t, tailer, r)
	f.smallWhileBigSnapshots(t, tailer, r.db)
	logs := besideEnd(t, f, r, ps, tailer, stopLoad)
	if _, chunks := snapshottedChunks(t, logs); chunks < 10 {
		t.Fatalf("big's resync landed in %d chunks: not read beside the stream", chunks)
	}
	if n := ps.count(1, "snapshot of a table ends on the partition"); n < 4 {
		t.Fatalf("%d partitions applied big's snapshot end, want every one of 4", n)
	}
}

// cursorProgress returns how many keys of big a recorded snapshot cursor
// has passed (its ranges' progress over the integer key; a done range
// counts whole), and the state.
func (f *fixture) cursorProgress(t *testing.T, source string) (int64, string) {
	t.Helper()
	var c, m string
	_ = f.pg.QueryRow(f.ctx, "SELECT coalesce(snapshot_cursor, ''), state FROM tidemark.tables WHERE source = $1 AND database = $1 AND table_name = 'big'", source).Scan(&c, &m)
	rs, err := tidemark.DecodeRanges(c)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	num := func(v []any, dflt int64) int64 {
		if len(v) == 0 {
			return dflt
		}
		switch x := v[0].(type) {
		case int64:
			return x
		case uint64:
			return int64(x)
		}
		return dflt
	}
	for _, rg := range rs {
		from := num(rg.From, 0)
		switch {
		case rg.Done:
			n += num(rg.To, snapBigRows) - from
		case rg.After != nil:
			n += num(rg.After, from) - from
		}
	}
	return n, m
}

// waitSnapshotProgress waits until big's recorded snapshot progress
// (cursorProgress) has passed n keys while big is still snapshotting, and
// returns it.
func (f *fixture) waitSnapshotProgress(t *testing.T, d *daemonProc, source string, n int64) int64 {
	t.Helper()
	var done int64
	var m string
	if !testenv.WaitFor(120*time.Second, func() bool {
		done, m = f.cursorProgress(t, source)
		return done >= n || m != "snapshotting" || d.exited()
	}) || m != "snapshotting" {
		t.Fatalf("big (%q) recorded %d keys of snapshot progress, want %d:\n%s", m, done, n, tail(d.stderr.String(), 20))
	}
	return done
}

// TestApplySnapshotResumesAfterKill9: the tailer is killed (SIGKILL) in
// the middle of big's resync beside the stream, once its recorded progress
// passed a third of big; the next tailer resumes after the recorded chunks
// (it reads fewer rows than big holds and says so) and both tables then
// equal the source row by row at the appliers.
func TestApplySnapshotResumesAfterKill9(t *testing.T) {
	f, r, ps := besideTopology(t, "it_applybesidekill_", 252)
	defer ps.killAll()
	tailer := ps.procs[0]
	stopLoad := f.besideResync(t, tailer, r)
	done := f.waitSnapshotProgress(t, tailer, r.db, snapBigRows/3)
	tailer.kill()
	t.Logf("tailer killed with %d keys of big's snapshot recorded", done)
	tailer = f.startCommand(t, []string{"run", "--config", r.cfg})
	ps.procs[0] = tailer
	logs := besideEnd(t, f, r, ps, tailer, stopLoad)
	read, _ := snapshottedChunks(t, logs)
	var total int
	if err := f.pg.QueryRow(f.ctx, `SELECT count(*) FROM "`+r.db+`".big`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs, "resuming an interrupted snapshot") || read >= total-snapBigRows/4 {
		t.Fatalf("the restarted tailer read %d rows of %d and did not resume after the last chunk:\n%s", read, total, grepLines(logs, "snapshot"))
	}
	t.Logf("after the kill the snapshot resumed: %d rows read of %d", read, total)
}

// TestApplySnapshotRestartsOnSchemaChange: an ALTER TABLE of big during
// its resync beside the stream (under the write load) restarts the
// snapshot from its first chunk with a WARN; the appliers' big then
// equals the source row by row, new column included.
func TestApplySnapshotRestartsOnSchemaChange(t *testing.T) {
	f, r, ps := besideTopology(t, "it_applybesideddl_", 253)
	defer ps.killAll()
	tailer := ps.procs[0]
	stopLoad := f.besideResync(t, tailer, r)
	f.waitSnapshotProgress(t, tailer, r.db, snapBigRows/5)
	f.exec(t, "ALTER TABLE "+r.db+".big ADD COLUMN note VARCHAR(10) NULL")
	f.exec(t, "UPDATE "+r.db+".big SET note = 'after' WHERE id <= 100")
	logs := besideEnd(t, f, r, ps, tailer, stopLoad)
	if l := grepLines(logs, "restarting the snapshot of a table from its first chunk"); !strings.Contains(l, "level=WARN") || !strings.Contains(l, r.db+".big") {
		t.Fatalf("the ALTER during big's snapshot did not restart it loudly:\n%s", grepLines(logs, "snapshot"))
	}
}

// TestFanoutSnapshotBesideStream: `tidemark run` into PostgreSQL and Kafka
// (control records on) resyncs big beside the stream under the write
// load: a row written to small after the snapshot started is in
// PostgreSQL while big is still snapshotting. PostgreSQL then equals the
// source row by row, and so does a `tidemark apply` group that reads the
// fan-out's topics into a schema of its own (the chunks and the snapshot
// boundaries as Kafka carried them). Before, a resync with target.kafka
// ran inside the apply loop and small's row waited for it.
func TestFanoutSnapshotBesideStream(t *testing.T) {
	f := newFixture(t)
	r := f.newKafkaRun(t, "it_fanbeside_", 254, fmt.Sprintf("fallback:\n  chunk_rows: %d\n", snapChunkRows))
	f.forgetStates(t, r.db)
	setYAML(t, r.cfg, "    tombstones: true\n", "    tombstones: true\n    control_records: true\n")
	kschema := r.db + "_k"
	f.dropLater(t, kschema)
	group := testenv.Name("it_fanbeside_group_")
	t.Cleanup(func() {
		_, _ = f.pg.Exec(f.ctx, "DELETE FROM tidemark.stream_offsets WHERE consumer_group = $1", group)
	})
	applyCfg := f.configYAMLWith(t, r.db, r.db, kschema, "UTC", r.start, fmt.Sprintf("dedupe:\n  enabled: false\napply:\n  group: %s\n  max_records: 5000\n", group))
	addKafka(t, applyCfg, r.brokers, r.prefix)
	f.exec(t, "USE "+r.db,
		"CREATE TABLE big (id INT AUTO_INCREMENT PRIMARY KEY, v INT NOT NULL, pad VARCHAR(60) NOT NULL)",
		fmt.Sprintf("INSERT INTO big (id, v, pad) SELECT seq, seq, REPEAT('p', 50) FROM seq_1_to_%d", snapBigRows),
		"CREATE TABLE small (id INT PRIMARY KEY, v INT NOT NULL)",
		"INSERT INTO small VALUES (1, 1)")
	ps := &procSet{f: f, t: t}
	defer ps.killAll()
	d := ps.start("run", "--config", r.cfg)
	ps.start("apply", "--config", applyCfg)
	f.waitCaughtUp(t, r.db, d)
	stopLoad := snapLoad(t, f, r.db)
	f.waitState(t, d, r.db, r.db, "big", "streaming")
	f.requestResync(t, r.cfg, r.db+".big")
	f.waitState(t, d, r.db, r.db, "big", "snapshotting")
	f.smallWhileBigSnapshots(t, d, r.db)
	f.waitSnapshotEnd(t, d, r.db)
	stopLoad()
	for _, tb := range []string{"big", "small"} {
		ps.converge(harness.TableSpec{Database: r.db, Table: tb, SourceZone: "UTC"}, "PostgreSQL's "+tb+" after big's resync")
		ps.converge(harness.TableSpec{Database: r.db, Table: tb, TargetSchema: kschema, SourceZone: "UTC"}, "the appliers' "+tb+" after big's resync")
	}
	for i, p := range ps.procs {
		if l := grepLines(p.stderr.String(), "level=ERROR"); l != "" {
			t.Errorf("process %d logged an error:\n%s", i, l)
		}
	}
	if _, chunks := snapshottedChunks(t, d.stderr.String()); chunks < 10 {
		t.Fatalf("big's resync landed in %d chunks: not read beside the stream", chunks)
	}
	if n := ps.count(1, "snapshot of a table ends on the partition"); n < 1 {
		t.Fatalf("the applier saw no end of big's snapshot")
	}
}
