package integration

import (
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/internal/testenv"
)

// TestResetMasterOvertakenWhileStopped: RESET MASTER on MariaDB while
// tidemark is stopped, then more transactions than the checkpoint's
// sequence number: the server's GTID position is past the checkpoint's
// again, though they are other transactions. TestResetMasterWhileStopped
// failed now and then so (1 of 12 runs): tidemark resumed at the
// checkpoint's GTID in the new history, skipping every transaction before
// it. Only the binlog at the checkpoint's file and offset tells: no event
// starts there, or the transaction there is one the checkpoint holds. The
// daemon must stop naming RESET MASTER and tidemark catchup.
func TestResetMasterOvertakenWhileStopped(t *testing.T) {
	f := newFixture(t)
	s := f.streamPrivate(t, 33, "it_resetover_", "gtid")
	a, ca, load, cfg, d := s.a, s.ca, s.load, s.cfg, s.d
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, tail(d.stderr.String(), 30))
	}
	at := a.root(t, "SELECT @@gtid_binlog_pos")
	a.root(t, "RESET MASTER")
	for gtidSeq(t, a.root(t, "SELECT @@gtid_binlog_pos")) <= gtidSeq(t, at)+5 {
		load.runFor(t, ca, 200*time.Millisecond)
	}
	d = f.startDaemon(t, cfg)
	expectBehindCheckpoint(t, a, d, "tidemark resumed after RESET MASTER at "+at)
}

// gtidSeq is the sequence number of domain 0 in a MariaDB GTID position
// (0 when the position is empty: a server just reset).
func gtidSeq(t *testing.T, pos string) uint64 {
	t.Helper()
	g, err := tidemark.ParseMariaDBGTIDSet(pos)
	if err != nil {
		t.Fatalf("gtid position %q: %v", pos, err)
	}
	return g[0].Seq
}

// expectBehindCheckpoint waits for d to stop by itself with the error of a
// checkpoint the server is behind, naming RESET MASTER and tidemark catchup;
// otherwise the test fails with what (the server a's position appended).
func expectBehindCheckpoint(t *testing.T, a *privateMy, d *daemonProc, what string) {
	t.Helper()
	if !testenv.WaitFor(60*time.Second, d.exited) {
		d.kill()
		t.Fatalf("%s (the server at %s):\n%s", what, a.root(t, "SELECT @@gtid_binlog_pos"), tail(d.stderr.String(), 8))
	}
	log := d.stderr.String()
	for _, want := range []string{"behind the checkpoint", "RESET MASTER", "tidemark catchup"} {
		if !strings.Contains(log, want) {
			t.Fatalf("the error does not say %q:\n%s", want, tail(log, 10))
		}
	}
	t.Logf("%s", grepLines(log, "behind the checkpoint"))
}
