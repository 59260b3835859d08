package integration

import (
	"strings"
	"testing"
	"time"

	"tidemark/internal/testenv"
)

// TestTailerStandbyTakesOver runs two `tidemark run` for one source, with
// PostgreSQL and Kafka (exactly_once, the real broker) as targets. Exactly
// one is active: the second waits on the source's lock in PostgreSQL
// without fencing the first (the Kafka transactional id is only taken over
// once the lock is held). The active one is killed with SIGKILL under load;
// the standby takes over within seconds and carries on. PostgreSQL equals
// the source and Kafka has every source change exactly once.
func TestTailerStandbyTakesOver(t *testing.T) {
	f := newFixture(t)
	r := f.newKafkaRun(t, "it_kha_", 93, "")
	w, cfg, db := r.w, r.cfg, r.db

	active := f.startDaemon(t, cfg)
	defer func() {
		if !active.exited() {
			active.kill()
		}
	}()
	if err := w.Run(40); err != nil {
		t.Fatal(err)
	}
	f.waitCaughtUp(t, db, active)
	standby := f.startDaemon(t, cfg)
	defer func() {
		if !standby.exited() {
			standby.kill()
		}
	}()
	if !testenv.WaitFor(30*time.Second, func() bool {
		return strings.Contains(standby.stderr.String(), "another tidemark process is streaming this source")
	}) {
		t.Fatalf("the second daemon does not wait for the first:\n%s", tail(standby.stderr.String(), 20))
	}
	if err := w.Run(40); err != nil {
		t.Fatal(err)
	}
	f.waitCaughtUp(t, db, active)
	if active.exited() || strings.Contains(active.stderr.String(), "fenced") {
		t.Fatalf("the active daemon stopped or was fenced while the standby waited:\n%s", tail(active.stderr.String(), 20))
	}
	if strings.Contains(standby.stderr.String(), "starting pipeline") {
		t.Fatalf("the standby started streaming while the active daemon held the source:\n%s", tail(standby.stderr.String(), 20))
	}

	// Kill the active daemon in the middle of a load.
	load := startLoad(t, f.env, w, false, 0)
	time.Sleep(500 * time.Millisecond)
	killed := time.Now()
	active.kill()
	if !testenv.WaitFor(60*time.Second, func() bool { return strings.Contains(standby.stderr.String(), "starting pipeline") }) {
		_ = load.Stop()
		t.Fatalf("the standby did not take over within 60 s:\n%s", tail(standby.stderr.String(), 20))
	}
	takeover := time.Since(killed)
	time.Sleep(500 * time.Millisecond)
	if err := load.Stop(); err != nil {
		t.Fatal(err)
	}
	f.waitCaughtUp(t, db, standby)
	time.Sleep(500 * time.Millisecond) // Kafka commits right after PostgreSQL
	if code := standby.stop(t); code != 0 {
		t.Fatalf("standby exit %d:\n%s", code, tail(standby.stderr.String(), 20))
	}
	n := f.requireExactlyOnce(t, r)
	t.Logf("standby took over %s after SIGKILL of the active daemon; %d changes exactly once on Kafka", takeover.Round(time.Millisecond), n)
}
