package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestApplyKillNineDuringFirstSnapshot is issue 22 §1b in the scale-out
// topology (nemesis seed 193): the tailer (no checkpoint, the fallback
// on) is SIGKILLed inside its first-run snapshot after an applier wrote
// the first rows of the table, the source deletes 100 of them while the
// tailer is down, and a new tailer runs the first snapshot again. The
// interrupted snapshot must end exactly like an uninterrupted one: the
// target has no key diff in this topology, so the deleted rows must go
// another way (they stayed live, and the only sign was WARN "hard deletes
// made while the binlog was unavailable were NOT captured").
func TestApplyKillNineDuringFirstSnapshot(t *testing.T) {
	f := newFixture(t)
	r, _ := f.newApplyRun(t, "it_applysnapkill_", 193, 4, 500)
	f.forgetStates(t, r.db)
	f.exec(t, "CREATE TABLE "+r.db+".big (id INT AUTO_INCREMENT PRIMARY KEY, v INT NOT NULL, pad VARCHAR(60) NOT NULL)",
		"INSERT INTO "+r.db+".big (id, v, pad) SELECT seq, seq, REPEAT('p', 50) FROM seq_1_to_200000",
		// Read last (tables in name order): the first run is still
		// going when the tailer is killed.
		"CREATE TABLE "+r.db+".zz (id INT PRIMARY KEY, pad VARCHAR(60) NOT NULL)",
		"INSERT INTO "+r.db+".zz (id, pad) SELECT seq, REPEAT('z', 50) FROM seq_1_to_600000")
	// A first run: no start position, the fallback snapshots first.
	firstRunConfig(t, r.cfg, 500)
	ps := &procSet{f: f, t: t}
	defer ps.killAll()
	applier := ps.start("apply", "--config", r.cfg)
	tailer := ps.start("run", "--config", r.cfg)
	// The killed run committed the table's first chunks to Kafka (ids 1
	// to 500 come first, in key order; a batch's transaction commits
	// before the next one begins, so 3,000 records hold committed ones):
	// the applier writes them whatever happens to the tailer.
	adm := kadmClient(t, r.brokers)
	topic := r.prefix + "." + r.db + ".big"
	published := func() int64 {
		ends, err := adm.ListEndOffsets(f.ctx, topic)
		if err != nil {
			return 0
		}
		var n int64
		ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
		return n
	}
	if !testenv.WaitFor(60*time.Second, func() bool { return tailer.exited() || published() >= 3000 }) || tailer.exited() {
		t.Fatalf("the first rows were not published:\ntailer:\n%s\napplier:\n%s", tail(tailer.stderr.String(), 20), tail(applier.stderr.String(), 20))
	}
	tailer.kill()
	if strings.Contains(tailer.stderr.String(), "catch-up finished") {
		t.Fatalf("the snapshot finished before the kill:\n%s", tail(tailer.stderr.String(), 10))
	}
	killed := tailer.stderr.String()
	// The applier wrote the first 100 rows.
	if !testenv.WaitFor(60*time.Second, func() bool {
		var n int
		_ = f.pg.QueryRow(f.ctx, `SELECT count(*) FROM "`+r.db+`".big WHERE id <= 100`).Scan(&n)
		return n == 100 || applier.exited()
	}) || applier.exited() {
		t.Fatalf("the killed run's first rows did not reach the target:\n%s", tail(applier.stderr.String(), 20))
	}
	ps.procs = ps.procs[:1] // the applier; converge checks that every process runs
	f.exec(t, "DELETE FROM "+r.db+".big WHERE id <= 100")
	tailer = ps.start("run", "--config", r.cfg)
	ps.converge(harness.TableSpec{Database: r.db, Table: "big", SourceZone: "UTC"}, "after the restarted first snapshot")
	for i, s := range []string{killed, ps.procs[0].stderr.String(), tailer.stderr.String()} {
		if strings.Contains(s, "NOT captured") || strings.Contains(s, "level=ERROR") {
			t.Errorf("process %d: a log line admits lost deletes or an error:\n%s", i, grepLines(s, "NOT captured")+grepLines(s, "level=ERROR"))
		}
	}
}
