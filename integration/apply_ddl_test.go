package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"tidemark/integration/harness"
)

// TestApplyFollowsSchemaAndTruncate runs the scale-out topology (tailer and
// two appliers, 4 partitions) through an ALTER TABLE ADD COLUMN and a
// TRUNCATE with writes before and after each: the appliers create the new
// column from the schema record before any row that has it, and every
// partition's applier removes the rows older than the TRUNCATE (and only
// those). The target then equals the source row by row. Admin commands
// beside the tailer neither fence it nor run what the topology cannot
// carry (catchup, resync).
func TestApplyFollowsSchemaAndTruncate(t *testing.T) {
	f := newFixture(t)
	r, _ := f.newApplyRun(t, "it_applyddl_", 97, 4, 50)
	ps := &procSet{f: f, t: t}
	defer ps.killAll()
	for _, args := range [][]string{{"run", "--config", r.cfg}, {"apply", "--config", r.cfg}, {"apply", "--config", r.cfg}} {
		ps.start(args...)
	}
	procs := ps.procs
	spec := harness.TableSpec{Database: r.db, Table: "orders", SourceZone: "UTC"}
	converge := func(step string) {
		t.Helper()
		var diff *harness.Diff
		if !waitFor(120*time.Second, func() bool {
			d, err := harness.Compare(f.ctx, f.my, f.pg, spec)
			if err != nil {
				return false
			}
			diff = d
			return d.Equal()
		}) {
			msg := ""
			for i, d := range procs {
				msg += fmt.Sprintf("\nprocess %d:\n%s", i, tail(d.stderr.String(), 12))
			}
			t.Fatalf("%s: target did not converge: %v%s", step, diff, msg)
		}
		for i, d := range procs {
			if d.exited() {
				t.Fatalf("%s: process %d exited:\n%s", step, i, tail(d.stderr.String(), 20))
			}
		}
	}
	if err := r.w.Run(60); err != nil {
		t.Fatal(err)
	}
	converge("before the TRUNCATE")
	// Admin commands beside the running tailer: checkpoint reads Kafka's
	// checkpoint without fencing it; catchup takes the source's lock (held
	// by the tailer) and refuses; resync is refused in this topology.
	env := []string{"TM_IT_MYSQL_PASSWORD=" + f.env.MySQLPassword, "TM_IT_PG_DSN=" + f.env.PGDSN}
	if code, out := runBinary(t, 60*time.Second, env, "checkpoint", "--config", r.cfg); code != 0 || !strings.Contains(out, "gtid=") {
		t.Fatalf("checkpoint: exit %d\n%s", code, out)
	}
	if code, out := runBinary(t, 60*time.Second, env, "catchup", "--config", r.cfg, "--table", r.db+".orders"); code == 0 || !strings.Contains(out, "is streaming source") {
		t.Fatalf("catchup beside the tailer: exit %d, want a refusal\n%s", code, out)
	}
	if code, out := runBinary(t, 60*time.Second, env, "resync", "--config", r.cfg, "--table", r.db+".orders"); code != 2 || !strings.Contains(out, "scale-out topology") {
		t.Fatalf("resync in the scale-out topology: exit %d, want 2 and a refusal\n%s", code, out)
	}
	if err := harness.Exec(f.my, "TRUNCATE TABLE "+r.db+".orders"); err != nil {
		t.Fatal(err)
	}
	if err := r.w.Run(40); err != nil {
		t.Fatal(err)
	}
	converge("after the TRUNCATE")
	// The workload inserts without a column list: the ALTER comes last.
	if err := harness.Exec(f.my, "ALTER TABLE "+r.db+".orders ADD COLUMN extra_note VARCHAR(20) NULL"); err != nil {
		t.Fatal(err)
	}
	if err := harness.Exec(f.my, "UPDATE "+r.db+".orders SET extra_note = 'after alter' WHERE order_id % 3 = 0"); err != nil {
		t.Fatal(err)
	}
	converge("after the ALTER")
	truncated := 0
	for _, d := range procs[1:] {
		truncated += strings.Count(d.stderr.String(), "truncated target rows older than a source TRUNCATE")
	}
	if truncated != 4 {
		t.Errorf("the appliers ran the TRUNCATE %d times, want once per partition (4)", truncated)
	}
}
