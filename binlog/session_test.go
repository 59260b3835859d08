package binlog

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"tidemark"
)

// Hand-built replication events for session.handle: what go-mysql hands
// the tailer, with no server. Rows events go through go-mysql's own parser
// (their type is not settable otherwise), from bytes written here.

const sessionTestTime = 1767225600 // 2026-01-01 00:00:00 UTC

func hdr(typ replication.EventType, logPos, size uint32) *replication.EventHeader {
	return &replication.EventHeader{Timestamp: sessionTestTime, EventType: typ, ServerID: 1, LogPos: logPos, EventSize: size}
}

func mariaGTIDEv(seq uint64, flags byte, logPos uint32) *replication.BinlogEvent {
	return &replication.BinlogEvent{Header: hdr(replication.MARIADB_GTID_EVENT, logPos, 40),
		Event: &replication.MariadbGTIDEvent{GTID: mysql.MariadbGTID{DomainID: 0, ServerID: 1, SequenceNumber: seq}, Flags: flags}}
}

func mysqlGTIDEv(sid []byte, gno int64, logPos uint32) *replication.BinlogEvent {
	return &replication.BinlogEvent{Header: hdr(replication.GTID_EVENT, logPos, 79), Event: &replication.GTIDEvent{SID: sid, GNO: gno}}
}

func queryEv(q string, logPos uint32) *replication.BinlogEvent {
	return &replication.BinlogEvent{Header: hdr(replication.QUERY_EVENT, logPos, 60), Event: &replication.QueryEvent{Schema: []byte("db"), Query: []byte(q)}}
}

func xidEv(logPos uint32) *replication.BinlogEvent {
	return &replication.BinlogEvent{Header: hdr(replication.XID_EVENT, logPos, 31), Event: &replication.XIDEvent{XID: 7}}
}

func rotateEv(next string) *replication.BinlogEvent {
	return &replication.BinlogEvent{Header: hdr(replication.ROTATE_EVENT, 0, 44), Event: &replication.RotateEvent{Position: 4, NextLogName: []byte(next)}}
}

func payloadEv(logPos uint32, evs ...*replication.BinlogEvent) *replication.BinlogEvent {
	return &replication.BinlogEvent{Header: hdr(replication.TRANSACTION_PAYLOAD_EVENT, logPos, 200), Event: &replication.TransactionPayloadEvent{Events: evs}}
}

// unknownEv is an event type go-mysql does not know (it decodes it as a
// GenericEvent).
func unknownEv(logPos uint32) *replication.BinlogEvent {
	return &replication.BinlogEvent{Header: hdr(replication.EventType(0xab), logPos, 30), Event: &replication.GenericEvent{Data: []byte{1, 2, 3}}}
}

// xaPrepareAt is an XA_PREPARE_LOG_EVENT of XID gtrid (format 1).
func xaPrepareAt(gtrid string, logPos uint32) *replication.BinlogEvent {
	ev, _ := xaPrepareEvent(gtrid, false)
	ev.Header.LogPos = logPos
	return ev
}

// rowsParser decodes hand-written table-map and rows events of table db.t
// (id INT PRIMARY KEY, v INT) with go-mysql's parser.
type rowsParser struct {
	t  *testing.T
	p  *replication.BinlogParser
	tm *replication.TableMapEvent
}

func (r *rowsParser) parse(typ replication.EventType, logPos uint32, body []byte) *replication.BinlogEvent {
	r.t.Helper()
	raw := make([]byte, replication.EventHeaderSize, replication.EventHeaderSize+len(body))
	binary.LittleEndian.PutUint32(raw[0:], sessionTestTime)
	raw[4] = byte(typ)
	binary.LittleEndian.PutUint32(raw[5:], 1)
	binary.LittleEndian.PutUint32(raw[9:], uint32(replication.EventHeaderSize+len(body)))
	binary.LittleEndian.PutUint32(raw[13:], logPos)
	ev, err := r.p.Parse(append(raw, body...))
	if err != nil {
		r.t.Fatalf("parse %s: %v", typ, err)
	}
	return ev
}

func newRowsParser(t *testing.T) *rowsParser {
	r := &rowsParser{t: t, p: replication.NewBinlogParser()}
	// A format description without checksums: version 4, a server version
	// older than checksums, header length 19, every post-header 8 bytes.
	fde := binary.LittleEndian.AppendUint16(nil, 4)
	fde = append(fde, make([]byte, 50)...)
	copy(fde[2:], "5.0.99")
	fde = append(fde, 0, 0, 0, 0, replication.EventHeaderSize)
	for range 40 {
		fde = append(fde, 8)
	}
	r.parse(replication.FORMAT_DESCRIPTION_EVENT, 0, fde)
	tm := []byte{42, 0, 0, 0, 0, 0, 0, 0, 2, 'd', 'b', 0, 1, 't', 0, 2, mysql.MYSQL_TYPE_LONG, mysql.MYSQL_TYPE_LONG, 0, 0}
	ev := r.parse(replication.TABLE_MAP_EVENT, 0, tm)
	r.tm = ev.Event.(*replication.TableMapEvent)
	// binlog_row_metadata=FULL's column names and primary key.
	r.tm.ColumnName = [][]byte{[]byte("id"), []byte("v")}
	r.tm.PrimaryKey = []uint64{0}
	return r
}

// tableMap is the table map of db.t (harmless to the session).
func (r *rowsParser) tableMap(logPos uint32) *replication.BinlogEvent {
	return &replication.BinlogEvent{Header: hdr(replication.TABLE_MAP_EVENT, logPos, 40), Event: r.tm}
}

// rows is a v1 rows event of db.t, rows given as (id, v) images (an
// update's as before, after, before, after…).
func (r *rowsParser) rows(typ replication.EventType, logPos uint32, images ...[2]int32) *replication.BinlogEvent {
	body := []byte{42, 0, 0, 0, 0, 0, 0, 0, 2, 0x03} // no STMT_END_F: go-mysql would forget the table map
	if typ == replication.UPDATE_ROWS_EVENTv1 {
		body = append(body, 0x03)
	}
	for _, img := range images {
		body = append(body, 0) // no NULLs
		body = binary.LittleEndian.AppendUint32(body, uint32(img[0]))
		body = binary.LittleEndian.AppendUint32(body, uint32(img[1]))
	}
	return r.parse(typ, logPos, body)
}

// sessionTailer is a Tailer that never connects, with db.t's layout
// cached as a table map of it would have left it.
func sessionTailer(t *testing.T, flavor string, maxChanges int, r *rowsParser) *Tailer {
	t.Helper()
	tl, err := New(Config{Name: "s", Flavor: flavor, Addr: "127.0.0.1:1", User: "u", ServerID: 1, MaxChunkChanges: maxChanges})
	if err != nil {
		t.Fatal(err)
	}
	ti, err := tl.buildTable(r.tm, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ti.table.IndexesKnown = true
	tl.tables.put(tidemark.TableID{Database: "db", Name: "t"}, tableMapKey(r.tm), ti)
	return tl
}

// chunkString is a chunk as the table below states it: each change as
// "op before→after @version", then its DDL, then "commit <position>" or
// "no commit".
func chunkString(ch tidemark.Chunk) string {
	var parts []string
	for _, c := range ch.Changes {
		parts = append(parts, fmt.Sprintf("%s %v→%v @%s", c.Op, c.Before, c.After, c.Version))
	}
	for _, d := range ch.DDL {
		parts = append(parts, d.String())
	}
	if ch.Commit.IsZero() {
		parts = append(parts, "no commit")
	} else {
		parts = append(parts, "commit "+ch.Commit.String())
	}
	return strings.Join(parts, "; ")
}

// TestSessionHandle feeds hand-built events through session.handle, as
// streamOnce does (the events of a compressed transaction are taken with
// session.next), with no server, and checks after every event the chunks
// emitted, the stream's position and the error.
func TestSessionHandle(t *testing.T) {
	r := newRowsParser(t)
	sid := []byte{0x3e, 0x11, 0xfa, 0x47, 0x71, 0xca, 0x11, 0xe1, 0x9e, 0x33, 0xc8, 0x0a, 0xa9, 0x42, 0x95, 0x63}
	uuid := "3e11fa47-71ca-11e1-9e33-c80aa9429563"
	at := func(gtid, file string, offset uint64) string {
		return tidemark.Position{GTID: gtid, File: file, Offset: offset}.String()
	}
	mysqlSeq := func(file uint64, logPos, size uint32) string { return fmt.Sprint(file<<40 | uint64(logPos-size)) }

	type step struct {
		ev     *replication.BinlogEvent
		chunks []string // emitted by the event
		pos    string   // the stream's position after it
		err    string   // a part of the error; "" for none
	}
	const mfile, mfile2 = "mariadb-bin.000001", "mariadb-bin.000002"
	start := at("0-1-4", mfile, 200)
	cases := []struct {
		name       string
		flavor     string
		maxChanges int
		steps      []step
	}{{
		name: "MariaDB: a transaction of inserts, an update and a delete, then a rotate and a DDL",
		steps: []step{
			{ev: mariaGTIDEv(5, 0, 300), pos: start},
			{ev: queryEv("BEGIN", 350), pos: start},
			{ev: r.tableMap(400), pos: start},
			{ev: r.rows(replication.WRITE_ROWS_EVENTv1, 450, [2]int32{1, 10}, [2]int32{2, 20}), pos: start},
			{ev: r.rows(replication.UPDATE_ROWS_EVENTv1, 500, [2]int32{1, 10}, [2]int32{1, 11}), pos: start},
			{ev: r.rows(replication.DELETE_ROWS_EVENTv1, 550, [2]int32{2, 20}), pos: start},
			{ev: xidEv(600), chunks: []string{
				"c []→[1 10] @5.1; c []→[2 20] @5.2; u [1 10]→[1 11] @5.3; d [2 20]→[] @5.4; commit gtid=0-1-5;file=" + mfile + ";pos=600",
			}, pos: "gtid=0-1-5;file=" + mfile + ";pos=600"},
			{ev: rotateEv(mfile2), pos: "gtid=0-1-5;file=" + mfile + ";pos=600"},
			{ev: mariaGTIDEv(6, replication.BINLOG_MARIADB_FL_STANDALONE, 700), pos: "gtid=0-1-5;file=" + mfile + ";pos=600"},
			{ev: queryEv("CREATE TABLE t2 (id INT PRIMARY KEY)", 800), chunks: []string{
				"CREATE TABLE db.t2; commit gtid=0-1-6;file=" + mfile2 + ";pos=800",
			}, pos: "gtid=0-1-6;file=" + mfile2 + ";pos=800"},
			// Between transactions an unknown event passes.
			{ev: unknownEv(850), pos: "gtid=0-1-6;file=" + mfile2 + ";pos=800"},
		},
	}, {
		name:       "MariaDB: a transaction larger than a chunk is sent in parts, the position only with the last",
		maxChanges: 2,
		steps: []step{
			{ev: mariaGTIDEv(5, 0, 300), pos: start},
			{ev: queryEv("BEGIN", 350), pos: start},
			{ev: r.rows(replication.WRITE_ROWS_EVENTv1, 450, [2]int32{1, 1}, [2]int32{2, 2}), pos: start},
			{ev: r.rows(replication.WRITE_ROWS_EVENTv1, 500, [2]int32{3, 3}), chunks: []string{
				"c []→[1 1] @5.1; c []→[2 2] @5.2; no commit",
			}, pos: start},
			{ev: xidEv(600), chunks: []string{
				"c []→[3 3] @5.3; commit gtid=0-1-5;file=" + mfile + ";pos=600",
			}, pos: "gtid=0-1-5;file=" + mfile + ";pos=600"},
		},
	}, {
		name: "MariaDB: an unknown event inside a transaction with rows stops the stream, the position stays",
		steps: []step{
			{ev: mariaGTIDEv(5, 0, 300), pos: start},
			{ev: queryEv("BEGIN", 350), pos: start},
			{ev: r.rows(replication.WRITE_ROWS_EVENTv1, 450, [2]int32{1, 10}), pos: start},
			{ev: unknownEv(500), pos: start,
				err: "stream binlog of s at " + mfile + ":500: event UnknownEvent (type 171) inside a transaction with pending rows: tidemark does not know it and will not skip it"},
		},
	}, {
		name: "MariaDB: while an XA transaction is prepared nothing moves the position; at XA COMMIT the held transaction goes out, then the XA rows",
		steps: []step{
			{ev: mariaGTIDEv(5, mariaFlPreparedXA, 300), pos: start},
			{ev: queryEv("XA START X'78',X'',1", 350), pos: start},
			{ev: r.rows(replication.WRITE_ROWS_EVENTv1, 400, [2]int32{1, 1}), pos: start},
			{ev: queryEv("XA END X'78',X'',1", 450), pos: start},
			{ev: xaPrepareAt("x", 500), pos: start},
			{ev: mariaGTIDEv(6, 0, 600), pos: start},
			{ev: queryEv("BEGIN", 650), pos: start},
			{ev: r.rows(replication.WRITE_ROWS_EVENTv1, 700, [2]int32{2, 2}), pos: start},
			{ev: xidEv(750), pos: start},
			{ev: mariaGTIDEv(7, mariaFlCompletedXA, 800), pos: start},
			{ev: queryEv("XA COMMIT X'78',X'',1", 850), chunks: []string{
				"c []→[2 2] @6.1; commit " + at("0-1-6", mfile, 750),
				"c []→[1 1] @7.1; commit " + at("0-1-7", mfile, 850),
			}, pos: at("0-1-7", mfile, 850)},
		},
	}, {
		name:   "MySQL: a compressed transaction's events are handled as if uncompressed; its GTID joins the set",
		flavor: FlavorMySQL,
		steps: []step{
			{ev: payloadEv(900,
				mysqlGTIDEv(sid, 5, 300),
				queryEv("BEGIN", 350),
				r.tableMap(400),
				r.rows(replication.WRITE_ROWS_EVENTv1, 450, [2]int32{7, 70}),
				xidEv(900),
			), chunks: []string{
				"c []→[7 70] @" + mysqlSeq(1, 300, 79) + ".1; commit gtid=" + uuid + ":1-5;file=binlog.000001;pos=900",
			}, pos: "gtid=" + uuid + ":1-5;file=binlog.000001;pos=900"},
			{ev: rotateEv("binlog.000002"), pos: "gtid=" + uuid + ":1-5;file=binlog.000001;pos=900"},
			{ev: mysqlGTIDEv(sid, 6, 200), pos: "gtid=" + uuid + ":1-5;file=binlog.000001;pos=900"},
			{ev: queryEv("BEGIN", 250), pos: "gtid=" + uuid + ":1-5;file=binlog.000001;pos=900"},
			{ev: r.rows(replication.DELETE_ROWS_EVENTv1, 300, [2]int32{7, 70}), pos: "gtid=" + uuid + ":1-5;file=binlog.000001;pos=900"},
			{ev: xidEv(350), chunks: []string{
				"d [7 70]→[] @" + mysqlSeq(2, 200, 79) + ".1; commit gtid=" + uuid + ":1-6;file=binlog.000002;pos=350",
			}, pos: "gtid=" + uuid + ":1-6;file=binlog.000002;pos=350"},
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := make(chan tidemark.Chunk, 16)
			flavor := tc.flavor
			if flavor == "" {
				flavor = FlavorMariaDB
			}
			tl := sessionTailer(t, flavor, tc.maxChanges, r)
			s := &session{t: tl, out: out}
			// As startAt leaves a session.
			if flavor == FlavorMariaDB {
				s.pos = &tidemark.Position{GTID: "0-1-4", File: mfile, Offset: 200}
				s.gtids = tidemark.MariaDBGTIDSet{0: {Domain: 0, ServerID: 1, Seq: 4}}
				s.mariaXA = &mariaXA{t: tl, prepared: xaSet{}}
			} else {
				gs, err := mysql.ParseMysqlGTIDSet(uuid + ":1-4")
				if err != nil {
					t.Fatal(err)
				}
				tl.mysqlGTIDMode = true
				s.pos = &tidemark.Position{GTID: uuid + ":1-4", File: "binlog.000001", Offset: 200}
				s.mysql = &mysqlStream{t: tl, set: gs.(*mysql.MysqlGTIDSet), prepared: xaSet{}}
			}
			s.file = s.pos.File
			ctx := context.Background()
			for i, st := range tc.steps {
				err := s.handle(ctx, st.ev)
				for err == nil && len(s.inner) > 0 {
					var ev *replication.BinlogEvent
					if ev, err = s.next(ctx); err == nil {
						err = s.handle(ctx, ev)
					}
				}
				what := fmt.Sprintf("event %d (%s at %d)", i+1, st.ev.Header.EventType, st.ev.Header.LogPos)
				if st.err == "" && err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if st.err != "" && (err == nil || !strings.Contains(err.Error(), st.err)) {
					t.Fatalf("%s: error %v, want one with %q", what, err, st.err)
				}
				var got []string
				for len(out) > 0 {
					got = append(got, chunkString(<-out))
				}
				if strings.Join(got, "\n") != strings.Join(st.chunks, "\n") {
					t.Fatalf("%s: chunks\n%s\nwant\n%s", what, strings.Join(got, "\n"), strings.Join(st.chunks, "\n"))
				}
				if p := s.pos.String(); p != st.pos {
					t.Fatalf("%s: position %s, want %s", what, p, st.pos)
				}
			}
		})
	}
}
