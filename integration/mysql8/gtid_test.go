package mysql8

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/binlog"
	"tidemark/integration/mysqlprimary"
	"tidemark/internal/testenv"
)

func commitN(t *testing.T, p *mysqlprimary.Primary, gtids []string, firstID int64) {
	t.Helper()
	for i, g := range gtids {
		if err := p.Commit(mysqlprimary.Txn{GTID: g, DB: "shop", Rows: []mysqlprimary.Row{ins(firstID+int64(i), g)}}); err != nil {
			t.Fatal(err)
		}
	}
}

func ids(changes []tidemark.Change) []int64 {
	var out []int64
	for _, c := range changes {
		row := c.After
		if row == nil {
			row = c.Before
		}
		out = append(out, row[0].(int64))
	}
	return out
}

func eqIDs(t *testing.T, got []tidemark.Change, want ...int64) {
	t.Helper()
	g := ids(got)
	if len(g) != len(want) {
		t.Fatalf("ids %v, want %v", g, want)
	}
	for i := range g {
		if g[i] != want[i] {
			t.Fatalf("ids %v, want %v", g, want)
		}
	}
}

// TestMySQLFailoverResumesByGTIDSet: tidemark streams A:1-3 from primary A;
// A goes away and B, an 8.4 replica promoted with A's transactions in its own
// binlog files (other names, other offsets), takes its address and writes
// B:1-2. The tailer reconnects and resumes by GTID set: exactly B's two
// transactions, nothing skipped, nothing repeated, and positions carry
// both UUIDs.
func TestMySQLFailoverResumesByGTIDSet(t *testing.T) {
	a := startPrimary(t, mysqlprimary.Config{ServerUUID: uuidA})
	commitN(t, a, []string{"1", "2", "3"}, 1)
	tl := newTailer(t, a, func(c *binlog.Config) { c.Backoff.Attempts = 50 })

	changes, pos, _ := stream(t, tl, tidemark.Position{}, 3)
	eqIDs(t, changes, 1, 2, 3)
	if got := pos[2].GTID; got != uuidA+":1-3" {
		t.Fatalf("position GTID %q, want %s:1-3", got, uuidA)
	}
	// Resume from the checkpoint on the new primary.
	addr := a.Addr()
	a.Close()
	b := startPrimary(t, mysqlprimary.Config{Version: "8.4.3", ServerUUID: uuidB, ServerID: 2, Basename: "mysql-bin", Addr: addr})
	// (B's own transactions come after A's: one from before, an errant
	// transaction, is refused, TestMySQLFailoverRefusesErrantGTIDs.)
	commitN(t, b, []string{uuidA + ":1", uuidA + ":2", uuidA + ":3"}, 1) // replicated from A
	b.Rotate()
	b.Commit(mysqlprimary.Txn{GTID: uuidB + ":1", DB: "shop"}) // B's own first transaction, empty
	commitN(t, b, []string{"2", "3"}, 10)
	tl = newTailer(t, b, nil)
	changes, pos, err := stream(t, tl, pos[2], 3)
	if err != nil {
		t.Fatalf("resume on the new primary: %v", err)
	}
	eqIDs(t, changes, 10, 11)
	if got, want := pos[len(pos)-1].GTID, uuidA+":1-3,"+uuidB+":1-3"; got != want {
		t.Fatalf("position GTID %q, want %q", got, want)
	}
	if !strings.HasPrefix(pos[len(pos)-1].File, "mysql-bin.") {
		t.Fatalf("position file %q, want B's mysql-bin.*", pos[len(pos)-1].File)
	}
	if u := b.Unscripted(); len(u) > 0 {
		t.Fatalf("unscripted queries: %q", u)
	}
}

// TestMySQLReconnectAfterFailover: the same, with the tailer running: A
// stops under it, B takes the address, the tailer reconnects by itself.
func TestMySQLReconnectAfterFailover(t *testing.T) {
	a := startPrimary(t, mysqlprimary.Config{ServerUUID: uuidA})
	commitN(t, a, []string{"1", "2"}, 1)
	tl := newTailer(t, a, func(c *binlog.Config) { c.Backoff.Attempts = 100 })
	done := make(chan struct{})
	var changes []tidemark.Change
	var pos []tidemark.Position
	var err error
	go func() {
		defer close(done)
		changes, pos, err = stream(t, tl, tidemark.Position{}, 4)
	}()
	testenv.Eventually(t, 10*time.Second, "two binlog dumps served", func() bool { return a.Served() >= 2 })
	addr := a.Addr()
	a.Close()
	b := startPrimary(t, mysqlprimary.Config{Version: "8.4.3", ServerUUID: uuidB, ServerID: 2, Basename: "mysql-bin", Addr: addr})
	commitN(t, b, []string{uuidA + ":1", uuidA + ":2"}, 1)
	commitN(t, b, []string{"1", "2"}, 10)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	eqIDs(t, changes, 1, 2, 10, 11)
	if got, want := pos[3].GTID, uuidA+":1-2,"+uuidB+":1-2"; got != want {
		t.Fatalf("position GTID %q, want %q", got, want)
	}
}

// TestMySQLPurged: positions the source no longer has end in
// tidemark.ErrPositionPurged with MySQL's own text, by GTID set and by
// file; a set with GTIDs the source never wrote is ErrPositionAhead.
func TestMySQLPurged(t *testing.T) {
	p := startPrimary(t, mysqlprimary.Config{ServerUUID: uuidA})
	commitN(t, p, []string{"1", "2"}, 1)
	p.Rotate()
	commitN(t, p, []string{"3"}, 3)
	p.Rotate()
	if err := p.PurgeTo("binlog.000003"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		gtid bool
		from tidemark.Position
		want error
		text string
	}{
		{"gtid purged", true, tidemark.Position{GTID: uuidA + ":1", File: "binlog.000001", Offset: 500}, tidemark.ErrPositionPurged,
			"Cannot replicate because the source purged required binary logs. Replicate the missing transactions from elsewhere, or provision a new replica from backup. Consider increasing the source's binary log expiration period. The GTID set sent by the replica is '" + uuidA + ":1', and the missing transactions are '" + uuidA + ":2-3'"},
		{"file purged", false, tidemark.Position{File: "binlog.000001", Offset: 500}, tidemark.ErrPositionPurged, "Could not find first log file name in binary log index file"},
		// Caught before asking the server (binlog/identity.go); the
		// server's own answer (MySQL's "Replica has more GTIDs than the
		// source has") is classified the same way.
		{"gtid ahead", true, tidemark.Position{GTID: uuidA + ":1-9"}, tidemark.ErrPositionAhead, "the server has executed " + uuidA + ":1-3"},
		{"offset ahead", false, tidemark.Position{File: "binlog.000003", Offset: 1 << 20}, tidemark.ErrPositionAhead, "Client requested source to start replication from position > file size"},
	} {
		t.Run(c.name, func(t *testing.T) {
			mode := "ON"
			if !c.gtid {
				mode = "OFF"
			}
			p.SetVar("gtid_mode", mode)
			_, _, err := stream(t, newTailer(t, p, nil), c.from, 1)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.text) {
				t.Fatalf("err %v, want %v with %q", err, c.want, c.text)
			}
		})
	}
}

// TestMySQLRotation: positions follow the rotated files; a resume by file
// and offset (a checkpoint without a GTID set) learns the set from the next
// file's PREVIOUS_GTIDS event, so later positions carry it again.
func TestMySQLRotation(t *testing.T) {
	p := startPrimary(t, mysqlprimary.Config{ServerUUID: uuidA})
	commitN(t, p, []string{"1"}, 1)
	p.Rotate()
	commitN(t, p, []string{"2"}, 2)
	p.Rotate()
	commitN(t, p, []string{"3"}, 3)
	changes, pos, err := stream(t, newTailer(t, p, nil), tidemark.Position{}, 3)
	if err != nil {
		t.Fatal(err)
	}
	eqIDs(t, changes, 1, 2, 3)
	for i, gtids := range []string{":1", ":1-2", ":1-3"} {
		if file := "binlog.00000" + strconv.Itoa(i+1); pos[i].File != file || pos[i].GTID != uuidA+gtids {
			t.Fatalf("position %d is %v, want %s%s in %s", i, pos[i], uuidA, gtids, file)
		}
	}
	changes, pos, err = stream(t, newTailer(t, p, nil), tidemark.Position{File: pos[1].File, Offset: pos[1].Offset}, 1)
	if err != nil {
		t.Fatal(err)
	}
	eqIDs(t, changes, 3)
	if pos[0].GTID != uuidA+":1-3" || pos[0].File != "binlog.000003" {
		t.Fatalf("resumed position %v, want %s:1-3 in binlog.000003", pos[0], uuidA)
	}
}

// TestMySQLFailoverRefusesErrantGTIDs is review finding 13: replica B once
// ran a local row change (B:1, an errant transaction) before it applied
// A's transactions, which tidemark streamed. B is promoted; resuming by
// GTID set, MySQL sends every transaction not in the checkpoint, B:1
// included, and in the new epoch its old row image would win over the
// newer rows from A. B's binlog shows B:1 was written before B had the
// checkpoint's transactions (a later file's Previous_gtids holds B:1 but
// not all of the checkpoint): tidemark stops and names `tidemark catchup`.
func TestMySQLFailoverRefusesErrantGTIDs(t *testing.T) {
	a := startPrimary(t, mysqlprimary.Config{ServerUUID: uuidA})
	commitN(t, a, []string{"1", "2", "3"}, 1)
	tl := newTailer(t, a, nil)
	_, pos, _ := stream(t, tl, tidemark.Position{}, 3)
	addr := a.Addr()
	a.Close()
	b := startPrimary(t, mysqlprimary.Config{Version: "8.4.3", ServerUUID: uuidB, ServerID: 2, Basename: "mysql-bin", Addr: addr})
	commitN(t, b, []string{uuidB + ":1"}, 1) // the errant local change of row 1
	b.Rotate()
	commitN(t, b, []string{uuidA + ":1", uuidA + ":2", uuidA + ":3"}, 1) // replicated from A
	commitN(t, b, []string{"2"}, 10)                                     // after the promotion
	tl = newTailer(t, b, func(c *binlog.Config) { c.Backoff.Attempts = 1 })
	changes, _, err := stream(t, tl, pos[2], 2)
	if !errors.Is(err, tidemark.ErrSourceChanged) {
		t.Fatalf("resume on a new primary with an errant GTID: %d changes (ids %v), err %v; want ErrSourceChanged", len(changes), ids(changes), err)
	}
	for _, want := range []string{uuidB + ":1", "tidemark catchup"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
}
