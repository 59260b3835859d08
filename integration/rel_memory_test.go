package integration

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"tidemark/integration/harness"
)

// rssLimitMiB bounds the daemon's peak resident set in the memory
// scenarios. The tailer splits transactions into chunks of ≤ 4 MiB / 10k
// changes, the pipeline queues 4 chunks and batches ≤ 16 MiB (a split
// transaction is flushed at 2 × that), and go-mysql buffers up to 10,240
// events: a few hundred MiB at most, whatever the transaction size.
const rssLimitMiB = 768

// rssSampler polls a running daemon's VmHWM and VmRSS.
type rssSampler struct {
	mu        sync.Mutex
	hwm, rss  int64 // KiB
	stop      chan struct{}
	done      chan struct{}
	d         *daemonProc
	rssSeries []int64
}

func sampleRSS(d *daemonProc, every time.Duration) *rssSampler {
	s := &rssSampler{d: d, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			hwm, rss := procMem(d.cmd.Process.Pid)
			s.mu.Lock()
			s.hwm = max(s.hwm, hwm)
			s.rss = max(s.rss, rss)
			s.rssSeries = append(s.rssSeries, rss)
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-time.After(every):
			}
		}
	}()
	return s
}

// Stop stops sampling and returns the peak (VmHWM) in MiB. Stop it before
// the daemon exits.
func (s *rssSampler) Stop() int64 {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hwm / 1024
}

func procMem(pid int) (hwm, rss int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		switch k {
		case "VmHWM":
			hwm = n
		case "VmRSS":
			rss = n
		}
	}
	return hwm, rss
}

// F10, quick profile: one 200,000-row transaction, then a 16 MiB BLOB row
// inserted, updated (a 32 MiB row image) and a second one inserted. Memory
// stays bounded; target equals source.
func TestF10LargeTransactionAndBlob(t *testing.T) { runLarge(t, 200_000) }

// F10, long profile: one 1,000,000-row transaction.
func TestF10LargeTransactionAndBlobLong(t *testing.T) {
	longProfile(t)
	runLarge(t, 1_000_000)
}

func runLarge(t *testing.T, rows int) {
	f := newFixture(t)
	db, start := f.newSource(t, "it_f10_")
	if err := harness.Exec(f.my, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE big (id BIGINT NOT NULL PRIMARY KEY, grp INT NOT NULL, name VARCHAR(64) NOT NULL, amount DECIMAL(12,2) NOT NULL, at DATETIME(6) NOT NULL)",
		"CREATE TABLE blobs (id INT NOT NULL PRIMARY KEY, data LONGBLOB NOT NULL, note VARCHAR(32))"); err != nil {
		t.Fatal(err)
	}
	cfg := f.relConfig(t, db, db, relOpts{Start: start})
	d := f.startDaemon(t, cfg)
	t.Cleanup(func() {
		if !d.exited() {
			d.kill()
		}
	})
	f.caughtUpIn(t, db, d, time.Minute)
	mem := sampleRSS(d, 100*time.Millisecond)

	began := time.Now()
	if err := harness.Exec(f.my, fmt.Sprintf("INSERT INTO big SELECT seq, seq %% 100, CONCAT('row-', seq), (seq %% 100000) / 100, NOW(6) FROM seq_1_to_%d", rows)); err != nil {
		t.Fatal(err)
	}
	written := time.Since(began)
	txApply := f.caughtUpIn(t, db, d, 10*time.Minute)
	txPeak := mem.Stop()

	mem = sampleRSS(d, 100*time.Millisecond)
	const blob = 16 << 20
	if err := harness.Exec(f.my,
		fmt.Sprintf("INSERT INTO blobs VALUES (1, REPEAT(UNHEX(SHA2('tidemark', 256)), %d), 'one')", blob/32),
		"UPDATE blobs SET data = REVERSE(data), note = 'reversed' WHERE id = 1",
		fmt.Sprintf("INSERT INTO blobs VALUES (2, REPEAT(UNHEX(SHA2('second', 256)), %d), 'two')", blob/32)); err != nil {
		t.Fatal(err)
	}
	blobApply := f.caughtUpIn(t, db, d, 5*time.Minute)
	blobPeak := mem.Stop()
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(d.stderr.String(), 20))
	}

	// I1: the big table by the independent verifier (row by row), the BLOBs
	// by length and digest on both sides.
	diffs := f.checkEqual(t, harness.TableSpec{Database: db, Table: "big"})
	r, err := f.my.Execute("SELECT id, LENGTH(data), MD5(data), note FROM " + db + ".blobs ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	var src, dst []string
	for i := 0; i < r.RowNumber(); i++ {
		id, _ := r.GetInt(i, 0)
		n, _ := r.GetInt(i, 1)
		md, _ := r.GetString(i, 2)
		note, _ := r.GetString(i, 3)
		src = append(src, fmt.Sprintf("%d/%d/%s/%s", id, n, md, note))
	}
	rs, err := f.pg.Query(f.ctx, fmt.Sprintf("SELECT id, length(data), md5(data), note FROM %s ORDER BY id", pgx.Identifier{db, "blobs"}.Sanitize()))
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var id, n int64
		var md, note string
		if err := rs.Scan(&id, &n, &md, &note); err != nil {
			t.Fatal(err)
		}
		dst = append(dst, fmt.Sprintf("%d/%d/%s/%s", id, n, md, note))
	}
	rs.Close()
	if strings.Join(src, " ") != strings.Join(dst, " ") || len(src) != 2 {
		t.Errorf("BLOB rows differ:\n source %v\n target %v", src, dst)
	}
	peak := max(txPeak, blobPeak)
	if peak > rssLimitMiB {
		t.Errorf("peak RSS %d MiB > %d MiB", peak, rssLimitMiB)
	}
	report(t, "F10", figures{"rows_in_one_transaction": rows, "source_write_ms": ms(written), "apply_ms": ms(txApply),
		"apply_rows_per_s": int(float64(rows) / txApply.Seconds()), "tx_peak_rss_mib": txPeak,
		"blob_mib": blob >> 20, "blob_apply_ms": ms(blobApply), "blob_peak_rss_mib": blobPeak,
		"mismatches": diffs[0].Missing + diffs[0].Extra + diffs[0].Changed, "rss_limit_mib": rssLimitMiB})
}

// F12: the target table is locked (ACCESS EXCLUSIVE) for 60 s while the
// source keeps writing. Apply blocks; back-pressure (bounded channels and
// go-mysql's bounded event buffer, then TCP) keeps the daemon's memory
// bounded; once the lock is released the lag recovers. I1–I5 hold.
func TestF12TargetTableLocked(t *testing.T) {
	f := newFixture(t)
	db, start := f.newSource(t, "it_f12_")
	w := newWorkload(t, f, db, "Asia/Kolkata", 1000)
	led := newLedger(t, f, db)
	cfg := f.relConfig(t, db, db, relOpts{Zone: "Asia/Kolkata", Start: start})
	watchI5(t, f, db)
	mon := startMonitor(t, f, db, db, led)
	d := f.startDaemon(t, cfg)
	t.Cleanup(func() {
		if !d.exited() {
			d.kill()
		}
	})
	f.caughtUpIn(t, db, d, 2*time.Minute)
	i5Watched(t, f, db, "orders", "ticks")
	startLedger(t, led, 20*time.Millisecond)
	load := startLoad(t, f.env, w, false, 5*time.Millisecond)
	time.Sleep(2 * time.Second)

	lock, err := f.env.PG(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close(f.ctx)
	tx, err := lock.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, fmt.Sprintf("LOCK TABLE %s IN ACCESS EXCLUSIVE MODE", pgx.Identifier{db, "orders"}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	mem := sampleRSS(d, time.Second)
	const hold = 60 * time.Second
	time.Sleep(hold)
	srcAtRelease, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	ckptAtRelease, _, err := harness.StoredCheckpoint(f.ctx, f.pg, "", db)
	if err != nil {
		t.Fatal(err)
	}
	if d.exited() {
		t.Fatalf("the daemon exited while the table was locked:\n%s", tail(d.stderr.String(), 20))
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	if err := harness.WaitCaughtUp(f.ctx, f.pg, "", db, srcAtRelease, 5*time.Minute); err != nil {
		t.Fatalf("lag did not recover after the lock was released: %v\n%s", err, tail(d.stderr.String(), 20))
	}
	recovery := time.Since(released)
	lockPeak := mem.Stop()
	if err := load.Stop(); err != nil {
		t.Fatal(err)
	}
	led.Stop()
	f.caughtUpIn(t, db, d, 2*time.Minute)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(d.stderr.String(), 20))
	}
	checkMonitor(t, mon, led)
	diffs := f.checkEqual(t,
		harness.TableSpec{Database: db, Table: "orders", SourceZone: "Asia/Kolkata"},
		harness.TableSpec{Database: db, Table: "ticks", SourceZone: "Asia/Kolkata"})
	checkI5(t, f, db, false)
	if lockPeak > rssLimitMiB {
		t.Errorf("peak RSS %d MiB while the table was locked > %d MiB", lockPeak, rssLimitMiB)
	}
	lagTx := seqOf(srcAtRelease.GTID) - seqOf(ckptAtRelease.GTID)
	report(t, "F12", figures{"lock_s": int(hold.Seconds()), "lag_transactions_at_release": lagTx, "recovery_ms": ms(recovery),
		"peak_rss_mib": lockPeak, "rss_series_mib_first_last": []int64{mem.rssSeries[0] / 1024, mem.rssSeries[len(mem.rssSeries)-1] / 1024},
		"transactions": w.Stats.Transactions, "mismatches": diffs[0].Missing + diffs[0].Extra + diffs[0].Changed + diffs[1].Missing + diffs[1].Extra + diffs[1].Changed,
		"rss_limit_mib": rssLimitMiB})
}

// seqOf returns the sequence number of a one-domain MariaDB GTID position.
func seqOf(gtid string) int64 {
	i := strings.LastIndexByte(gtid, '-')
	n, _ := strconv.ParseInt(gtid[i+1:], 10, 64)
	return n
}
