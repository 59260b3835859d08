package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestGTIDBackwardsWhileStopped is nemesis seed 301640696642 (issue 23):
// under version: filepos, with gtid_strict_mode off, one transaction is
// committed with a GTID sequence number far below the domain's (SET
// gtid_seq_no, as a mysqlbinlog replay does) while tidemark is stopped.
// @@gtid_binlog_pos and @@gtid_binlog_state then show that low number
// (the domain's last GTID, not its highest) until the next transaction,
// and the restart stopped with "the server's binlog is behind the
// checkpoint … (GTID 0-41-…, the server's binlog has 0-41-3)", though the
// checkpoint's file and offset, with its GTID position there, are still in
// the binlog. The daemon must resume there (by file and offset: the server
// refuses the checkpoint's GTID, "not in the master's binlog"), apply the
// backwards update and go on; the target equals the source.
func TestGTIDBackwardsWhileStopped(t *testing.T) {
	f := newFixture(t)
	s := f.streamPrivate(t, 41, "it_gtidback_", "filepos")
	a, ca, load, db, cfg, d := s.a, s.ca, s.load, s.db, s.cfg, s.d
	defer cleanupDaemon(&d)
	f.stopOK(t, d)
	at := a.root(t, "SELECT @@gtid_binlog_pos")
	a.root(t, fmt.Sprintf("SET GLOBAL gtid_strict_mode = 0; SET SESSION gtid_seq_no = 3; UPDATE %s.acct SET balance = -1, note = 'backwards' WHERE id = 7", db))
	if pos := a.root(t, "SELECT @@gtid_binlog_pos"); pos != "0-41-3" {
		t.Fatalf("@@gtid_binlog_pos after the backwards transaction is %q, want 0-41-3 (before it: %s)", pos, at)
	}

	// The restart inside the window: the binlog's last GTID is below
	// the checkpoint's.
	d = f.startDaemon(t, cfg)
	waitRow := func(what string) {
		t.Helper()
		var note string
		ok := testenv.WaitFor(90*time.Second, func() bool {
			if d.exited() {
				return true
			}
			err := f.pg.QueryRow(f.ctx, fmt.Sprintf(`SELECT note FROM %q.acct WHERE id = 7`, db)).Scan(&note)
			return err == nil && note == "backwards"
		})
		if !ok || d.exited() {
			d.kill()
			t.Fatalf("%s: the backwards update (GTID 0-41-3 after the checkpoint at %s) did not reach the target (note %q):\n%s", what, at, note, tail(d.stderr.String(), 10))
		}
	}
	waitRow("restart with the binlog's last GTID below the checkpoint's")
	// Stopped again right after it: the checkpoint is the backwards
	// GTID itself.
	f.stopOK(t, d)
	d = f.startDaemon(t, cfg)
	// The next transaction gets the domain's highest number + 1.
	load.runFor(t, ca, 300*time.Millisecond)
	a.root(t, "SET GLOBAL gtid_strict_mode = 1")
	load.runFor(t, ca, 300*time.Millisecond)
	f.waitCheckpointAt(t, db, a, d)
	if d.exited() {
		t.Fatalf("the daemon stopped:\n%s", tail(d.stderr.String(), 10))
	}
	f.stopOK(t, d)
	t.Logf("%s", grepLines(d.stderr.String(), "stopped cleanly"))
	if log := d.stderr.String(); strings.Contains(log, "behind the checkpoint") {
		t.Fatalf("a refusal after the backwards GTID:\n%s", grepLines(log, "behind the checkpoint"))
	}
	diff, err := harness.Compare(f.ctx, ca, f.pg, harness.TableSpec{Database: db, Table: "acct", SourceZone: "UTC"})
	if err != nil {
		t.Fatal(err)
	}
	if !diff.Equal() {
		t.Fatalf("target differs from the source after a backwards GTID: %s\n%s", diff, strings.Join(diff.Examples, "\n"))
	}
}

// TestGTIDBackwardsUnderVersionGTID: the same backwards GTID while
// tidemark streams under version: gtid, whose versions are the sequence
// numbers. Before, the update's rows got version 3, lost to the older rows
// in the target and were dropped without a word; the checkpoint moved past
// them. The stream must stop before the transaction, naming the setting;
// with source.version: filepos (and strict mode on again) the restart
// resumes at the checkpoint in the next epoch, applies the update, and the
// target equals the source.
func TestGTIDBackwardsUnderVersionGTID(t *testing.T) {
	f := newFixture(t)
	s := f.streamPrivate(t, 42, "it_gtidbackg_", "gtid")
	a, ca, load, db, cfg, d := s.a, s.ca, s.load, s.db, s.cfg, s.d
	defer cleanupDaemon(&d)
	at := a.root(t, "SELECT @@gtid_binlog_pos")
	a.root(t, fmt.Sprintf("SET GLOBAL gtid_strict_mode = 0; SET SESSION gtid_seq_no = 3; UPDATE %s.acct SET balance = -1, note = 'backwards' WHERE id = 7", db))
	if !testenv.WaitFor(60*time.Second, d.exited) {
		d.kill()
		var note string
		_ = f.pg.QueryRow(f.ctx, fmt.Sprintf(`SELECT note FROM %q.acct WHERE id = 7`, db)).Scan(&note)
		p, _, _ := harness.StoredCheckpoint(f.ctx, f.pg, "", db)
		t.Fatalf("version: gtid went on after GTID 0-42-3 followed %s (target note of id 7: %q, checkpoint %s):\n%s", at, note, p, tail(d.stderr.String(), 6))
	}
	log := d.stderr.String()
	for _, want := range []string{"went backwards", "GTID 0-42-3", "source.version: filepos"} {
		if !strings.Contains(log, want) {
			t.Fatalf("the error does not say %q:\n%s", want, tail(log, 6))
		}
	}
	p, _, err := harness.StoredCheckpoint(f.ctx, f.pg, "", db)
	if err != nil || p.GTID != at {
		t.Fatalf("checkpoint after the stop %s (%v), want GTID %s: the backwards transaction must not be passed", p, err, at)
	}
	a.root(t, "SET GLOBAL gtid_strict_mode = 1")
	setSourceOption(t, cfg, "version", "filepos")
	d = f.startDaemon(t, cfg)
	load.runFor(t, ca, 300*time.Millisecond)
	f.waitCheckpointAt(t, db, a, d)
	f.stopOK(t, d)
	if p, _, _ = harness.StoredCheckpoint(f.ctx, f.pg, "", db); p.Epoch != 1 {
		t.Fatalf("checkpoint %s after the switch to version: filepos, want epoch 1", p)
	}
	diff, err := harness.Compare(f.ctx, ca, f.pg, harness.TableSpec{Database: db, Table: "acct", SourceZone: "UTC"})
	if err != nil {
		t.Fatal(err)
	}
	if !diff.Equal() {
		t.Fatalf("target differs from the source after the switch to version: filepos: %s\n%s", diff, strings.Join(diff.Examples, "\n"))
	}
}

// privateStream is a daemon streaming db.acct (acctLoad) from a private
// MariaDB, its checkpoint at the server's position after a first load.
type privateStream struct {
	a    *privateMy
	ca   *client.Conn
	load *acctLoad
	db   string
	cfg  string
	d    *daemonProc
}

// streamPrivate starts a private MariaDB with serverID, a database named
// with prefix and the daemon on it with source.version, and waits for its
// checkpoint after 500 ms of load.
func (f *fixture) streamPrivate(t *testing.T, serverID int, prefix, version string) privateStream {
	t.Helper()
	s := privateStream{a: f.startPrivateMariaDB(t, serverID), db: testenv.Name(prefix)}
	f.dropLater(t, s.db, s.db)
	s.ca = f.connPrivate(t, s.a)
	s.load = newAcctLoad(t, s.ca, s.db)
	s.cfg = f.configYAMLWith(t, s.db, s.db, s.db, "UTC", tidemark.Position{}, "")
	setSourceOption(t, s.cfg, "addr", s.a.Addr)
	setSourceOption(t, s.cfg, "version", version)
	s.d = f.startDaemon(t, s.cfg)
	f.waitCheckpointAt(t, s.db, s.a, s.d)
	s.load.runFor(t, s.ca, 500*time.Millisecond)
	f.waitCheckpointAt(t, s.db, s.a, s.d)
	return s
}
