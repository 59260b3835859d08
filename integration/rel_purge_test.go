package integration

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// F5 (fallback on): the binlogs are purged while tidemark is down, twice
// (once after a clean stop, once after a SIGKILL); each restart catches up
// with bounded reads and a key diff, reattaches to the binlog and keeps
// streaming. The monitor checks I3 on the orders watermark (never
// backwards, never ahead of the rows in the target) and I4 on the ledger,
// and the I5 triggers record, from before the first snapshot (taken while
// the ledger ticks) through both catch-ups; I1, I2 and I5 at the end.
func TestF5PurgedWhileDownFallbackConverges(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_f5_")
	f.dropLater(t, db, db)
	w := newWorkload(t, f, db, "Asia/Kolkata", 500)
	if err := harness.Exec(f.my, "CREATE INDEX upd ON "+db+".orders (updated_at)"); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(150); err != nil {
		t.Fatal(err)
	}
	led := newLedger(t, f, db)
	// ticks has no watermark column: every catch-up re-reads it in full.
	cfg := f.relConfig(t, db, db, relOpts{Zone: "Asia/Kolkata", Extra: fallbackYAML(db, true)})
	// The invariants are watched from before the first snapshot, which runs
	// while the ledger ticks (I4: the captured position must not promise a
	// tick the snapshot did not read), and through every catch-up.
	watchI5(t, f, db)
	mon := startMonitor(t, f, db, db, led)
	mon.WatchWatermark("orders", "updated_at", "Asia/Kolkata")
	startLedger(t, led, 5*time.Millisecond)
	d := f.startDaemon(t, cfg)
	f.caughtUpIn(t, db, d, 2*time.Minute)
	i5Watched(t, f, db, "orders", "ticks")

	var recoveries []time.Duration
	var logs strings.Builder
	for round := 0; round < 2; round++ {
		if err := w.Run(100); err != nil {
			t.Fatal(err)
		}
		f.caughtUpIn(t, db, d, 2*time.Minute)
		if round == 0 {
			if code := d.stop(t); code != 0 {
				t.Fatalf("exit %d:\n%s", code, tail(d.stderr.String(), 20))
			}
		} else {
			d.kill()
		}
		logs.WriteString(d.stderr.String())
		// While down: inserts, updates, deletes, ticks, then a purge.
		if err := w.Run(200); err != nil {
			t.Fatal(err)
		}
		if err := harness.Exec(w.My, fmt.Sprintf("DELETE FROM orders WHERE order_id BETWEEN %d AND %d", 2+round*50, 30+round*50)); err != nil {
			t.Fatal(err)
		}
		// (The ledger ticks all along, also while tidemark is down.)
		f.purgeBinlogs(t)
		d = f.startDaemon(t, cfg)
		recoveries = append(recoveries, f.caughtUpIn(t, db, d, 2*time.Minute))
		if !strings.Contains(d.stderr.String(), "binlog position purged") {
			t.Fatalf("round %d: the restart did not notice the purge:\n%s", round, tail(d.stderr.String(), 20))
		}
	}
	// Streaming goes on after the catch-up.
	if err := w.Run(100); err != nil {
		t.Fatal(err)
	}
	led.Stop()
	f.caughtUpIn(t, db, d, 2*time.Minute)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(d.stderr.String(), 20))
	}
	logs.WriteString(d.stderr.String())
	checkMonitor(t, mon, led)
	diffs := f.checkEqual(t,
		harness.TableSpec{Database: db, Table: "orders", SourceZone: "Asia/Kolkata"},
		harness.TableSpec{Database: db, Table: "ticks", SourceZone: "Asia/Kolkata"})
	checkI5(t, f, db, false)
	report(t, "F5-fallback", figures{
		"purges": 2, "mismatches": diffs[0].Missing + diffs[0].Extra + diffs[0].Changed + diffs[1].Missing + diffs[1].Extra + diffs[1].Changed,
		"catchups": countLines(logs.String(), "caught up; resuming the binlog"), "recovery_p50_ms": ms(percentile(recoveries, 0.5)),
		"recovery_max_ms": ms(percentile(recoveries, 1)), "rows_source": diffs[0].SourceRows,
	})
}

// targetDigest is the target's rows and checkpoint, to prove a failed run
// changed nothing.
func (f *fixture) targetDigest(t *testing.T, source, db string) string {
	t.Helper()
	var digest string
	err := f.pg.QueryRow(f.ctx, fmt.Sprintf(`SELECT md5(string_agg(o::text, ',' ORDER BY order_id, line_item_id)) FROM %s.orders o`, db)).Scan(&digest)
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := harness.StoredCheckpoint(f.ctx, f.pg, "", source)
	if err != nil {
		t.Fatal(err)
	}
	return digest + " @ " + p.String()
}

// I6 / F5 (fallback off): a purged position with the fallback disabled is an
// unrecoverable gap: the daemon exits 1 at once, the error says the position
// was purged and names it, and neither the target rows nor the checkpoint
// change. Turning the fallback on then converges: nothing was skipped.
func TestF5PurgedWhileDownNoFallbackStops(t *testing.T) {
	f := newFixture(t)
	db, start := f.newSource(t, "it_f5off_")
	w := newWorkload(t, f, db, "UTC", 100)
	if err := w.Run(50); err != nil {
		t.Fatal(err)
	}
	off := f.relConfig(t, db, db, relOpts{Start: start, Extra: "fallback:\n  enabled: false\n"})
	d := f.startDaemon(t, off)
	f.caughtUpIn(t, db, d, time.Minute)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d", code)
	}
	before := f.targetDigest(t, db, db)
	ckpt, _, err := harness.StoredCheckpoint(f.ctx, f.pg, "", db)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(50); err != nil {
		t.Fatal(err)
	}
	f.purgeBinlogs(t)
	d = f.startDaemon(t, off)
	began := time.Now()
	select {
	case <-d.waited:
	case <-time.After(30 * time.Second):
		d.kill()
		t.Fatalf("the daemon kept running on a purged position with the fallback off:\n%s", tail(d.stderr.String(), 20))
	}
	code := d.cmd.ProcessState.ExitCode()
	log := d.stderr.String()
	if code != 1 {
		t.Errorf("exit code %d on a purged position, want 1", code)
	}
	for _, want := range []string{"level=ERROR", "purged", ckpt.GTID} {
		if !strings.Contains(log, want) {
			t.Errorf("the error does not say %q:\n%s", want, tail(log, 10))
		}
	}
	if after := f.targetDigest(t, db, db); after != before {
		t.Errorf("a failed start changed the target: %s → %s", before, after)
	}
	// Nothing skipped: the same source with the fallback on converges.
	on := f.relConfig(t, db, db, relOpts{Start: start, Extra: fallbackYAML(db, true)})
	d = f.startDaemon(t, on)
	f.caughtUpIn(t, db, d, 2*time.Minute)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d", code)
	}
	f.checkEqual(t, harness.TableSpec{Database: db, Table: "orders"})
	report(t, "F5-no-fallback", figures{"exit_code": code, "stopped_after_ms": ms(time.Since(began)), "target_unchanged": true})
}

// I6: a checkpoint ahead of the source (a GTID the server never wrote: a
// reset or replaced source) is fatal whatever the fallback says: exit 1
// with an error saying so, nothing changed.
func TestI6PositionAheadStops(t *testing.T) {
	f := newFixture(t)
	db, start := f.newSource(t, "it_ahead_")
	w := newWorkload(t, f, db, "UTC", 10)
	if err := w.Run(20); err != nil {
		t.Fatal(err)
	}
	cfg := f.relConfig(t, db, db, relOpts{Start: start})
	d := f.startDaemon(t, cfg)
	f.caughtUpIn(t, db, d, time.Minute)
	d.stop(t)
	p, _, err := harness.StoredCheckpoint(f.ctx, f.pg, "", db)
	if err != nil {
		t.Fatal(err)
	}
	set, err := tidemark.ParseMariaDBGTIDSet(p.GTID)
	if err != nil {
		t.Fatal(err)
	}
	for k, g := range set {
		g.Seq += 1_000_000_000
		set[k] = g
	}
	ahead := tidemark.Position{GTID: set.String()}
	if _, err := f.pg.Exec(f.ctx, "UPDATE tidemark.checkpoints SET position = $1, file = NULL, pos = NULL WHERE source = $2", ahead.String(), db); err != nil {
		t.Fatal(err)
	}
	before := f.targetDigest(t, db, db)
	d = f.startDaemon(t, cfg)
	select {
	case <-d.waited:
	case <-time.After(30 * time.Second):
		d.kill()
		t.Fatalf("the daemon kept running on a position ahead of the source:\n%s", tail(d.stderr.String(), 20))
	}
	if code := d.cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	if log := d.stderr.String(); !strings.Contains(log, "ahead") || !strings.Contains(log, ahead.GTID) {
		t.Errorf("the error does not say the position %s is ahead of the source:\n%s", ahead.GTID, tail(log, 10))
	}
	if strings.Contains(d.stderr.String(), "catching up with bounded reads") {
		t.Errorf("a position ahead of the source fell back to a catch-up")
	}
	if after := f.targetDigest(t, db, db); after != before {
		t.Errorf("a failed start changed the target: %s → %s", before, after)
	}
}

// F6: binlogs rotated and purged behind the reader while it streams, ten
// times, then two kills: the reader follows every rotation, never needs
// the fallback (its position is never purged), and resumes in the new
// files. I1–I5 hold.
func TestF6RotatePurgeBehindReader(t *testing.T) {
	run := startRestartRun(t, "it_f6_", runLoad{interval: 10 * time.Millisecond})
	f, db, cfg, d, led, mon, load := run.f, run.db, run.cfg, run.d, run.led, run.mon, run.load
	rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 6))
	purged := 0
	var logs strings.Builder
	for i := 0; i < 10; i++ {
		time.Sleep(time.Duration(200+rnd.IntN(400)) * time.Millisecond)
		if err := harness.Exec(f.my, "FLUSH BINARY LOGS"); err != nil {
			t.Fatal(err)
		}
		r, err := f.my.Execute("SHOW MASTER STATUS")
		if err != nil {
			t.Fatal(err)
		}
		file, _ := r.GetString(0, 0)
		before, _ := f.my.Execute("SHOW BINARY LOGS")
		if err := harness.Exec(f.my, "PURGE BINARY LOGS TO '"+file+"'"); err != nil {
			t.Fatal(err)
		}
		after, _ := f.my.Execute("SHOW BINARY LOGS")
		purged += before.RowNumber() - after.RowNumber()
		if i == 4 || i == 9 {
			d.kill()
			logs.WriteString(d.stderr.String())
			d = f.startDaemon(t, cfg)
			run.d = d
		}
	}
	if err := load.Stop(); err != nil {
		t.Fatal(err)
	}
	led.Stop()
	f.caughtUpIn(t, db, d, 2*time.Minute)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(d.stderr.String(), 20))
	}
	logs.WriteString(d.stderr.String())
	if strings.Contains(logs.String(), "purged") {
		t.Errorf("the reader lost its position to a purge behind it:\n%s", grepLines(logs.String(), "purged"))
	}
	checkMonitor(t, mon, led)
	diffs := f.checkEqual(t,
		harness.TableSpec{Database: db, Table: "orders", SourceZone: "Asia/Kolkata"},
		harness.TableSpec{Database: db, Table: "ticks", SourceZone: "Asia/Kolkata"})
	checkI5(t, f, db, false)
	report(t, "F6", figures{"rotations": 10, "files_purged": purged, "kills": 2,
		"mismatches":   diffs[0].Missing + diffs[0].Extra + diffs[0].Changed + diffs[1].Missing + diffs[1].Extra + diffs[1].Changed,
		"rotate_lines": countLines(logs.String(), "rotate to next binlog")})
}
