package integration

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

const acctDDL = `CREATE TABLE acct (
	id BIGINT NOT NULL PRIMARY KEY,
	balance BIGINT NOT NULL,
	note VARCHAR(64),
	updated_at DATETIME(6) NOT NULL
)`

// acctLoad writes to db.acct: inserts of new ids, updates of ids 1–500
// (never deleted), deletes of ids 501–1000 (each once). Nothing it does is
// a no-op in the target, so the only changes a sink may count as skipped
// are true replays.
type acctLoad struct {
	db      string
	mu      sync.Mutex
	next    int64 // next id to insert
	nextDel int64 // next id to delete
	rnd     *rand.Rand
	txns    int
}

func newAcctLoad(t *testing.T, c *client.Conn, db string) *acctLoad {
	t.Helper()
	if err := harness.Exec(c, "CREATE DATABASE "+db, "USE "+db, acctDDL); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i := 1; i <= 1000; i++ {
		if i > 1 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "(%d, %d, 'seed', NOW(6))", i, i)
	}
	if err := harness.Exec(c, "INSERT INTO acct VALUES "+b.String()); err != nil {
		t.Fatal(err)
	}
	return &acctLoad{db: db, next: 100000, nextDel: 501, rnd: rand.New(rand.NewPCG(7, 13))}
}

// step runs one transaction on c.
func (l *acctLoad) step(c *client.Conn) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var sqls []string
	switch r := l.rnd.IntN(10); {
	case r < 4:
		sqls = []string{fmt.Sprintf("INSERT INTO %s.acct VALUES (%d, 0, 'new', NOW(6))", l.db, l.next)}
		l.next++
	case r < 8 || l.nextDel > 1000:
		sqls = []string{fmt.Sprintf("UPDATE %s.acct SET balance = balance + 1, note = 'tx %d', updated_at = NOW(6) WHERE id = %d", l.db, l.txns, 1+l.rnd.IntN(500))}
	case r < 9:
		sqls = []string{fmt.Sprintf("DELETE FROM %s.acct WHERE id = %d", l.db, l.nextDel)}
		l.nextDel++
	default:
		// A multi-statement transaction.
		sqls = []string{"BEGIN"}
		for k := 0; k < 5; k++ {
			sqls = append(sqls, fmt.Sprintf("UPDATE %s.acct SET balance = balance - 1 WHERE id = %d", l.db, 1+l.rnd.IntN(500)))
		}
		sqls = append(sqls, fmt.Sprintf("INSERT INTO %s.acct VALUES (%d, 5, 'multi', NOW(6))", l.db, l.next), "COMMIT")
		l.next++
	}
	if err := harness.Exec(c, sqls...); err != nil {
		return err
	}
	l.txns++
	return nil
}

// runFor writes transactions on c for d (under a running daemon).
func (l *acctLoad) runFor(t *testing.T, c *client.Conn, d time.Duration) int {
	t.Helper()
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end); n++ {
		if err := l.step(c); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// waitCheckpointAt waits until the stored checkpoint of source has reached
// the GTID position of server s.
func (f *fixture) waitCheckpointAt(t *testing.T, source string, s *privateMy, d *daemonProc) time.Duration {
	t.Helper()
	target := tidemark.Position{GTID: s.root(t, "SELECT @@gtid_binlog_pos")}
	start := time.Now()
	if err := harness.WaitCaughtUp(f.ctx, f.pg, "", source, target, 120*time.Second); err != nil {
		t.Fatalf("%v\ndaemon stderr:\n%s", err, tail(d.stderr.String(), 40))
	}
	return time.Since(start)
}

var skippedRE = regexp.MustCompile(`msg="stopped cleanly".* skipped=(\d+)`)

// TestFailoverFollowed is the real failover of issue 13: a primary and a
// replica (log_slave_updates, gtid_strict_mode) on loopback, tidemark
// streaming from the primary through a fixed address (a proxy, standing for
// a virtual IP) under a write load. The primary is killed, the replica
// promoted, the address pointed at it and the writes moved to it; the
// running tidemark reconnects, finds another server (identity check on
// every reconnect), follows it by GTID in the next epoch, and the target
// equals the new primary with nothing skipped and no duplicate key.
//
// With version: filepos the old primary's binlog is several files ahead of
// the replica's, so before epochs every change from the new primary had a
// lower version than the rows in the target and was skipped.
func TestFailoverFollowed(t *testing.T) {
	for _, scheme := range []string{"gtid", "filepos"} {
		t.Run(scheme, func(t *testing.T) {
			f := newFixture(t)
			a := f.startPrivateMariaDB(t, 11)
			b := f.startPrivateMariaDB(t, 12)
			f.replicateFrom(t, b, a)
			// The old primary's binlog files are ahead of the replica's.
			a.root(t, "FLUSH BINARY LOGS; FLUSH BINARY LOGS; FLUSH BINARY LOGS;")
			proxy, err := harness.NewFaultProxy("failover-"+scheme, a.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer proxy.Close()

			db := testenv.Name("it_fo_")
			source := db
			f.dropLater(t, db, source)
			ca := f.connPrivate(t, a)
			load := newAcctLoad(t, ca, db)
			cfg := f.configYAML(t, source, db, db, "UTC", tidemark.Position{})
			setSourceOption(t, cfg, "addr", proxy.Addr)
			setSourceOption(t, cfg, "version", scheme)
			d := f.startDaemon(t, cfg)
			defer func() {
				if !d.exited() {
					d.kill()
				}
			}()
			// The first run snapshots the table; the load starts after it
			// (a delete the snapshot already reflects is skipped when the
			// binlog replays it, a true replay this test does not count).
			f.waitCheckpointAt(t, source, a, d)
			nA := load.runFor(t, ca, 2*time.Second)
			f.waitCheckpointAt(t, source, a, d)
			waitReplicated(t, b, a)

			// Failover: the primary dies, the replica is promoted, the
			// address moves, the writes follow.
			a.kill()
			b.promote(t)
			switched := time.Now()
			if err := proxy.Retarget(b.Addr); err != nil {
				t.Fatal(err)
			}
			// The running daemon reconnects (the proxy closed its
			// connections) and finds another server.
			if !testenv.WaitFor(60*time.Second, func() bool { return strings.Contains(d.stderr.String(), "server 11 → 12") }) {
				t.Fatalf("the switch was not noticed:\n%s", tail(d.stderr.String(), 30))
			}
			followed := time.Since(switched)
			cb := f.connPrivate(t, b)
			nB := load.runFor(t, cb, 2*time.Second)
			lag := f.waitCheckpointAt(t, source, b, d)
			if code := d.stop(t); code != 0 {
				t.Fatalf("exit %d\n%s", code, tail(d.stderr.String(), 40))
			}
			log := d.stderr.String()
			if !strings.Contains(log, "server 11 → 12") {
				t.Fatalf("the switch is not in the log:\n%s", tail(log, 40))
			}
			m := skippedRE.FindStringSubmatch(log)
			if m == nil || m[1] != "0" {
				t.Fatalf("skipped changes after the failover (want 0, nothing was replayed): %v\n%s", m, tail(log, 20))
			}
			diff, err := harness.Compare(f.ctx, cb, f.pg, harness.TableSpec{Database: db, Table: "acct", SourceZone: "UTC"})
			if err != nil {
				t.Fatal(err)
			}
			if !diff.Equal() {
				t.Fatalf("target differs from the new primary: %s\n%s", diff, strings.Join(diff.Examples, "\n"))
			}
			pos, _, err := harness.StoredCheckpoint(f.ctx, f.pg, "", source)
			if err != nil {
				t.Fatal(err)
			}
			if pos.Epoch != 1 || pos.Source.Server != "12" {
				t.Fatalf("checkpoint %s: want epoch 1 on server 12", pos)
			}
			report(t, "failover followed ("+scheme+")", figures{
				"txns_old_primary": nA, "txns_new_primary": nB, "rows": diff.SourceRows,
				"switch_noticed_ms": ms(followed), "drain_after_writes_ms": ms(lag), "skipped": 0,
			})
		})
	}
}

// TestFailoverToLaggingReplicaStops is the lagging-replica case: the
// replica stops applying, the primary commits transactions tidemark
// applies, then the primary dies and the replica is promoted without them.
// tidemark cannot follow (the new primary lacks changes the target has): it
// stops with one error naming what changed and what to do. `tidemark
// catchup` then re-reads the tables from the new primary in the next
// epoch, and `tidemark verify` lists the rows only the old primary had.
func TestFailoverToLaggingReplicaStops(t *testing.T) {
	f := newFixture(t)
	a := f.startPrivateMariaDB(t, 21)
	b := f.startPrivateMariaDB(t, 22)
	f.replicateFrom(t, b, a)
	proxy, err := harness.NewFaultProxy("failover-lag", a.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	db := testenv.Name("it_lag_")
	source := db
	f.dropLater(t, db, source)
	ca := f.connPrivate(t, a)
	load := newAcctLoad(t, ca, db)
	cfg := f.configYAML(t, source, db, db, "UTC", tidemark.Position{})
	setSourceOption(t, cfg, "addr", proxy.Addr)
	d := f.startDaemon(t, cfg)
	defer func() {
		if !d.exited() {
			d.kill()
		}
	}()
	load.runFor(t, ca, time.Second)
	f.waitCheckpointAt(t, source, a, d)
	waitReplicated(t, b, a)
	// The replica stops applying; the primary goes on, tidemark applies.
	b.root(t, "STOP SLAVE")
	const lost = 25
	for i := 0; i < lost; i++ {
		if err := harness.Exec(ca, fmt.Sprintf("INSERT INTO %s.acct VALUES (%d, 1, 'only on the old primary', NOW(6))", db, 900000+i)); err != nil {
			t.Fatal(err)
		}
	}
	f.waitCheckpointAt(t, source, a, d)
	a.kill()
	b.promote(t)
	switched := time.Now()
	if err := proxy.Retarget(b.Addr); err != nil {
		t.Fatal(err)
	}
	cb := f.connPrivate(t, b)
	// Writes on the new primary (inserts only: a hard delete made while
	// tidemark refuses to go on is not seen by the catch-up below, whose
	// window reads cannot see deletes — its documented limit — and would
	// show up in verify beside the rows only the old primary had).
	for i := 0; i < 20; i++ {
		if err := harness.Exec(cb, fmt.Sprintf("INSERT INTO %s.acct VALUES (%d, 1, 'on the new primary', NOW(6))", db, 800000+i)); err != nil {
			t.Fatal(err)
		}
	}
	// tidemark stops by itself, with one clear error.
	if !testenv.WaitFor(90*time.Second, d.exited) {
		t.Fatalf("tidemark goes on after a failover to a lagging replica:\n%s", tail(d.stderr.String(), 30))
	}
	log := d.stderr.String()
	stoppedAfter := time.Since(switched)
	if code := d.cmd.ProcessState.ExitCode(); code == 0 {
		t.Fatalf("exit 0 after a refused failover:\n%s", tail(log, 30))
	}
	for _, want := range []string{"server 21 → 22", "lacks transactions tidemark already applied", "tidemark catchup"} {
		if !strings.Contains(log, want) {
			t.Fatalf("the error does not say %q:\n%s", want, tail(log, 30))
		}
	}
	// go-mysql's own line about the broken connection aside.
	if n := countLines(log, "level=ERROR") - countLines(log, "level=ERROR msg=\"io.ReadFull"); n != 1 {
		t.Errorf("%d error lines, want one:\n%s", n, tail(log, 30))
	}
	// The operator's fix: catch up from the new primary, then verify.
	out := f.runCatchup(t, cfg)
	pos, _, err := harness.StoredCheckpoint(f.ctx, f.pg, "", source)
	if err != nil {
		t.Fatal(err)
	}
	if pos.Epoch != 1 || pos.Source.Server != "22" {
		t.Fatalf("checkpoint after catchup %s: want epoch 1 on server 22\n%s", pos, out)
	}
	// The catch-up re-reads every table in full, and a full read into a
	// target that holds rows ends with the key diff: the rows only the old
	// primary had are removed, and counted.
	if !regexp.MustCompile(fmt.Sprintf(`deletes=%d\b`, lost)).MatchString(out) {
		t.Fatalf("the catch-up does not report the %d rows only the old primary had as deleted:\n%s", lost, out)
	}
	code, vout := runBinary(t, 2*time.Minute, []string{"TM_IT_MYSQL_PASSWORD=" + f.env.MySQLPassword, "TM_IT_PG_DSN=" + f.env.PGDSN}, "verify", "--config", cfg, "--examples", "100")
	if code != 0 || strings.Contains(vout, "extra in target") {
		t.Fatalf("verify after a lagging failover and its catch-up: exit %d, want 0 (the rows only the old primary had removed):\n%s", code, vout)
	}
	// And streaming goes on from the new primary.
	d = f.startDaemon(t, cfg)
	load.runFor(t, cb, 500*time.Millisecond)
	f.waitCheckpointAt(t, source, b, d)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, tail(d.stderr.String(), 30))
	}
	report(t, "failover to a lagging replica", figures{"target_only_rows": lost, "stopped_after_ms": ms(stoppedAfter)})
}

// TestResetMasterWhileStopped: RESET MASTER on the source while tidemark is
// stopped. The binlog starts again at GTID 0-31-1, behind the checkpoint:
// tidemark refuses to resume (the changes between the checkpoint and the
// reset are in no binlog) with one error naming what to do. `tidemark
// catchup` re-reads the table in the next epoch: its rows and every later
// change win over the rows written before the reset, whose versions (GTID
// sequence numbers before the reset) are higher than the new ones — the
// finding-1 case where every later change used to be skipped.
func TestResetMasterWhileStopped(t *testing.T) {
	f := newFixture(t)
	a := f.startPrivateMariaDB(t, 31)
	db := testenv.Name("it_reset_")
	source := db
	f.dropLater(t, db, source)
	ca := f.connPrivate(t, a)
	load := newAcctLoad(t, ca, db)
	// The key diff finds the rows deleted while tidemark was stopped.
	cfg := f.configYAMLWith(t, source, db, db, "UTC", tidemark.Position{},
		fmt.Sprintf("fallback:\n  tables:\n    %s.acct: {column: updated_at, delete_detection: keydiff}\n", db))
	setSourceOption(t, cfg, "addr", a.Addr)
	d := f.startDaemon(t, cfg)
	f.waitCheckpointAt(t, source, a, d)
	load.runFor(t, ca, time.Second)
	f.waitCheckpointAt(t, source, a, d)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, tail(d.stderr.String(), 30))
	}
	// Changes before the reset that tidemark never saw, then the reset,
	// then changes after it.
	load.runFor(t, ca, 300*time.Millisecond)
	a.root(t, "RESET MASTER")
	load.runFor(t, ca, 300*time.Millisecond)

	d = f.startDaemon(t, cfg)
	if !testenv.WaitFor(60*time.Second, d.exited) {
		d.kill()
		t.Fatalf("tidemark resumed after RESET MASTER:\n%s", tail(d.stderr.String(), 30))
	}
	log := d.stderr.String()
	for _, want := range []string{"behind the checkpoint", "RESET MASTER", "tidemark catchup"} {
		if !strings.Contains(log, want) {
			t.Fatalf("the error does not say %q:\n%s", want, tail(log, 30))
		}
	}
	out := f.runCatchup(t, cfg)
	pos, _, err := harness.StoredCheckpoint(f.ctx, f.pg, "", source)
	if err != nil {
		t.Fatal(err)
	}
	if pos.Epoch != 1 {
		t.Fatalf("checkpoint after catchup %s: want epoch 1\n%s", pos, out)
	}
	d = f.startDaemon(t, cfg)
	load.runFor(t, ca, 500*time.Millisecond)
	f.waitCheckpointAt(t, source, a, d)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, tail(d.stderr.String(), 30))
	}
	diff, err := harness.Compare(f.ctx, ca, f.pg, harness.TableSpec{Database: db, Table: "acct", SourceZone: "UTC"})
	if err != nil {
		t.Fatal(err)
	}
	if !diff.Equal() {
		t.Fatalf("target differs from the source after RESET MASTER and catchup: %s\n%s", diff, strings.Join(diff.Examples, "\n"))
	}
	report(t, "RESET MASTER while stopped", figures{"rows": diff.SourceRows})
}

// TestSeveralGTIDDomains is finding 4 of issue 13 on a real MariaDB: with a
// second GTID domain in the binlog, version: gtid is refused at start —
// before any row is applied, with the setting named — instead of stopping
// when the second domain's first event arrives (and again after every
// restart). version: filepos replicates both domains, resuming by GTID per
// domain.
func TestSeveralGTIDDomains(t *testing.T) {
	f := newFixture(t)
	s := f.startPrivateMariaDB(t, 51)
	db := testenv.Name("it_dom_")
	f.dropLater(t, db, db)
	c := f.connPrivate(t, s)
	if err := harness.Exec(c, "CREATE DATABASE "+db, "CREATE TABLE "+db+".t (id INT PRIMARY KEY, v INT)",
		"INSERT INTO "+db+".t VALUES (1, 0)",
		"SET SESSION gtid_domain_id = 7", "INSERT INTO "+db+".t VALUES (2, 7)",
		"SET SESSION gtid_domain_id = 0", "INSERT INTO "+db+".t VALUES (3, 0)"); err != nil {
		t.Fatal(err)
	}
	cfg := f.configYAML(t, db, db, db, "UTC", tidemark.Position{GTID: "0-51-1"})
	setSourceOption(t, cfg, "addr", s.Addr)
	code, out := runBinary(t, time.Minute, []string{"TM_IT_MYSQL_PASSWORD=" + f.env.MySQLPassword, "TM_IT_PG_DSN=" + f.env.PGDSN}, "run", "--config", cfg)
	if code == 0 || !strings.Contains(out, "2 GTID domains") || !strings.Contains(out, "source.version: filepos") {
		t.Fatalf("version: gtid with two domains: exit %d, want a refusal naming the setting:\n%s", code, tail(out, 20))
	}
	if pos, ok, _ := harness.StoredCheckpoint(f.ctx, f.pg, "", db); ok {
		t.Fatalf("a checkpoint (%s) was stored before the refusal: rows were applied", pos)
	}
	setSourceOption(t, cfg, "version", "filepos")
	d := f.startDaemon(t, cfg)
	if err := harness.Exec(c, "SET SESSION gtid_domain_id = 7", "UPDATE "+db+".t SET v = 77 WHERE id = 2", "SET SESSION gtid_domain_id = 0", "UPDATE "+db+".t SET v = 11 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	f.waitCheckpointAt(t, db, s, d)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, tail(d.stderr.String(), 30))
	}
	diff, err := harness.Compare(f.ctx, c, f.pg, harness.TableSpec{Database: db, Table: "t", SourceZone: "UTC"})
	if err != nil {
		t.Fatal(err)
	}
	if !diff.Equal() || diff.SourceRows != 3 {
		t.Fatalf("two domains under version: filepos: %s\n%s", diff, strings.Join(diff.Examples, "\n"))
	}
}
