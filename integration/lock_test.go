package integration

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/binlog"
	"tidemark/checkpoint"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
	"tidemark/sink/postgres"
)

// TestDaemonStopsOnLostSourceLock: the active daemon's source lock (a
// session-level advisory lock in PostgreSQL) ends while the daemon runs —
// here pg_terminate_backend of the lock's session, as idle_session_timeout,
// a pooler or a PostgreSQL failover would end it — and another session
// takes it. The daemon must notice within seconds and stop with an error
// naming the lost lock, so that the standby that takes the lock is the only
// writer (review finding 12). A lock that is still free is taken again by
// the active daemon (TestSourceLockRetaken, and the PostgreSQL restarts of
// TestF3…).
func TestDaemonStopsOnLostSourceLock(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_lock_")
	f.dropLater(t, db, db)
	start := f.binlogStart(t)
	w := &harness.Workload{My: f.my, Database: db, Zone: "UTC", Rand: rand.New(rand.NewPCG(105, 106)), BigTxRows: 20}
	if err := w.Setup(); err != nil {
		t.Fatal(err)
	}
	cfg := f.configYAML(t, db, db, db, "UTC", start)
	active := f.startDaemon(t, cfg)
	defer active.kill()
	if err := w.Run(20); err != nil {
		t.Fatal(err)
	}
	f.waitCaughtUp(t, db, active)
	// The standby runs on another host, with its own replica server_id
	// (with the same one the source itself would end one binlog stream).
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	standbyCfg := cfg + ".standby.yaml"
	if err := os.WriteFile(standbyCfg, []byte(regexp.MustCompile(`server_id: \d+`).ReplaceAllString(string(b), "server_id: 6999")), 0o600); err != nil {
		t.Fatal(err)
	}
	standby := f.startDaemon(t, standbyCfg)
	defer standby.kill()
	if !testenv.WaitFor(30*time.Second, func() bool {
		return strings.Contains(standby.stderr.String(), "another tidemark process is streaming this source")
	}) {
		t.Fatalf("the standby does not wait:\n%s", tail(standby.stderr.String(), 10))
	}
	h := fnv.New32a()
	h.Write([]byte(db))
	key := int64(h.Sum32()) // objid of pg_try_advisory_lock(0x746d, key), an oid
	var killed bool
	if err := f.pg.QueryRow(f.ctx, `SELECT pg_terminate_backend(pid, 5000) FROM pg_locks
WHERE locktype = 'advisory' AND classid = 29805 AND objid::bigint = $1 AND objsubid = 2 AND granted`, key).Scan(&killed); err != nil || !killed {
		t.Fatalf("terminate the lock's session: %v (%v)", err, killed)
	}
	// Another session takes the lock at once (this test's, unless the
	// standby was quicker): the active daemon, which would take the lock
	// again if it were free (a PostgreSQL restart: TestF3…), finds it held.
	var mine bool
	if err := f.pg.QueryRow(f.ctx, "SELECT pg_try_advisory_lock(29805, $1::bigint::bit(32)::int4)", key).Scan(&mine); err != nil {
		t.Fatalf("take the lock: %v", err)
	}
	if !testenv.WaitFor(30*time.Second, func() bool { return active.exited() }) {
		both := strings.Contains(standby.stderr.String(), "starting pipeline")
		t.Fatalf("30 s after its lock's session ended the active daemon still runs (the standby took the lock and streams too: %v):\nactive:\n%s\nstandby:\n%s",
			both, tail(active.stderr.String(), 8), tail(standby.stderr.String(), 8))
	}
	if out := active.stderr.String(); !strings.Contains(out, "lost the source lock") {
		t.Errorf("the active daemon stopped without naming the lost lock:\n%s", tail(out, 8))
	}
	if mine {
		if _, err := f.pg.Exec(f.ctx, "SELECT pg_advisory_unlock(29805, $1::bigint::bit(32)::int4)", key); err != nil {
			t.Fatalf("release the lock: %v", err)
		}
	}
	if !testenv.WaitFor(30*time.Second, func() bool { return strings.Contains(standby.stderr.String(), "starting pipeline") }) {
		t.Fatalf("the standby did not take over:\n%s", tail(standby.stderr.String(), 10))
	}
	if err := w.Run(20); err != nil {
		t.Fatal(err)
	}
	f.waitCaughtUp(t, db, standby)
	f.compare(t, harness.TableSpec{Database: db, Table: "orders", SourceZone: "UTC"})
}

// TestSourceLockRetaken: the lock's session ends (pg_terminate_backend,
// as a pooler or idle_session_timeout would end it) and nobody else takes
// the lock. The daemon takes it again on a new session, after proving from
// the checkpoint that nobody wrote meanwhile, and keeps streaming; target
// equals source.
func TestSourceLockRetaken(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_relock_")
	f.dropLater(t, db, db)
	start := f.binlogStart(t)
	w := &harness.Workload{My: f.my, Database: db, Zone: "UTC", Rand: rand.New(rand.NewPCG(107, 108)), BigTxRows: 20}
	if err := w.Setup(); err != nil {
		t.Fatal(err)
	}
	d := f.startDaemon(t, f.configYAML(t, db, db, db, "UTC", start))
	defer d.kill()
	if err := w.Run(20); err != nil {
		t.Fatal(err)
	}
	f.waitCaughtUp(t, db, d)
	h := fnv.New32a()
	h.Write([]byte(db))
	key := int64(h.Sum32())
	var killed bool
	if err := f.pg.QueryRow(f.ctx, `SELECT pg_terminate_backend(pid, 5000) FROM pg_locks
WHERE locktype = 'advisory' AND classid = 29805 AND objid::bigint = $1 AND objsubid = 2 AND granted`, key).Scan(&killed); err != nil || !killed {
		t.Fatalf("terminate the lock's session: %v (%v)", err, killed)
	}
	if !testenv.WaitFor(30*time.Second, func() bool { return strings.Contains(d.stderr.String(), "took the lock again") || d.exited() }) || d.exited() {
		t.Fatalf("the daemon did not take its free lock again:\n%s", tail(d.stderr.String(), 10))
	}
	var held bool
	if err := f.pg.QueryRow(f.ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
WHERE locktype = 'advisory' AND classid = 29805 AND objid::bigint = $1 AND objsubid = 2 AND granted)`, key).Scan(&held); err != nil || !held {
		t.Fatalf("the lock is not held after the daemon took it again: %v (%v)", err, held)
	}
	if err := w.Run(20); err != nil {
		t.Fatal(err)
	}
	f.waitCaughtUp(t, db, d)
	f.compare(t, harness.TableSpec{Database: db, Table: "orders", SourceZone: "UTC"})
}

// TestStandbyWithSameServerIDTakesOver: the active pipeline's lock session
// ends and the standby, configured like it (the same replica server_id),
// takes the lock and starts streaming. MariaDB then ends the active
// pipeline's binlog dump ("ERROR 4052 … A slave with the same
// server_uuid/server_id is already connected") before its periodic lock
// check (an hour here) has run. The active pipeline must find out at once
// that it lost the lock and stop with ErrSourceLockLost, the documented end
// of a writer another took over from, not with the source's error (nemesis
// seeds 121, 25, 9: exit 1 on ERROR 4052); the standby streams on alone.
func TestStandbyWithSameServerIDTakesOver(t *testing.T) {
	r := harness.NewReplica(t, "itsid")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bc := binlog.Config{Name: r.DB, Addr: r.Env.MySQLAddr, User: r.Env.MySQLUser, Password: r.Env.MySQLPassword,
		ServerID: testenv.ServerID(), Include: []string{r.DB + ".*"}, Heartbeat: time.Second}
	store, err := checkpoint.New(checkpoint.Config{Schema: r.Control})
	if err != nil {
		t.Fatal(err)
	}
	type member struct {
		p    *tidemark.Pipeline
		done chan error
		log  *lockedWriter
	}
	start := func(name string, lockCheck time.Duration) *member {
		t.Helper()
		tl, err := binlog.New(bc)
		if err != nil {
			t.Fatal(err)
		}
		m := &member{done: make(chan error, 1), log: &lockedWriter{}}
		log := slog.New(slog.NewTextHandler(m.log, nil)).With("member", name)
		sink, err := postgres.Open(ctx, postgres.Config{DSN: r.Env.PGDSN, Checkpoints: store, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sink.Close() })
		if m.p, err = tidemark.NewPipeline(tidemark.PipelineConfig{Source: bc.Name, MaxDelay: 20 * time.Millisecond, LockCheckInterval: lockCheck, Logger: log}, tl, nil, sink); err != nil {
			t.Fatal(err)
		}
		go func() { m.done <- m.p.Run(ctx, r.Start) }()
		return m
	}
	caughtUp := func(m *member) {
		t.Helper()
		target, err := harness.SourcePosition(r.My)
		if err != nil {
			t.Fatal(err)
		}
		if !testenv.WaitFor(time.Minute, func() bool {
			_, last := m.p.Totals()
			c, err := (tidemark.Position{GTID: last.GTID}).Compare(target)
			return err == nil && c >= 0
		}) {
			t.Fatalf("not caught up to %s:\n%s", target, tail(m.log.String(), 10))
		}
	}
	r.Source("CREATE TABLE "+r.DB+".t (id INT PRIMARY KEY, v INT)", "INSERT INTO "+r.DB+".t VALUES (1, 1), (2, 2)")
	active := start("active", time.Hour)
	caughtUp(active)
	standby := start("standby", 0)
	if !testenv.WaitFor(30*time.Second, func() bool {
		return strings.Contains(standby.log.String(), "another tidemark process is streaming this source")
	}) {
		t.Fatalf("the standby does not wait:\n%s", tail(standby.log.String(), 10))
	}
	h := fnv.New32a()
	h.Write([]byte(bc.Name))
	var killed bool
	if err := r.PG.QueryRow(ctx, `SELECT pg_terminate_backend(pid, 5000) FROM pg_locks
WHERE locktype = 'advisory' AND classid = 29805 AND objid::bigint = $1 AND objsubid = 2 AND granted`, int64(h.Sum32())).Scan(&killed); err != nil || !killed {
		t.Fatalf("terminate the lock's session: %v (%v)", err, killed)
	}
	select {
	case err := <-active.done:
		if !errors.Is(err, tidemark.ErrSourceLockLost) {
			t.Fatalf("the active pipeline stopped with %v, want ErrSourceLockLost:\n%s", err, tail(active.log.String(), 10))
		}
	case err := <-standby.done:
		t.Fatalf("the standby stopped: %v\n%s", err, tail(standby.log.String(), 10))
	case <-ctx.Done():
		t.Fatalf("the active pipeline still runs after the standby took its lock and server_id:\nactive:\n%s\nstandby:\n%s",
			tail(active.log.String(), 10), tail(standby.log.String(), 10))
	}
	r.Source("INSERT INTO "+r.DB+".t VALUES (3, 3)", "UPDATE "+r.DB+".t SET v = 10 WHERE id = 1")
	caughtUp(standby)
	var n, sum int
	if err := r.PG.QueryRow(ctx, `SELECT count(*), sum(v) FROM "`+r.DB+`".t`).Scan(&n, &sum); err != nil || n != 3 || sum != 15 {
		t.Fatalf("target: %d rows, sum %d (%v); want 3 rows, sum 15", n, sum, err)
	}
	cancel()
	if err := <-standby.done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("standby: %v", err)
	}
}
