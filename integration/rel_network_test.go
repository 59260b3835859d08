package integration

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"tidemark/integration/harness"
)

// networkRun is a daemon replicating through two in-process TCP fault
// proxies (toxiproxy): one in front of MariaDB, one in front of
// PostgreSQL. The load, ledger and monitor connect directly.
type networkRun struct {
	*restartRun
	myP, pgP *harness.FaultProxy
}

func startNetworkRun(t *testing.T, prefix string) *networkRun {
	t.Helper()
	f := newFixture(t)
	myP, err := harness.NewFaultProxy("mariadb", f.env.MySQLAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(myP.Close)
	u, err := url.Parse(f.env.PGDSN)
	if err != nil {
		t.Fatalf("TIDEMARK_TEST_PG_DSN must be a URL: %v", err)
	}
	pgP, err := harness.NewFaultProxy("postgres", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pgP.Close)
	u.Host = pgP.Addr
	db := randName(prefix)
	f.dropLater(t, db, db)
	start, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	r := &restartRun{f: f, db: db}
	r.w = newWorkload(t, f, db, "Asia/Kolkata", 1000)
	r.led = newLedger(t, f, db)
	cfg := f.relConfig(t, db, db, relOpts{Zone: "Asia/Kolkata", Start: start, Addr: myP.Addr, Heartbeat: "1s", ReadTimeout: "3s"})
	r.d = f.startDaemon(t, cfg, "TM_IT_PG_DSN="+u.String())
	t.Cleanup(func() {
		if !r.d.exited() {
			r.d.kill()
		}
	})
	f.caughtUpIn(t, db, r.d, 2*time.Minute)
	installI5(t, f, db, "orders", "order_id", "line_item_id")
	installI5(t, f, db, "ticks", "id")
	r.mon = startMonitor(t, f, db, db, r.led)
	r.led.start(t, 20*time.Millisecond)
	r.load = startLoad(t, f.env, r.w, false, 10*time.Millisecond)
	r.began = time.Now()
	return &networkRun{restartRun: r, myP: myP, pgP: pgP}
}

func mustAdd(t *testing.T, p *harness.FaultProxy, toxics ...harness.Toxic) {
	t.Helper()
	for _, x := range toxics {
		if err := p.Add(x); err != nil {
			t.Fatal(err)
		}
	}
}

// F8: network faults between tidemark and each database, one after the
// other under load: a half-open MariaDB connection (the proxy swallows
// everything and keeps the connection open) that only the binlog read
// timeout can detect; added latency with jitter; a bandwidth limit; a
// reset in the middle of a large transaction's binlog stream; a reset of
// the PostgreSQL connection during apply. After each fault the lag must
// recover; I1–I5 hold at the end.
func TestF8NetworkFaults(t *testing.T) {
	n := startNetworkRun(t, "it_f8_")
	f, r := n.f, n.restartRun
	fig := figures{}
	recoverAfter := func(name string) {
		t.Helper()
		if r.d.exited() {
			t.Fatalf("%s: the daemon exited:\n%s", name, tail(r.d.stderr.String(), 40))
		}
		took := f.caughtUpIn(t, r.db, r.d, 2*time.Minute)
		fig[name+"_recovery_ms"] = ms(took)
		r.recov = append(r.recov, took)
	}

	// 1. Half-open MariaDB connection: heartbeat 1s, read_timeout 3s.
	// This is the first interruption, so its log line is not rate-limited.
	before := strings.Count(r.d.stderr.String(), "binlog stream interrupted")
	hangAt := time.Now()
	mustAdd(t, n.myP, harness.Toxic{Name: "hang", Type: "timeout", Attributes: map[string]any{"timeout": 0}})
	detected := waitFor(20*time.Second, func() bool {
		return strings.Count(r.d.stderr.String(), "binlog stream interrupted") > before
	})
	detect := time.Since(hangAt)
	if !detected {
		t.Fatalf("a half-open MariaDB connection was not detected within 20 s (read_timeout 3s):\n%s", tail(r.d.stderr.String(), 20))
	}
	if detect > 10*time.Second {
		t.Errorf("half-open connection detected after %s; read_timeout is 3s", detect)
	}
	fig["mariadb_half_open_detect_ms"] = ms(detect)
	time.Sleep(2 * time.Second)
	if err := n.myP.Remove("hang"); err != nil {
		t.Fatal(err)
	}
	recoverAfter("mariadb_half_open")

	// 2. Latency with jitter, both directions, both databases.
	for _, p := range []*harness.FaultProxy{n.myP, n.pgP} {
		for _, s := range []string{"downstream", "upstream"} {
			mustAdd(t, p, harness.Toxic{Name: "lat_" + s, Type: "latency", Stream: s, Attributes: map[string]any{"latency": 100, "jitter": 50}})
		}
	}
	time.Sleep(5 * time.Second)
	n.myP.RemoveAll()
	n.pgP.RemoveAll()
	recoverAfter("latency_100ms")

	// 3. Bandwidth limits: the binlog stream and the rows sent to
	// PostgreSQL, 64 KB/s each.
	mustAdd(t, n.myP, harness.Toxic{Name: "bw", Type: "bandwidth", Attributes: map[string]any{"rate": 64}})
	mustAdd(t, n.pgP, harness.Toxic{Name: "bw", Type: "bandwidth", Stream: "upstream", Attributes: map[string]any{"rate": 64}})
	time.Sleep(6 * time.Second)
	n.myP.RemoveAll()
	n.pgP.RemoveAll()
	recoverAfter("bandwidth_64KBps")

	// 4. A reset in the middle of a large transaction's stream: 20,000
	// rows in one transaction, streamed at 256 KB/s, reset after 1.5 s.
	// 10 s since the last binlog interruption have passed (the tailer
	// rate-limits that line).
	time.Sleep(4 * time.Second)
	mustAdd(t, n.myP, harness.Toxic{Name: "bw", Type: "bandwidth", Attributes: map[string]any{"rate": 256}})
	big := make(chan error, 1)
	go func() {
		my, err := f.env.MySQL()
		if err != nil {
			big <- err
			return
		}
		defer my.Close()
		big <- harness.Exec(my, "USE "+r.db, "SET time_zone = 'Asia/Kolkata'",
			"INSERT INTO orders SELECT 10000000 + seq, 1, 'bulk', seq % 1000, 'new', 'reset me', NOW(6), NULL FROM seq_1_to_20000")
	}()
	if err := <-big; err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	before = strings.Count(r.d.stderr.String(), "binlog stream interrupted")
	mustAdd(t, n.myP, harness.Toxic{Name: "reset", Type: "reset_peer", Attributes: map[string]any{"timeout": 0}})
	if !waitFor(10*time.Second, func() bool { return strings.Count(r.d.stderr.String(), "binlog stream interrupted") > before }) {
		t.Errorf("the reset of the binlog stream was not noticed")
	}
	n.myP.RemoveAll()
	recoverAfter("mariadb_reset_mid_transaction")

	// 5. PostgreSQL connections reset during apply (the next bytes sent
	// to PostgreSQL get an RST), three times.
	for i := 0; i < 3; i++ {
		time.Sleep(700 * time.Millisecond)
		mustAdd(t, n.pgP, harness.Toxic{Name: "reset", Type: "reset_peer", Stream: "upstream", Attributes: map[string]any{"timeout": 0}})
		time.Sleep(300 * time.Millisecond)
		n.pgP.RemoveAll()
	}
	recoverAfter("postgres_reset")

	logs, mism := r.finish(t)
	fig["mismatches"] = mism
	fig["binlog_reconnect_lines"] = countLines(logs, "binlog stream interrupted")
	fig["sink_retry_lines"] = countLines(logs, "retrying after transient error")
	fig["transactions"] = r.w.Stats.Transactions
	fig["duration_s"] = int(time.Since(r.began).Seconds())
	fig["peak_rss_mib"] = r.peak
	fig["recovery_p50_ms"] = ms(percentile(r.recov, 0.5))
	fig["recovery_p99_ms"] = ms(percentile(r.recov, 0.99))
	report(t, "F8", fig)
}

// TestF8PostgresHalfOpen: the PostgreSQL connection goes half-open during
// apply: the proxy swallows every byte in both directions and keeps the
// connection open, as a peer that vanished without a FIN or RST would (a
// power loss, a partition, a failover to another host). The daemon must
// notice within 40 s (a read deadline; the binlog side has read_timeout,
// 3 × heartbeat) and, once the network heals, catch up.
//
// Was a bug (fixed with apply_timeout): the PostgreSQL sink set no
// deadline on a statement or a transaction, pgx has no read timeout, and
// TCP keepalive cannot help (pgx dials with a 5-minute keepalive, and here
// the peer's kernel still ACKs), so Apply waits forever for an answer that
// will never come: nothing is logged and the lag grows without bound until
// the connection is closed by someone else.
func TestF8PostgresHalfOpen(t *testing.T) {
	n := startNetworkRun(t, "it_f8pg_")
	f, r := n.f, n.restartRun
	time.Sleep(time.Second)
	retries := countLines(r.d.stderr.String(), "retrying after transient error")
	hangAt := time.Now()
	mustAdd(t, n.pgP,
		harness.Toxic{Name: "hang_down", Type: "timeout", Stream: "downstream", Attributes: map[string]any{"timeout": 0}},
		harness.Toxic{Name: "hang_up", Type: "timeout", Stream: "upstream", Attributes: map[string]any{"timeout": 0}})
	detected := waitFor(40*time.Second, func() bool {
		return countLines(r.d.stderr.String(), "retrying after transient error") > retries || r.d.exited()
	})
	detect := time.Since(hangAt)
	// Healing the network: removing the toxics also closes the hung
	// connections (toxiproxy), which any client notices at once; the
	// check above is the one that matters.
	n.pgP.RemoveAll()
	if !detected {
		t.Errorf("a half-open PostgreSQL connection went unnoticed for %s (no retry logged): the sink has no read deadline\ndaemon log (tail):\n%s",
			detect.Round(time.Second), tail(r.d.stderr.String(), 10))
	}
	took := f.caughtUpIn(t, r.db, r.d, 2*time.Minute)
	logs, mism := r.finish(t)
	report(t, "F8-pg-half-open", figures{"detect_ms": ms(detect), "detected": detected, "recovery_ms": ms(took), "mismatches": mism,
		"sink_retry_lines": countLines(logs, "retrying after transient error")})
}
