package binlog

import (
	"fmt"

	"github.com/go-mysql-org/go-mysql/replication"

	"tidemark"
)

// XA transactions as both flavors log them: XA START … XA END, then an
// XA_PREPARE_LOG_EVENT that ends the prepared part, and later XA COMMIT or
// XA ROLLBACK. How the rows of a prepared transaction are held until then
// is the flavor's (mariaxa.go, mysql.go); this is what they share.

// xaPrepared is a prepared XA transaction waiting for its XA COMMIT.
type xaPrepared struct {
	gtid    string // MySQL: the GTID of the XA PREPARE ("" for MariaDB)
	changes []tidemark.Change
	ddl     []tidemark.DDLEvent
}

// xaSet holds the XA transactions a stream read prepared and not yet
// committed or rolled back, by XID.
type xaSet map[string]*xaPrepared

// prepare handles an XA_PREPARE_LOG_EVENT of the transaction being read
// (ok is false for any other generic event). The XID must be the one its XA
// START named (tx.xa; "" is accepted when loose, for MariaDB, which may log
// the prepared part without one). An XA COMMIT … ONE PHASE commits the
// transaction at once. Otherwise hold, when not nil, says whether the
// flavor can hold it and returns the GTID to remember with it; the
// transaction is then recorded as prepared and tx starts afresh.
func (s xaSet) prepare(ev *replication.BinlogEvent, e *replication.GenericEvent, tx *txState, loose bool,
	commit func(*replication.EventHeader) error, hold func(xid string) (gtid string, err error)) (ok bool, err error) {
	if ev.Header.EventType != replication.XA_PREPARE_LOG_EVENT {
		return false, nil
	}
	xid, onePhase, err := xaPrepareXID(e.Data)
	if err != nil {
		return false, err
	}
	if tx.xa != xid && (tx.xa != "" || !loose) {
		if !loose {
			return false, fmt.Errorf("XA PREPARE %s without its XA START (read %q)", xid, tx.xa)
		}
		return false, fmt.Errorf("XA PREPARE %s inside XA transaction %s", xid, tx.xa)
	}
	tx.xa = ""
	if onePhase {
		return true, commit(ev.Header)
	}
	var gtid string
	if hold != nil {
		if gtid, err = hold(xid); err != nil {
			return false, err
		}
	}
	if _, dup := s[xid]; dup {
		return false, fmt.Errorf("XA PREPARE %s while a transaction with that XID is already prepared", xid)
	}
	s[xid] = &xaPrepared{gtid: gtid, changes: tx.changes, ddl: tx.ddl}
	*tx = txState{}
	return true, nil
}

// resolve handles XA COMMIT (commit true) or XA ROLLBACK of xid: it removes
// the prepared transaction and, at XA COMMIT, makes its rows tx's. found is
// false when its XA PREPARE was not read since the start position; an XA
// COMMIT is then an error (its rows are in no part of the binlog the tailer
// reads), an XA ROLLBACK is not.
func (s xaSet) resolve(t *Tailer, xid string, commit bool, tx *txState) (p *xaPrepared, found bool, err error) {
	p, found = s[xid]
	if !found {
		if commit {
			return nil, false, fmt.Errorf("XA COMMIT %s: its XA PREPARE was not read since the start position, so its rows cannot be read from the binlog; re-read the tables (`tidemark catchup`) from a position before the XA PREPARE", xid)
		}
		return nil, false, nil
	}
	delete(s, xid)
	if commit {
		tx.changes, tx.ddl = p.changes, p.ddl
		t.cfg.Logger.Debug("XA COMMIT applies a prepared transaction", "source", t.cfg.Name, "xid", xid, "changes", len(p.changes))
	} else {
		t.cfg.Logger.Debug("XA ROLLBACK drops a prepared transaction", "source", t.cfg.Name, "xid", xid, "changes", len(p.changes))
	}
	return p, true, nil
}
