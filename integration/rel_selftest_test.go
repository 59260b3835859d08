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

// TestInvariantChecksCanFail injects each fault the reliability checks look
// for and requires the check to see it: an update that lowers a row's
// version and an insert under a newer delete (I5), a checkpoint that claims
// data the target lacks, one ahead of the source, and one that moves
// backwards (I4), and a target row that differs from the source (I1).
// A check that cannot fail would prove nothing.
func TestInvariantChecksCanFail(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_self_")
	f.dropLater(t, db, db)
	if _, err := f.pg.Exec(f.ctx, fmt.Sprintf(`CREATE SCHEMA %[1]s;
CREATE TABLE %[1]s.ticks (id bigint PRIMARY KEY, at timestamptz, note text, _tm_seq bigint NOT NULL, _tm_idx integer NOT NULL);
INSERT INTO %[1]s.ticks VALUES (1, now(), 'a', 10, 1), (2, now(), 'b', 10, 2)`, db)); err != nil {
		t.Fatal(err)
	}
	// I5.
	installI5(t, f, db, "ticks", "id")
	if _, err := f.pg.Exec(f.ctx, fmt.Sprintf(`UPDATE %[1]s.ticks SET _tm_seq = 9 WHERE id = 1;
DELETE FROM %[1]s.ticks WHERE id = 2;
INSERT INTO %[1]s.ticks VALUES (2, now(), 'b', 10, 1)`, db)); err != nil {
		t.Fatal(err)
	}
	regr, resur, bad, err := readI5(f, db, false)
	if err != nil || regr != 1 || resur != 1 || len(bad) != 2 {
		t.Errorf("I5 trigger: %d regressions, %d resurrections (%v, %v); want 1 and 1", regr, resur, bad, err)
	}

	// I5 on a table created after watchI5 (as the daemon creates them
	// during a first snapshot): the trigger is attached at CREATE TABLE,
	// keyed by the primary key in its order.
	watchI5(t, f, db)
	if _, err := f.pg.Exec(f.ctx, fmt.Sprintf(`CREATE TABLE %[1]s.auto (a int, b text, _tm_seq bigint NOT NULL, _tm_idx integer NOT NULL, PRIMARY KEY (b, a));
INSERT INTO %[1]s.auto VALUES (1, 'x', 10, 1);
UPDATE %[1]s.auto SET _tm_seq = 9`, db)); err != nil {
		t.Fatal(err)
	}
	i5Watched(t, f, db, "auto")
	if regr, _, bad, err := readI5(f, db, false); err != nil || regr != 2 || !strings.Contains(strings.Join(bad, "\n"), "auto x|1: update regressed") {
		t.Errorf("I5 on a table created after watchI5: %d regressions (%v, %v); want 2, one of auto x|1", regr, bad, err)
	}

	// I4: the ledger says tick 5 committed at GTID seq 100; the target
	// lacks it.
	led := harness.LedgerOf(f.env, db, []int64{1, 5}, []uint64{50, 100})
	src, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	var dom uint32
	set, _ := tidemark.ParseMariaDBGTIDSet(src.GTID)
	for d := range set {
		dom = d
	}
	setCkpt := func(seq uint64) {
		t.Helper()
		g := fmt.Sprintf("%d-1001-%d", dom, seq)
		if _, err := f.pg.Exec(f.ctx, `INSERT INTO tidemark.checkpoints (source, position, gtid) VALUES ($1, $2, $3)
ON CONFLICT (source) DO UPDATE SET position = EXCLUDED.position, gtid = EXCLUDED.gtid`, db, "gtid="+g, g); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(name string, seq uint64, want string) {
		t.Helper()
		setCkpt(seq)
		m := startMonitor(t, f, db, db, led)
		ok := testenv.WaitFor(5*time.Second, func() bool {
			return strings.Contains(strings.Join(m.Violations(), "\n"), want)
		})
		m.Stop()
		if !ok {
			t.Errorf("%s: the monitor did not report %q (got %v)", name, want, m.Violations())
		}
	}
	expect("checkpoint past the target's data", 150, "the target holds only 1 of the last 2")
	expect("checkpoint ahead of the source", 1<<40, "ahead of the source")
	m := startMonitor(t, f, db, db, nil)
	setCkpt(60)
	testenv.WaitFor(2*time.Second, m.HavePos)
	setCkpt(55)
	ok := testenv.WaitFor(5*time.Second, func() bool {
		return strings.Contains(strings.Join(m.Violations(), "\n"), "moved backwards")
	})
	m.Stop()
	if !ok {
		t.Errorf("a checkpoint moving backwards was not reported (%v)", m.Violations())
	}

	// I1: one changed value in the target.
	w := newWorkload(t, f, db, "UTC", 10)
	if err := w.Run(20); err != nil {
		t.Fatal(err)
	}
	cfg := f.relConfig(t, db+"_src", db, relOpts{Start: src})
	t.Cleanup(func() { _, _ = f.pg.Exec(f.ctx, "DELETE FROM tidemark.checkpoints WHERE source = $1", db+"_src") })
	d := f.startDaemon(t, cfg)
	f.caughtUpIn(t, db+"_src", d, time.Minute)
	d.stop(t)
	if _, err := f.pg.Exec(f.ctx, fmt.Sprintf("UPDATE %s.orders SET amount = amount + 0.01 WHERE order_id = 0", db)); err != nil {
		t.Fatal(err)
	}
	diff, err := harness.Compare(f.ctx, f.my, f.pg, harness.TableSpec{Database: db, Table: "orders"})
	if err != nil || diff.Equal() || diff.Changed != 1 {
		t.Errorf("I1: a changed target row was not found: %v (%v)", diff, err)
	}
}
