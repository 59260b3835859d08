package integration

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestApplyPrunesTombstones runs the scale-out topology (tailer and two
// appliers, 4 partitions, hard deletes) with a workload that deletes: the
// tombstones the appliers write are pruned once every partition of the
// table has applied past them (review finding 18), and never while a
// partition lags: with one applier paused (SIGSTOP), every tombstone newer
// than what it had applied stays. The target equals the source throughout.
func TestApplyPrunesTombstones(t *testing.T) {
	f, r, ps, converge := startDDLTopology(t, "it_applytomb_", 111, "")
	defer ps.killAll()
	target := `"` + r.db + `"."orders"`
	count := func(where string, args ...any) int {
		t.Helper()
		var n int
		if err := f.pg.QueryRow(f.ctx, "SELECT count(*) FROM tidemark.tombstones WHERE target = $1"+where, append([]any{target}, args...)...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for i := 0; i < 3; i++ {
		if err := r.w.Run(40); err != nil {
			t.Fatal(err)
		}
	}
	converge("after the first deletes")
	written := count("")
	if written == 0 {
		t.Fatal("the workload wrote no tombstone: the test would prove nothing")
	}
	// A lagging partition: pause one applier, keep deleting. No
	// tombstone at or above the smallest stored floor (what the paused
	// member had applied) may be pruned while it is paused.
	paused := ps.procs[2]
	if err := paused.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	// The smallest floor among the partitions that have one: a partition
	// that has applied no change yet stores 0, which the members' pruning
	// reads as "no floor, prune nothing" until it applies one, and then
	// its floor is a recent version; 0 here would make every tombstone
	// count as still needed (the clean-clone CI check of 992892b failed so:
	// "36 of the 37 tombstones at or above its floor were pruned").
	var minFloor int64
	if err := f.pg.QueryRow(f.ctx, "SELECT coalesce(min(floor_seq) FILTER (WHERE floor_seq > 0), 0) FROM tidemark.stream_offsets WHERE topic = $1", r.prefix+"."+r.db+".orders").Scan(&minFloor); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := harness.Exec(f.my, fmt.Sprintf("DELETE FROM %s.orders ORDER BY order_id DESC LIMIT 10", r.db)); err != nil {
			t.Fatal(err)
		}
		if err := r.w.Run(20); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
	}
	newer := count(" AND seq >= $2", minFloor)
	if newer == 0 {
		t.Fatalf("no tombstone at or above the paused member's floor %d: the test would prove nothing", minFloor)
	}
	time.Sleep(12 * time.Second) // more than a pruning interval
	if kept := count(" AND seq >= $2", minFloor); kept < newer {
		t.Fatalf("while a partition lagged, %d of the %d tombstones at or above its floor were pruned: a guard still needed is gone", newer-kept, newer)
	}
	if err := paused.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	converge("after the paused applier resumed")
	before := count("")
	if !testenv.WaitFor(60*time.Second, func() bool { return count("") < before/2 }) {
		t.Fatalf("tombstones were never pruned: %d of the table's tombstones left (%d after the first deletes), every partition applied past them", count(""), written)
	}
	if err := r.w.Run(30); err != nil {
		t.Fatal(err)
	}
	converge("at the end")
	t.Logf("tombstones: %d after the first deletes, %d newer than the paused member kept, %d before pruning, %d left", written, newer, before, count(""))
}
