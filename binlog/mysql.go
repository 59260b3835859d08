package binlog

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"tidemark"
)

// MySQL 8.0/8.4 specifics of the tailer and the reader (flavor "mysql").
//
//   - Resume: with gtid_mode=ON the tailer resumes by GTID set
//     (COM_BINLOG_DUMP_GTID, auto-position): the server sends every
//     transaction the set lacks, so a failover to a replica that has the
//     same transactions under the same GTIDs resumes exactly. Otherwise it
//     resumes by file and offset. The GTID set of each emitted position is
//     the set the stream started from plus every transaction read since
//     (learnt from the first file's PREVIOUS_GTIDS event when the stream
//     starts from the oldest file).
//   - Capture: SHOW BINARY LOG STATUS (MySQL 8.2+; 8.4 removed SHOW MASTER
//     STATUS), falling back to SHOW MASTER STATUS on a syntax error (8.0).
//   - JSON: MySQL's binary JSON is rendered as MySQL's own JSON text
//     (go-mysql's RenderJSONAsMySQLText): big integers and decimals keep
//     every digit, doubles keep their type, dates/times inside JSON are
//     MySQL's strings, key order is MySQL's.
//   - Compressed transactions (binlog_transaction_compression=ON): the
//     events of a TRANSACTION_PAYLOAD_EVENT are decoded and handled as if
//     they had arrived uncompressed.
//   - XA: the rows of XA START … XA END + XA PREPARE are held in memory
//     until XA COMMIT (then emitted as one transaction) or XA ROLLBACK
//     (dropped). XA COMMIT … ONE PHASE is an ordinary commit. While an XA
//     transaction is prepared, emitted positions leave its GTID out, so a
//     restart reads the XA PREPARE again. Without GTIDs a position cannot
//     leave a prepared transaction out: a two-phase XA PREPARE then stops
//     the stream, naming the fix (gtid_mode=ON).

// mysqlStatus runs SHOW BINARY LOG STATUS, or SHOW MASTER STATUS on a
// server that does not know it (MySQL before 8.2, MariaDB).
func (t *Tailer) mysqlStatus(ctx context.Context, exec func(context.Context, string) (*mysql.Result, error)) (*mysql.Result, error) {
	if t.cfg.Flavor == FlavorMySQL {
		r, err := exec(ctx, "SHOW BINARY LOG STATUS")
		var me *mysql.MyError
		if err == nil || !errors.As(err, &me) || me.Code != mysql.ER_PARSE_ERROR {
			return r, err
		}
	}
	return exec(ctx, "SHOW MASTER STATUS")
}

// checkMySQL checks the MySQL-only settings and records gtid_mode.
func (t *Tailer) checkMySQL(ctx context.Context) error {
	r, err := t.query(ctx, "SELECT @@gtid_mode, @@binlog_row_value_options")
	if err != nil {
		return fmt.Errorf("read GTID settings of %s: %w", t.cfg.Name, err)
	}
	mode, _ := r.GetString(0, 0)
	opts, _ := r.GetString(0, 1)
	if strings.Contains(strings.ToUpper(opts), "PARTIAL_JSON") {
		return fmt.Errorf("check source %s: binlog_row_value_options is %s: JSON updates are logged as partial diffs tidemark cannot apply; set binlog_row_value_options='' (SET PERSIST binlog_row_value_options='') : %w", t.cfg.Name, opts, tidemark.ErrSourceConfig)
	}
	t.mysqlGTIDMode = strings.EqualFold(mode, "ON")
	if !t.mysqlGTIDMode {
		t.cfg.Logger.Info("MySQL source without gtid_mode=ON: resuming by binlog file and offset", "source", t.cfg.Name, "gtid_mode", mode)
	}
	return nil
}

// mysqlStream is the MySQL state of one replication connection: the GTID
// set consumed so far and the prepared XA transactions.
type mysqlStream struct {
	t *Tailer
	// set is the GTID set of the emitted positions; nil while unknown
	// (gtid_mode=OFF, or a start by file/offset before the next
	// PREVIOUS_GTIDS event).
	set *mysql.MysqlGTIDSet
	// prepared holds the XA transactions prepared and not yet committed
	// or rolled back, by XID.
	prepared xaSet
}

// startMySQL starts a MySQL stream from pos: by GTID set when the server
// has gtid_mode=ON and pos has one, else by file and offset (the oldest
// file when pos is zero).
func (t *Tailer) startMySQL(ctx context.Context, syncer *replication.BinlogSyncer, pos tidemark.Position) (*replication.BinlogStreamer, *mysqlStream, string, error) {
	ms := &mysqlStream{t: t, prepared: xaSet{}}
	if t.mysqlGTIDMode && pos.GTID != "" {
		gs, err := mysql.ParseMysqlGTIDSet(pos.GTID)
		if err != nil {
			return nil, nil, "", fmt.Errorf("start binlog of %s at GTID set %s: %w", t.cfg.Name, pos.GTID, err)
		}
		ms.set = gs.(*mysql.MysqlGTIDSet)
		start := gs.Clone()
		s, err := syncer.StartSyncGTID(start)
		return s, ms, pos.File, err
	}
	if pos.File != "" {
		if t.mysqlGTIDMode {
			t.cfg.Logger.Info("position has no GTID set; resuming by file and offset", "source", t.cfg.Name, "position", pos.String())
		}
		s, err := syncer.StartSync(mysql.Position{Name: pos.File, Pos: uint32(pos.Offset)})
		return s, ms, pos.File, err
	}
	r, err := t.query(ctx, "SHOW BINARY LOGS")
	if err != nil {
		return nil, nil, "", fmt.Errorf("list binary logs of %s: %w", t.cfg.Name, err)
	}
	first, _ := r.GetString(0, 0)
	s, err := syncer.StartSync(mysql.Position{Name: first, Pos: 4})
	return s, ms, first, err
}

// previous learns the GTID set at the start of a file.
func (ms *mysqlStream) previous(e *replication.PreviousGTIDsEvent) error {
	if ms.set != nil || !ms.t.mysqlGTIDMode {
		return nil
	}
	gs, err := mysql.ParseMysqlGTIDSet(e.GTIDSets)
	if err != nil {
		return fmt.Errorf("decode previous GTIDs of %s: %w", ms.t.cfg.Name, err)
	}
	ms.set = gs.(*mysql.MysqlGTIDSet)
	return nil
}

// gtidOf returns "uuid:gno" of a GTID event, "" for an anonymous one.
func gtidOf(e *replication.GTIDEvent) (string, error) {
	if e.GNO == 0 {
		return "", nil // ANONYMOUS_GTID_LOG_EVENT
	}
	gs, err := e.GTIDNext()
	if err != nil {
		return "", fmt.Errorf("decode GTID event: %w", err)
	}
	return gs.String(), nil
}

// add records consumed GTIDs in the set.
func (ms *mysqlStream) add(gtids ...string) error {
	if ms.set == nil {
		return nil
	}
	for _, g := range gtids {
		if g == "" {
			continue
		}
		if err := ms.set.Update(g); err != nil {
			return fmt.Errorf("record GTID %s of %s: %w", g, ms.t.cfg.Name, err)
		}
	}
	return nil
}

// position returns the GTID set of an emitted position ("" while unknown).
func (ms *mysqlStream) position() string {
	if ms.set == nil {
		return ""
	}
	return ms.set.String()
}

var xaRE = regexp.MustCompile(`(?i)^XA\s+(START|BEGIN|END|COMMIT|ROLLBACK)\s+(.*?)(\s+ONE\s+PHASE)?$`)

// xaStatement parses an XA statement of the binlog: its verb and XID.
func xaStatement(q string) (verb, xid string, ok bool) {
	m := xaRE.FindStringSubmatch(strings.TrimSpace(q))
	if m == nil {
		return "", "", false
	}
	return strings.ToUpper(m[1]), strings.TrimSpace(m[2]), true
}

// xaPrepareXID decodes an XA_PREPARE_LOG_EVENT's body: one_phase, then the
// XID (formatID, gtrid and bqual lengths, data), formatted as MySQL logs
// it in XA statements (X'gtrid',X'bqual',formatID).
func xaPrepareXID(data []byte) (xid string, onePhase bool, err error) {
	if len(data) < 13 {
		return "", false, errors.New("XA_PREPARE_LOG_EVENT too short")
	}
	onePhase = data[0] != 0
	formatID := binary.LittleEndian.Uint32(data[1:5])
	gl, bl := binary.LittleEndian.Uint32(data[5:9]), binary.LittleEndian.Uint32(data[9:13])
	if gl > 64 || bl > 64 || len(data) < 13+int(gl+bl) {
		return "", false, errors.New("XA_PREPARE_LOG_EVENT with an invalid XID")
	}
	d := data[13:]
	return fmt.Sprintf("X'%s',X'%s',%d", hex.EncodeToString(d[:gl]), hex.EncodeToString(d[gl:gl+bl]), formatID), onePhase, nil
}

// maxXABytes bounds the rows of one prepared XA transaction held in memory.
func (t *Tailer) maxXABytes() int { return 64 * t.cfg.MaxChunkBytes }

// eventName names an event for an error message.
func eventName(ev *replication.BinlogEvent) string {
	return fmt.Sprintf("%s (type %d)", ev.Header.EventType, byte(ev.Header.EventType))
}

// harmless reports whether an event the tailer does not act on may be
// skipped inside a transaction: events that carry nothing tidemark
// replicates (row-query text, heartbeats, ignorable events, Group
// Replication's view changes…).
func harmless(ev *replication.BinlogEvent) bool {
	switch ev.Event.(type) {
	case *replication.TableMapEvent, *replication.RowsQueryEvent, *replication.IntVarEvent,
		*replication.FormatDescriptionEvent, *replication.PreviousGTIDsEvent, *replication.HeartbeatEvent,
		*replication.MariadbAnnotateRowsEvent, *replication.MariadbBinlogCheckPointEvent, *replication.MariadbGTIDListEvent:
		return true
	}
	switch ev.Header.EventType {
	case replication.IGNORABLE_EVENT,
		// Group Replication's certification data and view changes: no rows.
		replication.TRANSACTION_CONTEXT_EVENT, replication.VIEW_CHANGE_EVENT:
		return true
	}
	return false
}

// pending reports whether a transaction has begun and not ended.
func (tx *txState) pending() bool { return tx.active || len(tx.changes) > 0 || tx.sent || tx.xa != "" }

// event handles what is MySQL-specific in an event; done reports that the
// event needs nothing more.
func (ms *mysqlStream) event(ev *replication.BinlogEvent, tx *txState, commit func(*replication.EventHeader) error) (done bool, err error) {
	t := ms.t
	switch e := ev.Event.(type) {
	case *replication.PreviousGTIDsEvent:
		return false, ms.previous(e)
	case *replication.GtidTaggedLogEvent:
		return false, fmt.Errorf("tagged GTID %s:%s:%d: GTID tags (MySQL 8.3+) are not supported; commit without SET gtid_next='AUTOMATIC:<tag>'", hex.EncodeToString(e.SID), e.Tag.String(), e.GNO)
	case *replication.GTIDEvent:
		if tx.pending() {
			return false, fmt.Errorf("GTID event of the next transaction while %d changes of the previous one have no COMMIT: refusing to drop them", len(tx.changes))
		}
	case *replication.QueryEvent:
		verb, xid, ok := xaStatement(string(e.Query))
		if !ok {
			return false, nil
		}
		switch verb {
		case "START", "BEGIN":
			tx.active, tx.xa = true, xid
			if tx.commitTime.IsZero() {
				tx.commitTime = time.Unix(int64(ev.Header.Timestamp), 0).UTC()
			}
		case "END":
		case "COMMIT", "ROLLBACK":
			p, found, err := ms.prepared.resolve(t, xid, verb == "COMMIT", tx)
			if err != nil {
				return false, err
			}
			if found {
				tx.mysqlGTIDs = append(tx.mysqlGTIDs, p.gtid)
			}
			if verb == "ROLLBACK" {
				tx.changes = nil
			}
			return true, commit(ev.Header)
		}
		return true, nil
	case *replication.GenericEvent:
		return ms.prepared.prepare(ev, e, tx, false, commit, func(xid string) (string, error) {
			if !t.mysqlGTIDMode || len(tx.mysqlGTIDs) == 0 {
				return "", fmt.Errorf("XA PREPARE %s on a source without GTIDs: a file/offset position cannot leave a prepared transaction out, so a restart would lose its rows; set gtid_mode=ON (with enforce_gtid_consistency=ON) on the source: %w", xid, tidemark.ErrSourceConfig)
			}
			if ms.set == nil {
				return "", fmt.Errorf("XA PREPARE %s while the GTID set of the position is not known yet (resumed by file and offset, before the next binlog file's PREVIOUS_GTIDS): a position could not leave the prepared transaction out; restart from a checkpoint with a GTID set, or after FLUSH BINARY LOGS on the source", xid)
			}
			return tx.mysqlGTIDs[0], nil
		})
	}
	return false, nil
}

// canonicalGTIDSet rewrites a MySQL GTID set as one line in canonical form
// (MySQL prints @@gtid_executed with a newline after each comma).
func canonicalGTIDSet(s string) (string, error) {
	gs, err := mysql.ParseMysqlGTIDSet(strings.Join(strings.Fields(s), ""))
	if err != nil {
		return "", fmt.Errorf("parse GTID set %q: %w", s, err)
	}
	return gs.String(), nil
}
