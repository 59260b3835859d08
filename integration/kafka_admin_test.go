package integration

import (
	"strings"
	"testing"
	"time"
)

// TestAdminCommandsDoNotFenceDaemon runs the daemon with PostgreSQL and
// Kafka (exactly_once, on the real broker) and, while it streams, the admin
// commands checkpoint, status, resync (a request to the running daemon) and
// catchup --table. None may initialize the daemon's transactional id: doing
// so fences the daemon (it exits with ErrFenced). catchup --table, which
// would write through that id, must refuse while a daemon streams the
// source. Afterwards the daemon must still be running, apply more changes,
// and stop cleanly; PostgreSQL equals the source and Kafka has every binlog
// change exactly once (plus the resync's snapshot rows, op r).
func TestAdminCommandsDoNotFenceDaemon(t *testing.T) {
	f := newFixture(t)
	r := f.newKafkaRun(t, "it_kadm_", 91, "")
	w, cfg, db := r.w, r.cfg, r.db
	env := []string{"TM_IT_MYSQL_PASSWORD=" + f.env.MySQLPassword, "TM_IT_PG_DSN=" + f.env.PGDSN}

	d := f.startDaemon(t, cfg)
	defer func() {
		if !d.exited() {
			d.kill()
		}
	}()
	if err := w.Run(50); err != nil {
		t.Fatal(err)
	}
	f.waitCaughtUp(t, db, d)

	for _, args := range [][]string{
		{"checkpoint", "--config", cfg},
		{"status", "--config", cfg},
		{"resync", "--config", cfg, "--table", db + ".orders"},
	} {
		code, out := runBinary(t, 60*time.Second, env, args...)
		if code != 0 {
			t.Fatalf("tidemark %s: exit %d\n%s", args[0], code, out)
		}
	}
	code, out := runBinary(t, 60*time.Second, env, "catchup", "--config", cfg, "--table", db+".orders")
	if code == 0 || !strings.Contains(out, "is streaming source") {
		t.Errorf("catchup --table while the daemon streams with exactly_once: exit %d, want a refusal naming the running daemon\n%s", code, out)
	}

	// The daemon keeps going: more changes arrive in both targets.
	if err := w.Run(50); err != nil {
		t.Fatal(err)
	}
	f.waitCaughtUp(t, db, d)
	time.Sleep(500 * time.Millisecond) // Kafka commits right after PostgreSQL
	if d.exited() {
		t.Fatalf("the daemon exited after the admin commands:\n%s", tail(d.stderr.String(), 20))
	}
	if code := d.stop(t); code != 0 {
		t.Fatalf("daemon exit %d:\n%s", code, tail(d.stderr.String(), 20))
	}
	if s := d.stderr.String(); strings.Contains(s, "fenced") {
		t.Fatalf("the daemon was fenced:\n%s", tail(s, 20))
	}
	f.requireExactlyOnce(t, r)
}
