package mysqlprimary

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/klauspost/compress/zstd"
	vtmysql "vitess.io/vitess/go/mysql"
	"vitess.io/vitess/go/mysql/replication"
)

// MySQL column types used by tables of the primary (include/field_types.h).
const (
	TypeLong       = 3
	TypeTimestamp  = 7 // inside JSON, MySQL tags temporal values with these
	TypeLongLong   = 8
	TypeDate       = 10
	TypeTime       = 11
	TypeDateTime   = 12
	TypeVarchar    = 15
	TypeJSON       = 245
	TypeNewDecimal = 246
)

// Binlog event types (libbinlogevents/include/binlog_event.h).
const (
	evQuery              = 2
	evRotate             = 4
	evFormatDescription  = 15
	evXID                = 16
	evTableMap           = 19
	evIncident           = 26
	evHeartbeat          = 27
	evGTID               = 33
	evAnonymousGTID      = 34
	evPreviousGTIDs      = 35
	evXAPrepare          = 38
	evTransactionPayload = 40
)

// Column is a column of a table as the binlog describes it.
type Column struct {
	Name     string
	Type     byte   // TypeLongLong, TypeLong, TypeVarchar or TypeJSON
	Meta     uint16 // VARCHAR: its maximum length in bytes
	Unsigned bool
	Nullable bool
}

// Table is a table of the primary: its table id and layout.
type Table struct {
	ID      uint64
	Schema  string
	Name    string
	Columns []Column
	// Key lists the primary key's column positions.
	Key []int
}

// Op is the kind of a row change.
type Op int

// Row change kinds.
const (
	Insert Op = iota
	Update
	Delete
)

// Row is one row change of a transaction. Values are nil (NULL), int64,
// uint64, string, or for a JSON column any value EncodeJSON accepts
// (wrapped in JSON so that a JSON null is not taken for SQL NULL).
type Row struct {
	Op            Op
	Table         *Table
	Before, After []any
}

// JSON marks a value of a JSON column.
type JSON struct{ V any }

// format returns the binlog format (format description) of a MySQL 8
// version: its post-header lengths per event type, from
// libbinlogevents/src/control_events.cpp of MySQL 8.0 (40 event types; 8.4
// adds HEARTBEAT_LOG_EVENT_V2 and GTID_TAGGED_LOG_EVENT).
func format(version string, checksum bool) vtmysql.BinlogFormat {
	sizes := []byte{
		0, 13, 0, 8, 0, 0, 0, 0, 4, 0, // START_V3 … DELETE_FILE
		4, 0, 0, 0, 0, 0, 4, 26, 8, 0, // … FORMAT_DESCRIPTION (set below), XID, BEGIN_LOAD, EXECUTE_LOAD, TABLE_MAP
		0, 0, 8, 8, 8, 2, 0, 0, 0, 10, // … V1 rows, INCIDENT, HEARTBEAT, IGNORABLE, ROWS_QUERY, WRITE_ROWS_V2
		10, 10, 42, 42, 0, 18, 52, 0, 10, 40, // UPDATE/DELETE_ROWS_V2, GTID, ANONYMOUS_GTID, PREVIOUS_GTIDS, TRANSACTION_CONTEXT, VIEW_CHANGE, XA_PREPARE, PARTIAL_UPDATE_ROWS, TRANSACTION_PAYLOAD
	}
	if strings.HasPrefix(version, "8.4") {
		sizes = append(sizes, 0, 0)
	}
	sizes[evFormatDescription-1] = byte(57 + len(sizes))
	f := vtmysql.BinlogFormat{
		FormatVersion: 4,
		ServerVersion: version,
		HeaderLength:  19,
		HeaderSizes:   sizes,
	}
	if checksum {
		f.ChecksumAlgorithm = vtmysql.BinlogChecksumAlgCRC32
	}
	return f
}

// file is one binlog file: its events in order, each at its offset.
type file struct {
	name   string
	prev   string // its PREVIOUS_GTIDS_LOG_EVENT's set
	events []event
	size   uint32 // offset after the last event
}

// event is one event of a file.
type event struct {
	pos  uint32 // offset of the event in its file
	raw  []byte
	gtid string // the transaction's GTID, on every event of a GTID transaction
}

// writer appends events to the current file with vitess's event builders
// (vitess.io/vitess/go/mysql), fixing each header's log position.
type writer struct {
	f      vtmysql.BinlogFormat
	s      *vtmysql.FakeBinlogStream
	file   *file
	gtid   string
	events []event
}

// add packetizes a body at the current end of the file, as the next event.
func (w *writer) add(typ byte, flags uint16, body []byte) {
	size := uint32(19 + len(body) + 4)
	w.s.LogPosition = w.file.size + size
	raw := w.s.Packetize(w.f, typ, flags, body)
	w.push(raw)
}

// addBuilt appends an event made by a vitess builder, rebuilt once its
// size is known so that its header carries the right end position.
func (w *writer) addBuilt(build func() vtmysql.BinlogEvent) {
	w.s.LogPosition = 0
	size := uint32(len(build().Bytes()))
	w.s.LogPosition = w.file.size + size
	w.push(build().Bytes())
}

func (w *writer) push(raw []byte) {
	ev := event{pos: w.file.size, raw: raw, gtid: w.gtid}
	w.file.size += uint32(len(raw))
	w.events = append(w.events, ev)
}

// body strips the header and checksum off an event built by vitess.
func (w *writer) body(ev vtmysql.BinlogEvent) []byte {
	b := ev.Bytes()
	return append([]byte(nil), b[19:len(b)-4]...)
}

// gtidBody is a MySQL 8 Gtid_log_event's body (control_events.h,
// Gtid_event): flags, SID, GNO, logical-clock timestamps, commit
// timestamps, transaction length and server version.
func gtidBody(gtid string, lastCommitted, seqNo int64, commitUs uint64, trxLen uint64, version string) ([]byte, error) {
	var sid replication.SID
	var gno int64
	if gtid != "" {
		g, err := replication.ParseMysql56GTID(gtid)
		if err != nil {
			return nil, err
		}
		m := g.(replication.Mysql56GTID)
		sid, gno = m.Server, m.Sequence
	}
	b := []byte{1} // may_have_sbr: MySQL sets it unless every statement was row-logged
	b = append(b, sid[:]...)
	b = binary.LittleEndian.AppendUint64(b, uint64(gno))
	b = append(b, 2) // LOGICAL_TIMESTAMP_TYPECODE
	b = binary.LittleEndian.AppendUint64(b, uint64(lastCommitted))
	b = binary.LittleEndian.AppendUint64(b, uint64(seqNo))
	ts := make([]byte, 8)
	binary.LittleEndian.PutUint64(ts, commitUs) // original = immediate: high bit clear
	b = append(b, ts[:7]...)
	b = appendPacked(b, trxLen)
	b = binary.LittleEndian.AppendUint32(b, versionNumber(version))
	return b, nil
}

// versionNumber turns "8.0.40" into 80040.
func versionNumber(v string) uint32 {
	var a, b, c uint32
	_, _ = fmt.Sscanf(v, "%d.%d.%d", &a, &b, &c)
	return a*10000 + b*100 + c
}

// appendPacked appends n as net_field_length (the binlog's packed integer).
func appendPacked(b []byte, n uint64) []byte {
	switch {
	case n < 251:
		return append(b, byte(n))
	case n < 1<<16:
		return binary.LittleEndian.AppendUint16(append(b, 0xfc), uint16(n))
	case n < 1<<24:
		return append(append(b, 0xfd), byte(n), byte(n>>8), byte(n>>16))
	}
	return binary.LittleEndian.AppendUint64(append(b, 0xfe), n)
}

// previousGTIDsBody encodes a Previous_gtids_log_event: the number of SIDs,
// then per SID its intervals [start, end) — the same layout as the SID block
// of COM_BINLOG_DUMP_GTID, which vitess writes.
func previousGTIDsBody(set replication.Mysql56GTIDSet) []byte { return set.SIDBlock() }

// tableMapEvent is a TABLE_MAP_EVENT with binlog_row_metadata=FULL: vitess
// writes the mandatory part, the optional metadata (rows_event.h,
// Table_map_event::Optional_metadata_field_type) follows.
func (w *writer) tableMapEvent(t *Table) []byte {
	tm := &vtmysql.TableMap{Flags: 1, Database: t.Schema, Name: t.Name, CanBeNull: vtmysql.NewServerBitmap(len(t.Columns))}
	var signed []bool
	for i, c := range t.Columns {
		tm.Types = append(tm.Types, c.Type)
		meta := c.Meta
		if c.Type == TypeJSON {
			meta = 4 // length bytes of the value
		}
		tm.Metadata = append(tm.Metadata, meta)
		tm.CanBeNull.Set(i, c.Nullable)
		if c.Type == TypeLong || c.Type == TypeLongLong {
			signed = append(signed, c.Unsigned)
		}
	}
	body := w.body(vtmysql.NewTableMapEvent(w.f, w.s, t.ID, tm))
	tlv := func(typ byte, v []byte) {
		body = append(body, typ)
		body = appendPacked(body, uint64(len(v)))
		body = append(body, v...)
	}
	// SIGNEDNESS: one bit per numeric column, most significant first.
	sb := make([]byte, (len(signed)+7)/8)
	for i, u := range signed {
		if u {
			sb[i/8] |= 0x80 >> (i % 8)
		}
	}
	tlv(1, sb)
	// DEFAULT_CHARSET: utf8mb4_0900_ai_ci (255) for every character column.
	tlv(2, appendPacked(nil, 255))
	var names []byte
	for _, c := range t.Columns {
		names = appendPacked(names, uint64(len(c.Name)))
		names = append(names, c.Name...)
	}
	tlv(4, names)
	var pk []byte
	for _, k := range t.Key {
		pk = appendPacked(pk, uint64(k))
	}
	tlv(8, pk)
	return body
}

// cell encodes one value of a column as a rows event carries it.
func cell(c Column, v any) ([]byte, error) {
	switch c.Type {
	case TypeLongLong:
		switch x := v.(type) {
		case int64:
			return binary.LittleEndian.AppendUint64(nil, uint64(x)), nil
		case uint64:
			return binary.LittleEndian.AppendUint64(nil, x), nil
		}
	case TypeLong:
		if x, ok := v.(int64); ok {
			return binary.LittleEndian.AppendUint32(nil, uint32(x)), nil
		}
	case TypeVarchar:
		if x, ok := v.(string); ok {
			if c.Meta < 256 {
				return append([]byte{byte(len(x))}, x...), nil
			}
			return append(binary.LittleEndian.AppendUint16(nil, uint16(len(x))), x...), nil
		}
	case TypeJSON:
		if x, ok := v.(JSON); ok {
			enc, err := EncodeJSON(x.V)
			if err != nil {
				return nil, err
			}
			return append(binary.LittleEndian.AppendUint32(nil, uint32(len(enc))), enc...), nil
		}
	}
	return nil, fmt.Errorf("encode column %s (type %d): unsupported value %T", c.Name, c.Type, v)
}

// image encodes a full row image: its null bitmap and its values.
func image(t *Table, vals []any) (vtmysql.Bitmap, []byte, error) {
	if len(vals) != len(t.Columns) {
		return vtmysql.Bitmap{}, nil, fmt.Errorf("row of %s.%s: %d values for %d columns", t.Schema, t.Name, len(vals), len(t.Columns))
	}
	nulls := vtmysql.NewServerBitmap(len(t.Columns))
	var data []byte
	for i, v := range vals {
		if v == nil {
			nulls.Set(i, true)
			continue
		}
		b, err := cell(t.Columns[i], v)
		if err != nil {
			return nulls, nil, err
		}
		data = append(data, b...)
	}
	return nulls, data, nil
}

// rowsEvent encodes one row change as a v2 rows event (binlog_row_image=FULL:
// every column in both images), built by vitess.
func (w *writer) rowsEvent(r Row) (vtmysql.BinlogEvent, error) {
	n := len(r.Table.Columns)
	all := vtmysql.NewServerBitmap(n)
	for i := 0; i < n; i++ {
		all.Set(i, true)
	}
	rows := vtmysql.Rows{Flags: 1} // STMT_END_F: each event ends its statement here
	var row vtmysql.Row
	var err error
	switch r.Op {
	case Insert:
		rows.DataColumns = all
		if row.NullColumns, row.Data, err = image(r.Table, r.After); err != nil {
			return nil, err
		}
		rows.Rows = []vtmysql.Row{row}
		return vtmysql.NewWriteRowsEvent(w.f, w.s, r.Table.ID, rows), nil
	case Delete:
		rows.IdentifyColumns = all
		if row.NullIdentifyColumns, row.Identify, err = image(r.Table, r.Before); err != nil {
			return nil, err
		}
		rows.Rows = []vtmysql.Row{row}
		return vtmysql.NewDeleteRowsEvent(w.f, w.s, r.Table.ID, rows), nil
	default:
		rows.IdentifyColumns, rows.DataColumns = all, all
		if row.NullIdentifyColumns, row.Identify, err = image(r.Table, r.Before); err != nil {
			return nil, err
		}
		if row.NullColumns, row.Data, err = image(r.Table, r.After); err != nil {
			return nil, err
		}
		rows.Rows = []vtmysql.Row{row}
		return vtmysql.NewUpdateRowsEvent(w.f, w.s, r.Table.ID, rows), nil
	}
}

// rowEvents appends the table map and rows events of a transaction's rows,
// each row as one statement: its table map, then its rows event flagged
// STMT_END_F (after which a replica forgets the statement's table maps).
func (w *writer) rowEvents(rows []Row) error {
	for _, r := range rows {
		w.add(evTableMap, 0, w.tableMapEvent(r.Table))
		if _, err := w.rowsEvent(r); err != nil {
			return err
		}
		w.addBuilt(func() vtmysql.BinlogEvent { ev, _ := w.rowsEvent(r); return ev })
	}
	return nil
}

// query appends a Query_log_event.
func (w *writer) query(db, sql string) {
	w.addBuilt(func() vtmysql.BinlogEvent {
		return vtmysql.NewQueryEvent(w.f, w.s, vtmysql.Query{Database: db, SQL: sql})
	})
}

// xid appends an Xid_log_event.
func (w *writer) xid() {
	w.addBuilt(func() vtmysql.BinlogEvent { return vtmysql.NewXIDEvent(w.f, w.s) })
}

// xaID formats an XID as MySQL logs it in XA statements: X'gtrid',X'bqual',formatID.
func xaID(gtrid string) string {
	return fmt.Sprintf("X'%s',X'',1", hex.EncodeToString([]byte(gtrid)))
}

// xaPrepareBody encodes an XA_prepare_log_event: one_phase, formatID,
// gtrid and bqual lengths, then the XID's data.
func xaPrepareBody(gtrid string, onePhase bool) []byte {
	b := []byte{0}
	if onePhase {
		b[0] = 1
	}
	b = binary.LittleEndian.AppendUint32(b, 1)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(gtrid)))
	b = binary.LittleEndian.AppendUint32(b, 0)
	return append(b, gtrid...)
}

// payloadBody encodes a Transaction_payload_event: its header fields as
// (type, length, value) packed integers — compression type, uncompressed
// size, payload size — the end mark, then the zstd-compressed events.
func payloadBody(inner []byte) ([]byte, error) {
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		return nil, err
	}
	compressed := enc.EncodeAll(inner, nil)
	_ = enc.Close()
	field := func(b []byte, typ byte, v uint64) []byte {
		pv := appendPacked(nil, v)
		b = appendPacked(b, uint64(typ))
		b = appendPacked(b, uint64(len(pv)))
		return append(b, pv...)
	}
	var b []byte
	b = field(b, 2, 0) // compression type: ZSTD
	b = field(b, 3, uint64(len(inner)))
	b = field(b, 1, uint64(len(compressed)))
	b = append(b, 0) // end mark
	return append(b, compressed...), nil
}

// innerEvents re-encodes events for a compressed payload: MySQL writes the
// transaction's events there without checksums and with log position 0.
func innerEvents(f vtmysql.BinlogFormat, evs []event) []byte {
	var buf bytes.Buffer
	for _, ev := range evs {
		raw := append([]byte(nil), ev.raw...)
		if f.ChecksumAlgorithm == vtmysql.BinlogChecksumAlgCRC32 {
			raw = raw[:len(raw)-4]
		}
		binary.LittleEndian.PutUint32(raw[9:13], uint32(len(raw)))
		binary.LittleEndian.PutUint32(raw[13:17], 0)
		buf.Write(raw)
	}
	return buf.Bytes()
}
