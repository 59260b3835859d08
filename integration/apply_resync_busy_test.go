package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tidemark/integration/harness"
)

// TestApplyResyncOfBusyTable resyncs a table through the running tailer of
// the scale-out topology (4 partitions, 2 appliers) three times while a
// writer updates single rows at about 100 per second. A row written by
// the transaction the snapshot's version names (gtid) or by the first one
// after it (filepos) is published after the snapshot's end record; the end
// record of another partition, applied later (one applier is stopped
// across each resync), must not remove it. After
// the writer stops the target equals the source row by row (review
// finding 1: it lost those rows).
func TestApplyResyncOfBusyTable(t *testing.T) {
	f, r, ps, converge := startDDLTopology(t, "it_applybusy_", 101, "")
	defer ps.killAll()
	tailer, lagging := ps.procs[0], ps.procs[1]
	env := []string{"TM_IT_MYSQL_PASSWORD=" + f.env.MySQLPassword, "TM_IT_PG_DSN=" + f.env.PGDSN}
	if err := r.w.Run(60); err != nil {
		t.Fatal(err)
	}
	// Rows the writer updates once each (a lost one stays lost).
	var keys [][2]int64
	var vals []string
	for i := range 3000 {
		keys = append(keys, [2]int64{1_000_000 + int64(i), 1})
		vals = append(vals, fmt.Sprintf("(%d, 1, 'busy', 1.00, 'new', 'before', NOW(6), NULL)", 1_000_000+i))
	}
	if err := harness.Exec(f.my, "INSERT INTO "+r.db+".orders VALUES "+strings.Join(vals, ",")); err != nil {
		t.Fatal(err)
	}
	converge("before the resyncs")
	stop := startUpdater(t, f, r.db, keys, 100)
	for i := 1; i <= 3; i++ {
		time.Sleep(700 * time.Millisecond)
		// One applier lags across the resync (well below the session
		// timeout): the other one applies its partitions' end records
		// and the rows after them first.
		if err := lagging.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		code, out := runBinary(t, 120*time.Second, env, "resync", "--config", r.cfg, "--table", r.db+".orders", "--wait", "100s")
		if code != 0 || !strings.Contains(out, "resynced") {
			stop()
			_ = lagging.cmd.Process.Signal(syscall.SIGCONT)
			t.Fatalf("resync %d beside the tailer: exit %d\n%s\ntailer:\n%s", i, code, out, tail(tailer.stderr.String(), 15))
		}
		time.Sleep(1500 * time.Millisecond)
		if err := lagging.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	if n := stop(); n < 50 {
		t.Fatalf("the writer made only %d updates: the test would prove nothing", n)
	}
	converge("after three resyncs under writes")
}

// startUpdater updates one row of db.orders (keys in turn, each once, each
// its own transaction) perSecond times a second on its own connection until
// the returned stop is called or the keys run out; stop returns the number
// of updates made.
func startUpdater(t *testing.T, f *fixture, db string, keys [][2]int64, perSecond int) (stop func() int) {
	t.Helper()
	my, err := f.env.MySQL()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var n int
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer my.Close()
		tick := time.NewTicker(time.Second / time.Duration(perSecond))
		defer tick.Stop()
		for i := range keys {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			k := keys[i]
			if _, err := my.Execute(fmt.Sprintf("UPDATE %s.orders SET note = 'writer %d' WHERE order_id = %d AND line_item_id = %d", db, i, k[0], k[1])); err != nil {
				werr = err
				return
			}
			n++
		}
	}()
	var once sync.Once
	stop = func() int {
		once.Do(func() { cancel(); wg.Wait() })
		if werr != nil {
			t.Fatalf("writer: %v", werr)
		}
		return n
	}
	t.Cleanup(func() { stop() })
	return stop
}
