package integration

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"tidemark/integration/harness"
)

// F1, quick profile: SIGKILL at random moments under a mixed workload
// (single-row and 1000-row transactions, updates, deletes, a hot key), 20
// kills. Invariants I1–I5 are checked throughout and at the end.
func TestF1KillNineUnderLoad(t *testing.T) { runKillNine(t, 20) }

// F1, long profile: 200 kills (make test-long).
func TestF1KillNineUnderLoadLong(t *testing.T) {
	longProfile(t)
	runKillNine(t, 200)
}

func runKillNine(t *testing.T, kills int) {
	r := startRestartRun(t, "it_f1_", runLoad{interval: 20 * time.Millisecond})
	f, db, cfg, d, w, led, mon, load := r.f, r.db, r.cfg, r.d, r.w, r.led, r.mon, r.load

	began := time.Now()
	rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
	var recoveries []time.Duration
	var peak int64
	var logs strings.Builder
	for i := 0; i < kills; i++ {
		// Every other restart is given the time to catch up first (the
		// recovery time measured); the others are killed at a random
		// moment of their start-up or catch-up.
		if i%2 == 1 {
			recoveries = append(recoveries, f.caughtUpIn(t, db, d, 2*time.Minute))
		}
		time.Sleep(time.Duration(30+rnd.IntN(1200)) * time.Millisecond)
		if d.exited() {
			t.Fatalf("kill %d: the daemon exited by itself:\n%s", i, tail(d.stderr.String(), 40))
		}
		peak = max(peak, d.hwmKiB())
		d.kill()
		logs.WriteString(d.stderr.String())
		d = f.startDaemon(t, cfg)
		r.d = d
	}
	if err := load.Stop(); err != nil {
		t.Fatal(err)
	}
	led.Stop()
	recoveries = append(recoveries, f.caughtUpIn(t, db, d, 3*time.Minute))
	peak = max(peak, d.hwmKiB())
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM; stderr:\n%s", code, tail(d.stderr.String(), 40))
	}
	logs.WriteString(d.stderr.String())
	if !strings.Contains(d.stderr.String(), "stopped cleanly") {
		t.Fatalf("no clean-stop log line:\n%s", tail(d.stderr.String(), 20))
	}
	checkMonitor(t, mon, led)
	diffs := f.checkEqual(t,
		harness.TableSpec{Database: db, Table: "orders", SourceZone: "Asia/Kolkata"},
		harness.TableSpec{Database: db, Table: "ticks", SourceZone: "Asia/Kolkata"})
	regr, resur := checkI5(t, f, db, false)
	mismatches := 0
	for _, d := range diffs {
		mismatches += d.Missing + d.Extra + d.Changed + d.DuplicateKeys
	}
	if n := countLines(logs.String(), "level=ERROR"); n > 0 {
		t.Errorf("%d ERROR log lines across the kills:\n%s", n, grepLines(logs.String(), "level=ERROR"))
	}
	report(t, "F1", figures{
		"kills": kills, "transactions": w.Stats.Transactions, "inserts": w.Stats.Inserts, "updates": w.Stats.Updates,
		"deletes": w.Stats.Deletes, "ticks": led.Ticks(), "rows_source": diffs[0].SourceRows,
		"mismatches": mismatches, "i5_regressions": regr, "i5_resurrections": resur,
		"recovery_p50_ms": ms(percentile(recoveries, 0.5)), "recovery_p99_ms": ms(percentile(recoveries, 0.99)),
		"recovery_max_ms": ms(percentile(recoveries, 1)), "peak_rss_mib": peak / 1024, "duration_s": int(time.Since(began).Seconds()),
	})
}
