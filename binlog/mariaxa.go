package binlog

import (
	"fmt"

	"github.com/go-mysql-org/go-mysql/replication"

	"tidemark"
)

// MariaDB XA (two-phase commit).
//
// MariaDB logs XA START … XA END + XA PREPARE as an event group of its own
// (a GTID event flagged FL_PREPARED_XA, the rows, "XA END xid", an
// XA_PREPARE_LOG_EVENT) and the XA COMMIT or XA ROLLBACK later as another
// group (GTID flagged FL_COMPLETED_XA, "XA COMMIT xid"). XA COMMIT … ONE
// PHASE is an ordinary BEGIN … COMMIT group.
//
// A MariaDB GTID position is the last GTID per domain: unlike a MySQL GTID
// set it cannot leave out a prepared transaction that later ones follow. So
// from an XA PREPARE with rows until its XA COMMIT or ROLLBACK the tailer
// emits nothing: the prepared rows and every transaction after them are
// held in memory (bounded), the position stays before the XA PREPARE, and a
// restart or reconnect reads the prepared rows again. At XA COMMIT the held
// transactions go out in binlog order, then the prepared rows as one
// transaction with the XA COMMIT's version and position; at XA ROLLBACK the
// prepared rows are dropped. An XA COMMIT whose XA PREPARE was never read
// (a start position between the two) stops the stream: its rows are in no
// part of the binlog tidemark reads (a snapshot's capture does not take
// such a position: xacapture.go).
const (
	mariaFlPreparedXA  = 64  // FL_PREPARED_XA: the group is XA START … XA PREPARE
	mariaFlCompletedXA = 128 // FL_COMPLETED_XA: the group is XA COMMIT/ROLLBACK
)

// mariaXA is the MariaDB XA state of one replication connection.
type mariaXA struct {
	t *Tailer
	// prepared holds the XA transactions prepared and not yet committed
	// or rolled back, by XID.
	prepared xaSet
	// held are the chunks read after the first prepared transaction, in
	// order; heldBytes their estimated size; heldPos the newest commit
	// position among them.
	held      []tidemark.Chunk
	heldBytes int
	heldPos   tidemark.Position
}

// holding reports whether chunks are held back (an XA transaction is
// prepared and not resolved).
func (mx *mariaXA) holding() bool { return mx != nil && len(mx.prepared) > 0 }

// hold keeps a chunk until the prepared transactions are resolved.
func (mx *mariaXA) hold(ch tidemark.Chunk) error {
	for i := range ch.Changes {
		mx.heldBytes += ch.Changes[i].Size
	}
	if mx.heldBytes > mx.t.maxXABytes() {
		xids := make([]string, 0, len(mx.prepared))
		for x := range mx.prepared {
			xids = append(xids, x)
		}
		return fmt.Errorf("XA transaction %v is prepared and not committed or rolled back after %d bytes of later changes: tidemark holds every later change until it is resolved (a MariaDB GTID position cannot leave it out, and a restart must read it again); resolve it on the source (XA RECOVER, then XA COMMIT or XA ROLLBACK) or raise source.max_chunk_bytes", xids, mx.heldBytes)
	}
	mx.held = append(mx.held, ch)
	if !ch.Commit.IsZero() {
		mx.heldPos = ch.Commit
	}
	return nil
}

// release hands the held chunks on, in order, once nothing is prepared.
// It returns the newest commit position sent (zero if none).
func (mx *mariaXA) release(send func(tidemark.Chunk) error) (tidemark.Position, error) {
	if mx.holding() {
		return tidemark.Position{}, nil
	}
	for _, ch := range mx.held {
		if err := send(ch); err != nil {
			return tidemark.Position{}, err
		}
	}
	p := mx.heldPos
	mx.held, mx.heldBytes, mx.heldPos = nil, 0, tidemark.Position{}
	return p, nil
}

// event handles the XA events of a MariaDB stream; done reports that the
// event needs nothing more. release is called when the last prepared
// transaction is resolved, before the resolving group commits.
func (mx *mariaXA) event(ev *replication.BinlogEvent, tx *txState, commit func(*replication.EventHeader) error, release func() error) (done bool, err error) {
	t := mx.t
	switch e := ev.Event.(type) {
	case *replication.MariadbGTIDEvent:
		if tx.pending() {
			return false, fmt.Errorf("GTID %s of the next event group while %d changes of the previous one have no COMMIT: refusing to drop them", e.GTID.String(), len(tx.changes))
		}
	case *replication.QueryEvent:
		verb, xid, ok := xaStatement(string(e.Query))
		if !ok {
			return false, nil
		}
		switch verb {
		case "START", "BEGIN":
			tx.active, tx.xa = true, xid
		case "END":
			tx.xa = xid
		case "COMMIT", "ROLLBACK":
			_, found, err := mx.prepared.resolve(t, xid, verb == "COMMIT", tx)
			if err != nil {
				return false, err
			}
			if !found {
				return true, commit(ev.Header) // a rollback: nothing of it was read
			}
			if verb == "COMMIT" {
				// Applied at the XA COMMIT: its version and position.
				for i := range tx.changes {
					tx.changes[i].Version = tidemark.Version{Seq: tx.seq, Index: uint32(i + 1)}
				}
			}
			if err := release(); err != nil {
				return false, err
			}
			return true, commit(ev.Header)
		}
		return true, nil
	case *replication.GenericEvent:
		// Held even without rows of replicated tables: its XA COMMIT must
		// find it after a restart.
		return mx.prepared.prepare(ev, e, tx, true, commit, nil)
	}
	return false, nil
}
