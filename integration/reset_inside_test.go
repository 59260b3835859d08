package integration

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"tidemark"
	"tidemark/internal/testenv"
)

// TestResetMasterCheckpointInsideATransaction: RESET MASTER on MariaDB
// while tidemark is stopped, then a new history in which an event starts
// exactly at the checkpoint's file and offset, but one inside a
// transaction (here its Xid event), and more transactions than the
// checkpoint's sequence number. TestResetMasterOvertakenWhileStopped
// failed so now and then (CI check at 9db3ecf: "tidemark resumed after
// RESET MASTER at 0-33-1256"): only a Gtid event there was judged, so an
// event of any other kind let tidemark resume in the middle of a foreign
// transaction, skipping the new history up to it. Here the offset is hit on
// purpose: the new history's transactions are sized so that one's Xid event
// starts at the checkpoint's offset.
func TestResetMasterCheckpointInsideATransaction(t *testing.T) {
	f := newFixture(t)
	a := f.startPrivateMariaDB(t, 34)
	db := testenv.Name("it_resetin_")
	f.dropLater(t, db, db)
	a.root(t, "CREATE DATABASE "+db+"; CREATE TABLE "+db+".t (id INT PRIMARY KEY, v VARCHAR(250))")
	cfg := f.configYAMLWith(t, db, db, db, "UTC", tidemark.Position{}, "")
	setSourceOption(t, cfg, "addr", a.Addr)
	insert := func(id, size int) {
		// No Annotate_rows event: the statement's text does not count.
		a.root(t, fmt.Sprintf("SET SESSION binlog_annotate_row_events = 0; INSERT INTO %s.t VALUES (%d, REPEAT('v', %d))", db, id, size))
	}
	d := f.startDaemon(t, cfg)
	for i := 1; i <= 30; i++ {
		insert(i, 100)
	}
	f.waitCheckpointAt(t, db, a, d)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, tail(d.stderr.String(), 30))
	}
	var file, gtid string
	var at uint64
	if err := f.pg.QueryRow(f.ctx, "SELECT file, pos, gtid FROM tidemark.checkpoints WHERE source = $1", db).Scan(&file, &at, &gtid); err != nil {
		t.Fatal(err)
	}
	a.root(t, "RESET MASTER")
	binlogPos := func() uint64 {
		fields := strings.Fields(a.root(t, "SHOW MASTER STATUS"))
		if len(fields) < 2 || fields[0] != file {
			t.Fatalf("SHOW MASTER STATUS: %q; want file %s", fields, file)
		}
		n, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// events: "pos type" of each event from offset from on.
	events := func(from uint64) [][2]string {
		var out [][2]string
		for _, line := range strings.Split(a.root(t, fmt.Sprintf("SHOW BINLOG EVENTS IN '%s' FROM %d", file, from)), "\n") {
			if c := strings.Split(line, "\t"); len(c) >= 3 {
				out = append(out, [2]string{c[1], c[2]})
			}
		}
		return out
	}
	// xidOffset inserts a row of size bytes and returns how far from the
	// transaction's start its Xid event begins, and the transaction's size.
	next := 1000
	probe := func(size int) (xid, total uint64) {
		start := binlogPos()
		insert(next, size)
		next++
		for _, e := range events(start) {
			if e[1] == "Xid" {
				p, _ := strconv.ParseUint(e[0], 10, 64)
				return p - start, binlogPos() - start
			}
		}
		t.Fatalf("no Xid event after %s:%d", file, start)
		return 0, 0
	}
	x100, s100 := probe(100)
	if x150, _ := probe(150); x150 != x100+50 {
		t.Fatalf("the Xid event moved by %d bytes for 50 bytes more of the row; want 50", x150-x100)
	}
	xidAt := func(size int) uint64 { return x100 + uint64(size) - 100 }
	for {
		pos := binlogPos()
		if pos+xidAt(0) > at {
			t.Fatalf("the new history passed %s:%d (at %d) before an event could be placed there", file, at, pos)
		}
		gap := at - pos
		if gap <= xidAt(250) {
			insert(next, int(gap-xidAt(0)))
			next++
			break
		}
		// A filler that leaves the Xid of the next row in reach.
		size := int(gap) - int(xidAt(125)) - int(s100) + 100
		insert(next, min(max(size, 0), 250))
		next++
	}
	if e := events(at); len(e) == 0 || e[0][0] != strconv.FormatUint(at, 10) || e[0][1] != "Xid" {
		t.Fatalf("the new history has no Xid event at %s:%d: %v", file, at, e[:min(len(e), 2)])
	}
	for gtidSeq(t, a.root(t, "SELECT @@gtid_binlog_pos")) <= gtidSeq(t, gtid)+5 {
		insert(next, 10)
		next++
	}
	d = f.startDaemon(t, cfg)
	expectBehindCheckpoint(t, a, d, fmt.Sprintf("tidemark resumed after RESET MASTER at %s, an Xid event of the new history at %s:%d", gtid, file, at))
}
