package mysqlprimary

import (
	"strings"
	"testing"

	vtmysql "vitess.io/vitess/go/mysql"
	vtbinlog "vitess.io/vitess/go/mysql/binlog"
)

// TestJSONEncodingDecodesWithVitess checks the binary JSON encoder against
// an independent decoder (vitess's), value by value.
func TestJSONEncodingDecodesWithVitess(t *testing.T) {
	deep := any("leaf")
	for i := 0; i < 40; i++ {
		deep = JSONObject{{Key: "k", Value: []any{deep}}}
	}
	for _, c := range []struct {
		name string
		v    any
		want string
	}{
		{"null", nil, `null`},
		{"literals", []any{true, false, nil}, `[true, false, null]`},
		{"ints", []any{0, -32768, 32767, 65535, -2147483648, int64(-9223372036854775808), uint64(18446744073709551615)}, `[0, -32768, 32767, 65535, -2147483648, -9223372036854775808, 18446744073709551615]`},
		{"double", []any{1.5, 0.1}, `[1.5, 0.1]`},
		{"decimal", []any{JSONDecimal{Digits: "-12345678901234567890.123456789", Precision: 30, Scale: 9}, JSONDecimal{Digits: "12.50", Precision: 10, Scale: 2}}, `[-12345678901234567890.123456789, 12.50]`},
		{"datetime", JSONTemporal{Type: TypeDateTime, Year: 2026, Month: 12, Day: 1, Hour: 10, Minute: 39, Second: 4, Us: 120000}, `"2026-12-01 10:39:04.120000"`},
		{"date", JSONTemporal{Type: TypeDate, Year: 1969, Month: 7, Day: 20}, `"1969-07-20"`},
		{"time", JSONTemporal{Type: TypeTime, Hour: 23, Minute: 59, Second: 58, Us: 1}, `"23:59:58.000001"`},
		{"object order", JSONObject{{Key: "bb", Value: 1}, {Key: "a", Value: "x"}, {Key: "ab", Value: 2}}, `{"a": "x", "ab": 2, "bb": 1}`},
		{"large", []any{strings.Repeat("x", 70000), 1}, `["` + strings.Repeat("x", 70000) + `", 1]`},
		{"deep", deep, strings.Repeat(`{"k": [`, 40) + `"leaf"` + strings.Repeat(`]}`, 40)},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := EncodeJSON(c.v)
			if err != nil {
				t.Fatal(err)
			}
			v, err := vtbinlog.ParseBinaryJSON(b)
			if err != nil {
				t.Fatalf("vitess cannot decode the encoding: %v", err)
			}
			if got := string(v.MarshalTo(nil)); got != c.want {
				t.Fatalf("vitess decodes %.200s, want %.200s", got, c.want)
			}
		})
	}
}

// TestEventsDecodeWithVitess checks the events the primary writes with
// vitess's own parser: GTID, table map (with FULL metadata), rows, XID,
// previous GTIDs and a compressed transaction payload.
func TestEventsDecodeWithVitess(t *testing.T) {
	p, err := Start(Config{Password: "x"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tbl := &Table{ID: 7, Schema: "s", Name: "t", Key: []int{0}, Columns: []Column{{Name: "id", Type: TypeLongLong}, {Name: "doc", Type: TypeJSON, Nullable: true}}}
	rows := []Row{{Op: Insert, Table: tbl, After: []any{int64(1), JSON{JSONObject{{Key: "a", Value: 1}}}}}}
	if err := p.Commit(Txn{GTID: "1", DB: "s", Rows: rows}); err != nil {
		t.Fatal(err)
	}
	if err := p.CommitCompressed(Txn{GTID: "2", DB: "s", Rows: rows}); err != nil {
		t.Fatal(err)
	}
	f := p.files[0]
	var fmtd vtmysql.BinlogFormat
	var kinds []string
	for _, e := range f.events {
		ev := vtmysql.NewMysql56BinlogEvent(e.raw)
		if !ev.IsValid() {
			t.Fatalf("invalid event at %d", e.pos)
		}
		if ev.IsFormatDescription() {
			if fmtd, err = ev.Format(); err != nil {
				t.Fatal(err)
			}
			kinds = append(kinds, "FDE")
			continue
		}
		ev, _, err = ev.StripChecksum(fmtd)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case ev.IsPreviousGTIDs():
			if _, err := ev.PreviousGTIDs(fmtd); err != nil {
				t.Fatal(err)
			}
			kinds = append(kinds, "PREV")
		case ev.IsGTID():
			g, _, _, _, err := ev.GTID(fmtd)
			if err != nil {
				t.Fatal(err)
			}
			kinds = append(kinds, "GTID "+g.String())
		case ev.IsQuery():
			q, err := ev.Query(fmtd)
			if err != nil {
				t.Fatal(err)
			}
			kinds = append(kinds, q.SQL)
		case ev.IsTableMap():
			tm, err := ev.TableMap(fmtd)
			if err != nil {
				t.Fatal(err)
			}
			kinds = append(kinds, "MAP "+tm.Database+"."+tm.Name)
		case ev.IsWriteRows():
			kinds = append(kinds, "WRITE")
		case ev.IsXID():
			kinds = append(kinds, "XID")
		case ev.IsTransactionPayload():
			tp, err := ev.TransactionPayload(fmtd)
			if err != nil {
				t.Fatalf("vitess cannot decode the payload: %v", err)
			}
			n := 0
			for {
				inner, err := tp.GetNextEvent()
				if err != nil || inner == nil {
					break
				}
				n++
			}
			tp.Close()
			kinds = append(kinds, "PAYLOAD "+string(rune('0'+n)))
		default:
			kinds = append(kinds, "?")
		}
	}
	want := "FDE|PREV|GTID " + "3e11fa47-71ca-11e1-9e33-c80aa9429562:1|BEGIN|MAP s.t|WRITE|XID|GTID 3e11fa47-71ca-11e1-9e33-c80aa9429562:2|PAYLOAD 4"
	if got := strings.Join(kinds, "|"); got != want {
		t.Fatalf("vitess reads\n%s\nwant\n%s", got, want)
	}
}
