package integration

import (
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
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
	db := testenv.Name(prefix)
	f.dropLater(t, db, db)
	start, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	r := &restartRun{f: f, db: db}
	r.w = newWorkload(t, f, db, "Asia/Kolkata", 1000)
	r.led = newLedger(t, f, db)
	cfg := f.relConfig(t, db, db, relOpts{Zone: "Asia/Kolkata", Start: start, Addr: myP.Addr, Heartbeat: "1s", ReadTimeout: "3s"})
	watchI5(t, f, db)
	r.mon = startMonitor(t, f, db, db, r.led)
	r.d = f.startDaemon(t, cfg, "TM_IT_PG_DSN="+u.String())
	t.Cleanup(func() {
		if !r.d.exited() {
			r.d.kill()
		}
	})
	f.caughtUpIn(t, db, r.d, 2*time.Minute)
	i5Watched(t, f, db, "orders", "ticks")
	startLedger(t, r.led, 20*time.Millisecond)
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
	detected := testenv.WaitFor(20*time.Second, func() bool {
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
	if !testenv.WaitFor(10*time.Second, func() bool { return strings.Count(r.d.stderr.String(), "binlog stream interrupted") > before }) {
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
	// Noticed: a retry, or (when the hang caught a COMMIT) the warning the
	// sink logs before it asks whether that COMMIT happened.
	hung := countLines(r.d.stderr.String(), "no answer to COMMIT within apply_timeout")
	detected := testenv.WaitFor(40*time.Second, func() bool {
		logs := r.d.stderr.String()
		return countLines(logs, "retrying after transient error") > retries || countLines(logs, "no answer to COMMIT within apply_timeout") > hung || r.d.exited()
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

// TestF8SourceSQLHalfOpen: the source's SQL connections (not the binlog
// stream) go half-open in the middle of their work: every answer is slowed
// down by 100 ms (so the run is still going), then the proxy in front of
// MariaDB swallows every byte both ways and keeps the connections open. A
// catch-up (`tidemark catchup`), a verify (`tidemark verify`) and the
// daemon's first snapshot each wait on such a connection for an answer
// that never comes; with query_timeout 2s each must fail with an error
// naming the timeout (the daemon retries, logging it) instead of hanging,
// and the daemon must catch up once the network heals. The daemon's schema
// lookups while streaming use the same connection and bound.
//
// Was a bug: go-mysql's SQL client sets no read deadline unless asked, and
// the server waits for the rest of a command for wait_timeout (8 h), so
// each of them waited, silently, for hours.
func TestF8SourceSQLHalfOpen(t *testing.T) {
	f := newFixture(t)
	myP, err := harness.NewFaultProxy("mariadb-sql", f.env.MySQLAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(myP.Close)
	db := testenv.Name("it_f8sql_")
	f.dropLater(t, db, db, db+"_d")
	if err := harness.Exec(f.my, "CREATE DATABASE "+db, "USE "+db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
		"INSERT INTO t SELECT seq, seq FROM seq_1_to_1000"); err != nil {
		t.Fatal(err)
	}
	cfg := f.relConfig(t, db, db, relOpts{Addr: myP.Addr, ReadTimeout: "3s", Source: []string{"query_timeout: 2s"},
		Extra: "fallback:\n  chunk_rows: 10\nverify:\n  chunk_rows: 10\n"})
	slow := func() {
		mustAdd(t, myP, harness.Toxic{Name: "slow", Type: "latency", Attributes: map[string]any{"latency": 100}})
	}
	hang := func() {
		mustAdd(t, myP,
			harness.Toxic{Name: "hang_down", Type: "timeout", Stream: "downstream", Attributes: map[string]any{"timeout": 0}},
			harness.Toxic{Name: "hang_up", Type: "timeout", Stream: "upstream", Attributes: map[string]any{"timeout": 0}})
	}
	fig := figures{}
	for _, name := range []string{"catchup", "verify"} {
		if name == "verify" {
			// Verify compares with a target: a catch-up on a healthy
			// network writes it.
			if code, out := runBinary(t, 2*time.Minute, []string{"TM_IT_MYSQL_PASSWORD=" + f.env.MySQLPassword, "TM_IT_PG_DSN=" + f.env.PGDSN}, "catchup", "--config", cfg); code != 0 {
				t.Fatalf("catchup on a healthy network: exit %d\n%s", code, tail(out, 10))
			}
		}
		slow()
		cmd := exec.Command(binPath, name, "--config", cfg)
		cmd.Env = append(os.Environ(), "TM_IT_MYSQL_PASSWORD="+f.env.MySQLPassword, "TM_IT_PG_DSN="+f.env.PGDSN)
		var out lockedWriter
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		if name == "catchup" {
			// Hang in the middle of the table's reads: once rows arrive.
			testenv.WaitFor(30*time.Second, func() bool {
				var n int
				_ = f.pg.QueryRow(f.ctx, "SELECT count(*) FROM "+pgx.Identifier{db, "t"}.Sanitize()).Scan(&n)
				return n > 0
			})
		} else {
			time.Sleep(time.Second) // verify of 1,000 rows in chunks of 10 at +100 ms per answer runs for seconds
		}
		hung := time.Now()
		hang()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("%s on a half-open source connection still waiting after 60 s (query_timeout 2s):\n%s", name, tail(out.String(), 10))
		}
		took := time.Since(hung)
		myP.RemoveAll()
		if code := cmd.ProcessState.ExitCode(); code == 0 || !strings.Contains(out.String(), "query_timeout 2s") {
			t.Errorf("%s on a half-open source connection: exit %d %s after the hang, want a failure naming query_timeout:\n%s", name, code, took.Round(time.Millisecond), out.String())
		}
		fig[name+"_fails_after_ms"] = ms(took)
	}
	// The daemon's first snapshot: it retries, saying why, and carries on
	// once the network heals.
	if _, err := f.pg.Exec(f.ctx, "DROP SCHEMA IF EXISTS "+db+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	// A source name of its own: no checkpoint, so the daemon starts with
	// a snapshot.
	cfgD := f.relConfig(t, db+"_d", db, relOpts{Addr: myP.Addr, ReadTimeout: "3s", Source: []string{"query_timeout: 2s"},
		Extra: "fallback:\n  chunk_rows: 10\n", TargetSchema: db})
	slow()
	d := f.startDaemon(t, cfgD)
	t.Cleanup(func() {
		if !d.exited() {
			d.kill()
		}
	})
	testenv.WaitFor(30*time.Second, func() bool { return strings.Contains(d.stderr.String(), "catch-up started") || d.exited() })
	time.Sleep(time.Second)
	hung := time.Now()
	hang()
	noticed := testenv.WaitFor(30*time.Second, func() bool { return strings.Contains(d.stderr.String(), "query_timeout 2s") || d.exited() })
	fig["daemon_notices_after_ms"] = ms(time.Since(hung))
	myP.RemoveAll()
	if !noticed || d.exited() {
		t.Fatalf("the daemon's snapshot on a half-open connection: no retry naming query_timeout within 30 s (exited %v):\n%s", d.exited(), tail(d.stderr.String(), 10))
	}
	took := f.caughtUpIn(t, db+"_d", d, 2*time.Minute)
	fig["daemon_recovery_ms"] = ms(took)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(d.stderr.String(), 20))
	}
	f.compare(t, harness.TableSpec{Database: db, Table: "t"})
	report(t, "F8-source-sql-half-open", fig)
}
