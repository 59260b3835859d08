package mysql8

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"tidemark"
	"tidemark/binlog"
	"tidemark/integration/mysqlprimary"
)

// TestMySQLJSONExact: MySQL's binary JSON arrives as exact JSON text: big
// integers, decimals with every digit and their scale, doubles as doubles,
// DATETIME/DATE/TIME inside JSON as MySQL prints them, deep nesting and a
// document large enough for the large (32-bit offset) format.
func TestMySQLJSONExact(t *testing.T) {
	for _, version := range versions {
		t.Run(version, func(t *testing.T) {
			p := startPrimary(t, mysqlprimary.Config{Version: version, ServerUUID: uuidA})
			deep := any(mysqlprimary.JSONObject{{Key: "n", Value: uint64(18446744073709551615)}})
			for i := 0; i < 90; i++ {
				deep = []any{deep}
			}
			cases := []struct {
				name string
				v    any
				want string
			}{
				{"big integers", []any{uint64(18446744073709551615), int64(-9223372036854775808), int64(9007199254740993)}, `[18446744073709551615, -9223372036854775808, 9007199254740993]`},
				{"decimals", mysqlprimary.JSONObject{
					{Key: "price", Value: mysqlprimary.JSONDecimal{Digits: "12.50", Precision: 10, Scale: 2}},
					{Key: "huge", Value: mysqlprimary.JSONDecimal{Digits: "-12345678901234567890.123456789", Precision: 30, Scale: 9}},
				}, `{"huge": -12345678901234567890.123456789, "price": 12.50}`},
				{"doubles", []any{1.0, 0.1, 1e300, -2.5}, `[1.0, 0.1, 1e300, -2.5]`},
				{"temporal", []any{
					mysqlprimary.JSONTemporal{Type: mysqlprimary.TypeDateTime, Year: 2026, Month: 3, Day: 29, Hour: 1, Minute: 30, Us: 250000},
					mysqlprimary.JSONTemporal{Type: mysqlprimary.TypeDate, Year: 1969, Month: 7, Day: 20},
					mysqlprimary.JSONTemporal{Type: mysqlprimary.TypeTime, Hour: 838, Minute: 59, Second: 59},
				}, `["2026-03-29 01:30:00.250000", "1969-07-20", "838:59:59.000000"]`},
				{"deep", deep, strings.Repeat("[", 90) + `{"n": 18446744073709551615}` + strings.Repeat("]", 90)},
				{"large", mysqlprimary.JSONObject{{Key: "s", Value: strings.Repeat("é", 40000)}, {Key: "t", Value: true}}, `{"s": "` + strings.Repeat("é", 40000) + `", "t": true}`},
				{"null inside", mysqlprimary.JSONObject{{Key: "a", Value: nil}}, `{"a": null}`},
			}
			for i, c := range cases {
				if err := p.Commit(mysqlprimary.Txn{GTID: strconv.Itoa(i + 1), DB: "shop", Rows: []mysqlprimary.Row{
					{Op: mysqlprimary.Insert, Table: itemsTable, After: []any{int64(i + 1), c.name, mysqlprimary.JSON{V: c.v}}},
				}}); err != nil {
					t.Fatal(err)
				}
			}
			changes, _, err := stream(t, newTailer(t, p, nil), tidemark.Position{}, len(cases))
			if err != nil {
				t.Fatal(err)
			}
			for i, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					got, ok := changes[i].After[2].(tidemark.JSON)
					if !ok {
						t.Fatalf("value %T, want tidemark.JSON", changes[i].After[2])
					}
					if !sameJSON(t, string(got), c.want) {
						t.Fatalf("JSON\n%.300s\nwant\n%.300s", got, c.want)
					}
				})
			}
		})
	}
}

// versions are the MySQL versions the stream tests run against.
var versions = []string{"8.0.40", "8.4.3"}

// sameJSON compares two JSON texts exactly up to white space: numbers by
// their literal text, objects by key order.
func sameJSON(t *testing.T, a, b string) bool {
	t.Helper()
	return reflect.DeepEqual(tokens(t, a), tokens(t, b))
}

func tokens(t *testing.T, s string) []any {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var out []any
	for {
		tok, err := d.Token()
		if err != nil {
			if err.Error() == "EOF" {
				return out
			}
			t.Fatalf("parse JSON %.100s: %v", s, err)
		}
		out = append(out, tok)
	}
}

// TestMySQLCompressedTransactions: transactions written compressed
// (binlog_transaction_compression=ON: a TRANSACTION_PAYLOAD_EVENT) arrive
// like the others, in order, and a restart from a position after one does
// not read it again.
func TestMySQLCompressedTransactions(t *testing.T) {
	for _, version := range versions {
		t.Run(version, func(t *testing.T) {
			p := startPrimary(t, mysqlprimary.Config{Version: version, ServerUUID: uuidA, Vars: map[string]string{"binlog_transaction_compression": "1"}})
			commitN(t, p, []string{"1"}, 1)
			if err := p.CommitCompressed(mysqlprimary.Txn{GTID: "2", DB: "shop", Rows: []mysqlprimary.Row{ins(2, "z"), ins(3, "z"),
				{Op: mysqlprimary.Update, Table: itemsTable, Before: []any{int64(1), "1", nil}, After: []any{int64(1), "one", nil}}}}); err != nil {
				t.Fatal(err)
			}
			if err := p.CommitCompressed(mysqlprimary.Txn{GTID: "3", DB: "shop", Rows: []mysqlprimary.Row{{Op: mysqlprimary.Delete, Table: itemsTable, Before: []any{int64(2), "z", nil}}}}); err != nil {
				t.Fatal(err)
			}
			commitN(t, p, []string{"4"}, 4)
			changes, pos, err := stream(t, newTailer(t, p, nil), tidemark.Position{}, 4)
			if err != nil {
				t.Fatal(err)
			}
			eqIDs(t, changes, 1, 2, 3, 1, 2, 4)
			if changes[3].Op != tidemark.OpUpdate || changes[3].After[1] != "one" || changes[4].Op != tidemark.OpDelete {
				t.Fatalf("changes %v", changes)
			}
			if pos[1].GTID != uuidA+":1-2" || pos[2].GTID != uuidA+":1-3" {
				t.Fatalf("positions %v", pos)
			}
			// Resume after the first compressed transaction, by GTID and by file.
			for _, from := range []tidemark.Position{pos[1], {File: pos[1].File, Offset: pos[1].Offset}} {
				changes, _, err = stream(t, newTailer(t, p, nil), from, 2)
				if err != nil {
					t.Fatal(err)
				}
				eqIDs(t, changes, 2, 4)
			}
		})
	}
}

// TestMySQLXA: XA PREPARE holds its rows until XA COMMIT (then they are
// applied, after the transactions committed in between), XA ROLLBACK drops
// them, XA COMMIT … ONE PHASE is an ordinary commit; a restart while a
// transaction is prepared reads its XA PREPARE again (the positions leave
// its GTID out).
func TestMySQLXA(t *testing.T) {
	for _, version := range versions {
		t.Run(version, func(t *testing.T) {
			p := startPrimary(t, mysqlprimary.Config{Version: version, ServerUUID: uuidA})
			must := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			must(p.XAPrepare("1", "shop", "x1", []mysqlprimary.Row{ins(10, "xa"), ins(11, "xa")}, false))
			commitN(t, p, []string{"2"}, 12)
			must(p.XAPrepare("3", "shop", "x2", []mysqlprimary.Row{ins(20, "rolled back")}, false))
			must(p.XACommit("4", "shop", "x1"))
			must(p.XARollback("5", "shop", "x2"))
			must(p.XAPrepare("6", "shop", "x3", []mysqlprimary.Row{ins(30, "one phase")}, true))

			changes, pos, err := stream(t, newTailer(t, p, nil), tidemark.Position{}, 4)
			if err != nil {
				t.Fatal(err)
			}
			eqIDs(t, changes, 12, 10, 11, 30)
			if want := uuidA + ":2"; pos[0].GTID != want {
				t.Fatalf("position after the commit between XA PREPARE and XA COMMIT: %q, want %q (the prepared GTID left out)", pos[0].GTID, want)
			}
			if want := uuidA + ":1-2:4"; pos[1].GTID != want {
				t.Fatalf("position after XA COMMIT: %q, want %q", pos[1].GTID, want)
			}
			if want := uuidA + ":1-6"; pos[3].GTID != want {
				t.Fatalf("last position %q, want %q", pos[3].GTID, want)
			}
			// A restart at the position between XA PREPARE and XA COMMIT.
			changes, _, err = stream(t, newTailer(t, p, nil), pos[0], 3)
			if err != nil {
				t.Fatal(err)
			}
			eqIDs(t, changes, 10, 11, 30)
		})
	}
}

// TestMySQLXAWithoutGTIDsRefused: without GTIDs a position cannot leave a
// prepared transaction out; a two-phase XA PREPARE stops the stream,
// naming gtid_mode.
func TestMySQLXAWithoutGTIDsRefused(t *testing.T) {
	p := startPrimary(t, mysqlprimary.Config{Vars: map[string]string{"gtid_mode": "OFF"}})
	commitN(t, p, []string{""}, 1)
	if err := p.XAPrepare("", "shop", "x1", []mysqlprimary.Row{ins(10, "xa")}, false); err != nil {
		t.Fatal(err)
	}
	changes, _, err := stream(t, newTailer(t, p, nil), tidemark.Position{}, 2)
	eqIDs(t, changes, 1)
	if !errors.Is(err, tidemark.ErrSourceConfig) || !strings.Contains(err.Error(), "gtid_mode=ON") || !strings.Contains(err.Error(), "XA PREPARE X'7831',X'',1") {
		t.Fatalf("err %v, want a refusal naming the XID and gtid_mode=ON", err)
	}
}

// TestMySQLUnknownEventInTransactionStops: an event tidemark does not know,
// inside a transaction with rows, stops the stream naming it; the rows
// before it are not committed.
func TestMySQLUnknownEventInTransactionStops(t *testing.T) {
	for _, c := range []struct {
		name string
		typ  byte
		body []byte
		want string
	}{
		{"incident", 26, append([]byte{1, 0, 9}, "LOST_EVENT"[:9]...), "IncidentEvent (type 26)"},
		{"unknown type", 99, []byte{1, 2, 3}, "(type 99)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := startPrimary(t, mysqlprimary.Config{ServerUUID: uuidA})
			commitN(t, p, []string{"1"}, 1)
			if err := p.RawEvent("2", "shop", []mysqlprimary.Row{ins(2, "x")}, c.typ, c.body); err != nil {
				t.Fatal(err)
			}
			commitN(t, p, []string{"3"}, 3)
			changes, pos, err := stream(t, newTailer(t, p, nil), tidemark.Position{}, 3)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "inside a transaction with pending rows") {
				t.Fatalf("err %v, want a stop naming %s", err, c.want)
			}
			if len(pos) != 1 {
				t.Fatalf("%d commits, want only the one before the event", len(pos))
			}
			eqIDs(t, changes, 1)
		})
	}
}

// TestMySQLHarmlessEventInTransactionPasses: a Group Replication view
// change (VIEW_CHANGE_EVENT inside BEGIN … COMMIT) carries no rows and does
// not stop the stream.
func TestMySQLHarmlessEventInTransactionPasses(t *testing.T) {
	p := startPrimary(t, mysqlprimary.Config{ServerUUID: uuidA})
	commitN(t, p, []string{"1"}, 1)
	if err := p.RawEvent("2", "", nil, 37, make([]byte, 52)); err != nil {
		t.Fatal(err)
	}
	commitN(t, p, []string{"3"}, 3)
	changes, pos, err := stream(t, newTailer(t, p, nil), tidemark.Position{}, 3)
	if err != nil {
		t.Fatal(err)
	}
	eqIDs(t, changes, 1, 3)
	if pos[2].GTID != uuidA+":1-3" {
		t.Fatalf("positions %v", pos)
	}
}

// TestMySQLStartChecks: each setting tidemark needs is checked at start,
// with the fix in the message; gtid_mode=OFF resumes by file and offset.
func TestMySQLStartChecks(t *testing.T) {
	for _, c := range []struct{ name, value, want string }{
		{"binlog_row_image", "MINIMAL", "set binlog_row_image=FULL"},
		{"binlog_row_metadata", "MINIMAL", "set binlog_row_metadata=FULL"},
		{"binlog_format", "MIXED", "set binlog_format=ROW"},
		{"binlog_row_value_options", "PARTIAL_JSON", "set binlog_row_value_options=''"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := startPrimary(t, mysqlprimary.Config{Vars: map[string]string{c.name: c.value}})
			commitN(t, p, []string{"1"}, 1)
			_, pos, err := stream(t, newTailer(t, p, nil), tidemark.Position{}, 1)
			if !errors.Is(err, tidemark.ErrSourceConfig) || !strings.Contains(err.Error(), c.want) || len(pos) > 0 {
				t.Fatalf("err %v, want ErrSourceConfig naming %q before any row", err, c.want)
			}
		})
	}
	t.Run("gtid_mode OFF", func(t *testing.T) {
		p := startPrimary(t, mysqlprimary.Config{Vars: map[string]string{"gtid_mode": "OFF"}})
		commitN(t, p, []string{"", ""}, 1)
		_, pos, err := stream(t, newTailer(t, p, nil), tidemark.Position{}, 2)
		if err != nil || pos[1].GTID != "" || pos[1].File != "binlog.000001" {
			t.Fatalf("positions %v, err %v", pos, err)
		}
		commitN(t, p, []string{""}, 3)
		changes, _, err := stream(t, newTailer(t, p, nil), pos[1], 1)
		if err != nil {
			t.Fatal(err)
		}
		eqIDs(t, changes, 3)
	})
}

// TestMySQLCaptureStatusStatement: the reader captures the position from
// performance_schema.log_status by default; with capture: flush_tables it
// uses SHOW BINARY LOG STATUS on 8.4 (which has no SHOW MASTER STATUS) and
// falls back to SHOW MASTER STATUS on 8.0; a multi-UUID set arrives as one
// line. (The real MySQL 9.7 proves the capture's consistency:
// binlog.TestMySQLCaptureSeesEverythingBeforeIt.)
func TestMySQLCaptureStatusStatement(t *testing.T) {
	for _, c := range []struct{ version, capture, statement string }{
		{"8.4.3", binlog.CaptureFlushTables, "SHOW BINARY LOG STATUS"}, {"8.0.40", binlog.CaptureFlushTables, "SHOW MASTER STATUS"},
		{"8.4.3", "", "SELECT LOCAL, UTC_TIMESTAMP(6) FROM performance_schema.log_status"},
	} {
		t.Run(c.version+" "+c.statement, func(t *testing.T) {
			p := startPrimary(t, mysqlprimary.Config{Version: c.version, ServerUUID: uuidB, Password: "pw"})
			commitN(t, p, []string{uuidA + ":1", uuidA + ":2", "1"}, 1)
			r, err := binlog.NewReader(binlog.Config{Name: "my8", Flavor: binlog.FlavorMySQL, Capture: c.capture, Addr: p.Addr(), User: "tidemark", Password: "pw", ServerID: 9})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			snap, err := r.Capture(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if want := uuidA + ":1-2," + uuidB + ":1"; snap.Position.GTID != want {
				t.Fatalf("captured GTID %q, want %q", snap.Position.GTID, want)
			}
			if snap.Position.File != "binlog.000001" || snap.Position.Offset == 0 {
				t.Fatalf("captured %v", snap.Position)
			}
			var used bool
			for _, q := range p.Queries() {
				used = used || strings.EqualFold(q, c.statement)
			}
			if !used {
				t.Fatalf("%s not used; queries %q", c.statement, p.Queries())
			}
		})
	}
}

// TestMySQLXAEdges: an XA COMMIT whose XA PREPARE lies before the start
// position stops the stream (its rows cannot be read), and a prepared
// transaction larger than tidemark holds in memory stops it naming the XID;
// neither commits anything of it.
func TestMySQLXAEdges(t *testing.T) {
	t.Run("commit without its prepare", func(t *testing.T) {
		p := startPrimary(t, mysqlprimary.Config{ServerUUID: uuidA})
		if err := p.XAPrepare("1", "shop", "x1", []mysqlprimary.Row{ins(10, "xa")}, false); err != nil {
			t.Fatal(err)
		}
		commitN(t, p, []string{"2"}, 12)
		if err := p.XACommit("3", "shop", "x1"); err != nil {
			t.Fatal(err)
		}
		// A position whose set holds the XA PREPARE (e.g. captured by a
		// snapshot that could not see the prepared rows).
		changes, pos, err := stream(t, newTailer(t, p, nil), tidemark.Position{GTID: uuidA + ":1"}, 2)
		eqIDs(t, changes, 12)
		if len(pos) != 1 || err == nil || !strings.Contains(err.Error(), "XA COMMIT X'7831',X'',1: its XA PREPARE was not read") {
			t.Fatalf("positions %v, err %v", pos, err)
		}
	})
	t.Run("set not known yet", func(t *testing.T) {
		p := startPrimary(t, mysqlprimary.Config{ServerUUID: uuidA})
		commitN(t, p, []string{"1"}, 1)
		_, pos, err := stream(t, newTailer(t, p, nil), tidemark.Position{}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.XAPrepare("2", "shop", "x1", []mysqlprimary.Row{ins(10, "xa")}, false); err != nil {
			t.Fatal(err)
		}
		// A checkpoint without its GTID set: the set is unknown until
		// the next file, so the prepared transaction cannot be left out.
		_, _, err = stream(t, newTailer(t, p, nil), tidemark.Position{File: pos[0].File, Offset: pos[0].Offset}, 1)
		if err == nil || !strings.Contains(err.Error(), "GTID set of the position is not known yet") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("too large", func(t *testing.T) {
		p := startPrimary(t, mysqlprimary.Config{ServerUUID: uuidA})
		var rows []mysqlprimary.Row
		for i := int64(0); i < 200; i++ {
			rows = append(rows, ins(100+i, strings.Repeat("r", 100)))
		}
		if err := p.XAPrepare("1", "shop", "big", rows, false); err != nil {
			t.Fatal(err)
		}
		if err := p.XACommit("2", "shop", "big"); err != nil {
			t.Fatal(err)
		}
		// 64 × 200 bytes: less than the rows.
		changes, pos, err := stream(t, newTailer(t, p, func(c *binlog.Config) { c.MaxChunkBytes = 200 }), tidemark.Position{}, 1)
		if len(changes) != 0 || len(pos) != 0 || err == nil || !strings.Contains(err.Error(), "XA transaction X'626967',X'',1 holds more than 12800 bytes") {
			t.Fatalf("%d changes, positions %v, err %v", len(changes), pos, err)
		}
	})
}
