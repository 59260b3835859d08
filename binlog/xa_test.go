package binlog

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/go-mysql-org/go-mysql/replication"

	"tidemark"
)

// xaPrepareEvent builds an XA_PREPARE_LOG_EVENT for gtrid "g" (format 1).
func xaPrepareEvent(gtrid string, onePhase bool) (*replication.BinlogEvent, *replication.GenericEvent) {
	data := make([]byte, 13, 13+len(gtrid))
	if onePhase {
		data[0] = 1
	}
	binary.LittleEndian.PutUint32(data[1:5], 1)
	binary.LittleEndian.PutUint32(data[5:9], uint32(len(gtrid)))
	data = append(data, gtrid...)
	e := &replication.GenericEvent{Data: data}
	return &replication.BinlogEvent{Header: &replication.EventHeader{EventType: replication.XA_PREPARE_LOG_EVENT}, Event: e}, e
}

// TestXASet: a prepared transaction is held by XID with its rows and GTID
// until XA COMMIT hands the rows back (or XA ROLLBACK drops them); one phase
// commits at once; a second PREPARE of one XID, a PREPARE of another XID
// than the XA START's, a refusal of the flavor and an XA COMMIT of an
// unknown XID are errors; an XA ROLLBACK of an unknown XID is not.
func TestXASet(t *testing.T) {
	tl := &Tailer{cfg: Config{Name: "s", Logger: slog.New(slog.DiscardHandler)}}
	xid := "X'67',X'',1"
	rows := []tidemark.Change{{Op: tidemark.OpInsert}, {Op: tidemark.OpDelete}}
	committed := 0
	commit := func(*replication.EventHeader) error { committed++; return nil }
	gtid := func(string) (string, error) { return "uuid:7", nil }

	s := xaSet{}
	ev, e := xaPrepareEvent("g", false)
	tx := &txState{xa: xid, changes: rows}
	if ok, err := s.prepare(ev, e, tx, false, commit, gtid); !ok || err != nil {
		t.Fatalf("prepare: %v, %v", ok, err)
	}
	if len(tx.changes) != 0 || tx.xa != "" || committed != 0 || s[xid] == nil || s[xid].gtid != "uuid:7" || len(s[xid].changes) != 2 {
		t.Fatalf("after prepare: tx %+v, set %+v, %d commits", tx, s, committed)
	}
	tx = &txState{xa: xid}
	if _, err := s.prepare(ev, e, tx, false, commit, gtid); err == nil || !strings.Contains(err.Error(), "already prepared") {
		t.Fatalf("second prepare of one XID: %v", err)
	}
	tx = &txState{}
	p, found, err := s.resolve(tl, xid, true, tx)
	if err != nil || !found || p.gtid != "uuid:7" || len(tx.changes) != 2 || len(s) != 0 {
		t.Fatalf("commit: %+v %v %v, tx %+v, %d left", p, found, err, tx, len(s))
	}
	if _, _, err := s.resolve(tl, xid, true, &txState{}); err == nil || !strings.Contains(err.Error(), "was not read since the start position") {
		t.Fatalf("commit of an unknown XID: %v", err)
	}
	if _, found, err := s.resolve(tl, xid, false, &txState{}); found || err != nil {
		t.Fatalf("rollback of an unknown XID: %v %v", found, err)
	}
	// Rollback of a prepared one: its rows are not handed back.
	tx = &txState{xa: xid, changes: rows}
	if _, err := s.prepare(ev, e, tx, true, commit, nil); err != nil {
		t.Fatal(err)
	}
	tx = &txState{}
	if _, found, err := s.resolve(tl, xid, false, tx); !found || err != nil || len(tx.changes) != 0 || len(s) != 0 {
		t.Fatalf("rollback: %v %v, tx %+v", found, err, tx)
	}

	// One phase: committed at once, nothing held.
	one, oe := xaPrepareEvent("g", true)
	if ok, err := s.prepare(one, oe, &txState{xa: xid, changes: rows}, false, commit, gtid); !ok || err != nil || committed != 1 || len(s) != 0 {
		t.Fatalf("one phase: %v %v, %d commits, %d held", ok, err, committed, len(s))
	}
	// The XID must be the XA START's; loose (MariaDB) accepts none read.
	if _, err := s.prepare(ev, e, &txState{}, false, commit, gtid); err == nil || !strings.Contains(err.Error(), "without its XA START") {
		t.Fatalf("strict, no XA START: %v", err)
	}
	if _, err := s.prepare(ev, e, &txState{xa: "X'68',X'',1"}, true, commit, nil); err == nil || !strings.Contains(err.Error(), "inside XA transaction") {
		t.Fatalf("loose, another XID: %v", err)
	}
	if ok, err := s.prepare(ev, e, &txState{}, true, commit, nil); !ok || err != nil || len(s) != 1 {
		t.Fatalf("loose, no XA START: %v %v", ok, err)
	}
	// The flavor refuses to hold it: nothing is recorded.
	refused := errors.New("no GTIDs")
	s = xaSet{}
	if _, err := s.prepare(ev, e, &txState{xa: xid}, false, commit, func(string) (string, error) { return "", refused }); !errors.Is(err, refused) || len(s) != 0 {
		t.Fatalf("refused: %v, %d held", err, len(s))
	}
	// Another generic event is not for it.
	other := &replication.BinlogEvent{Header: &replication.EventHeader{EventType: replication.IGNORABLE_EVENT}, Event: e}
	if ok, err := s.prepare(other, e, &txState{}, false, commit, gtid); ok || err != nil {
		t.Fatalf("another event: %v %v", ok, err)
	}
}
