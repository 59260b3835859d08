package kafka

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"tidemark"
)

func TestAppendValue(t *testing.T) {
	ist := time.FixedZone("IST", 5*3600+1800)
	tests := []struct {
		name string
		kind tidemark.Kind
		v    any
		want string
	}{
		{"null", tidemark.KindInt, nil, `null`},
		{"int", tidemark.KindInt, int64(-42), `-42`},
		{"int min", tidemark.KindInt, int64(math.MinInt64), `-9223372036854775808`},
		{"year", tidemark.KindYear, int64(2026), `2026`},
		{"uint above 2^53 keeps every digit", tidemark.KindUint, uint64(math.MaxUint64), `18446744073709551615`},
		{"bit", tidemark.KindBit, uint64(5), `5`},
		{"decimal", tidemark.KindDecimal, tidemark.Decimal("-12.340"), `"-12.340"`},
		{"decimal big", tidemark.KindDecimal, tidemark.Decimal("12345678901234567890123456789.000000001"), `"12345678901234567890123456789.000000001"`},
		{"float", tidemark.KindFloat, float32(0.1), `0.1`},
		{"float tiny", tidemark.KindFloat, float32(1e-7), `1e-7`},
		{"double", tidemark.KindDouble, 1.0 / 3, `0.3333333333333333`},
		{"double big", tidemark.KindDouble, 1e21, `1e+21`},
		{"double zero", tidemark.KindDouble, 0.0, `0`},
		{"text escapes", tidemark.KindText, "a\"b\\c\n\t\x01é☃", `"a\"b\\c\n\t\u0001é☃"`},
		{"enum", tidemark.KindEnum, "small", `"small"`},
		{"set", tidemark.KindSet, "a,b", `"a,b"`},
		{"bytes", tidemark.KindBytes, []byte{0, 1, 2, 0xff}, `"AAEC/w=="`},
		{"bytes empty", tidemark.KindBytes, []byte{}, `""`},
		{"date", tidemark.KindDate, time.Date(1969, 7, 20, 0, 0, 0, 0, time.UTC), `"1969-07-20"`},
		{"time", tidemark.KindTime, 838*time.Hour + 59*time.Minute + 59*time.Second, `"838:59:59.000000"`},
		{"time negative fraction", tidemark.KindTime, -(time.Hour + 2*time.Minute + 3*time.Second + 4500*time.Microsecond), `"-01:02:03.004500"`},
		{"time zero", tidemark.KindTime, time.Duration(0), `"00:00:00.000000"`},
		{"datetime in UTC", tidemark.KindDateTime, time.Date(2026, 1, 2, 3, 4, 5, 6789, time.UTC), `"2026-01-02T03:04:05.000006Z"`},
		{"timestamp converted to UTC", tidemark.KindTimestamp, time.Date(2026, 1, 2, 9, 0, 0, 0, ist), `"2026-01-02T03:30:00.000000Z"`},
		{"json object", tidemark.KindJSON, tidemark.JSON(`{"a": [1, 2.5, null]}`), `{"a": [1, 2.5, null]}`},
		{"json scalar", tidemark.KindJSON, tidemark.JSON(`true`), `true`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, detail := appendValue(nil, tt.kind, tt.v)
			if detail != "" {
				t.Fatalf("appendValue: %s", detail)
			}
			if string(got) != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
			if !json.Valid(got) {
				t.Errorf("%s is not valid JSON", got)
			}
		})
	}
}

func TestAppendValueRejects(t *testing.T) {
	tests := []struct {
		name string
		kind tidemark.Kind
		v    any
		want string
	}{
		{"int as string", tidemark.KindInt, "1", "want int64, got string"},
		{"uint as int", tidemark.KindUint, int64(1), "want uint64, got int64"},
		{"NaN", tidemark.KindDouble, math.NaN(), "not a finite number"},
		{"Inf", tidemark.KindFloat, float32(math.Inf(1)), "not a finite number"},
		{"datetime as string", tidemark.KindDateTime, "2026-01-01 00:00:00", "want time.Time, got string"},
		{"invalid json", tidemark.KindJSON, tidemark.JSON(`{"a":`), "not a valid JSON document"},
		// Review finding 7: replaced by U+FFFD before, i.e. other text
		// than the source holds.
		{"text invalid utf8", tidemark.KindText, "a\xffb", "not valid UTF-8"},
		{"enum invalid utf8", tidemark.KindEnum, "K\xf6ln", "not valid UTF-8"},
		{"unknown kind", tidemark.Kind(99), int64(1), "unknown kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, detail := appendValue(nil, tt.kind, tt.v)
			if !strings.Contains(detail, tt.want) {
				t.Errorf("detail %q, want it to contain %q", detail, tt.want)
			}
		})
	}
}

func TestEncodeValueErrorNamesColumn(t *testing.T) {
	tbl := ordersTable("shop")
	c, err := newCodec(tbl, "src", "topic", 0)
	if err != nil {
		t.Fatal(err)
	}
	ch := &tidemark.Change{Op: tidemark.OpInsert, Table: tbl, After: []any{int64(1), "t", "secret-not-a-decimal-type", nil, time.Now()}}
	ch.After[2] = 12.5 // a float64 where a Decimal belongs
	_, err = c.appendEnvelope(nil, ch, tidemark.Position{}, time.Now())
	var ve *tidemark.ValueError
	if !errors.As(err, &ve) || ve.Column != "amount" || ve.Table != tbl.ID {
		t.Fatalf("err = %v, want a ValueError for shop.orders.amount", err)
	}
	if strings.Contains(err.Error(), "12.5") {
		t.Errorf("error %q holds the value", err)
	}
}

// allKindsTable has one column of every kind.
func allKindsTable() (*tidemark.Table, []any) {
	t := &tidemark.Table{ID: tidemark.TableID{Database: "db", Name: "all kinds"}, Key: []int{0, 13}}
	row := []any{}
	add := func(name string, k tidemark.Kind, v any) {
		t.Columns = append(t.Columns, tidemark.Column{Name: name, Kind: k, Nullable: true})
		row = append(row, v)
	}
	add("id", tidemark.KindInt, int64(7))
	add("u", tidemark.KindUint, uint64(1<<63))
	add("dec", tidemark.KindDecimal, tidemark.Decimal("-0.50"))
	add("f", tidemark.KindFloat, float32(2.5))
	add("d", tidemark.KindDouble, 6.02214076e23)
	add("s", tidemark.KindText, "naïve \"quoted\"")
	add("b", tidemark.KindBytes, []byte("\x00\x01binary"))
	add("bit", tidemark.KindBit, uint64(0b1011))
	add("y", tidemark.KindYear, int64(1999))
	add("date", tidemark.KindDate, time.Date(2026, 2, 28, 0, 0, 0, 0, time.UTC))
	add("time", tidemark.KindTime, -(25*time.Hour + time.Microsecond))
	add("dt", tidemark.KindDateTime, time.Date(2026, 3, 29, 1, 30, 0, 123456789, time.UTC))
	add("ts", tidemark.KindTimestamp, time.Unix(1700000000, 1000).UTC())
	add("j", tidemark.KindJSON, tidemark.JSON(`{"nested":{"k":[true,false]}}`))
	add("e", tidemark.KindEnum, "medium")
	add("set", tidemark.KindSet, "x,y")
	add("nothing", tidemark.KindText, nil)
	return t, row
}

// schema compiles docs/kafka-envelope.schema.json, and the definition at
// ref inside it.
func schema(t *testing.T, ref string) *jsonschema.Schema {
	t.Helper()
	f, err := os.Open("../../docs/kafka-envelope.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		t.Fatalf("parse schema: %v", err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("envelope.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("envelope.schema.json" + ref)
	if err != nil {
		t.Fatalf("compile schema %s: %v", ref, err)
	}
	return sch
}

func validate(t *testing.T, sch *jsonschema.Schema, doc []byte) error {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(string(doc)))
	if err != nil {
		t.Fatalf("parse %s: %v", doc, err)
	}
	return sch.Validate(v)
}

func TestEnvelopeValidatesAgainstSchema(t *testing.T) {
	envSchema := schema(t, "")
	keySchema := schema(t, "#/$defs/key")
	tbl, row := allKindsTable()
	c, err := newCodec(tbl, "src", "topic", 1001)
	if err != nil {
		t.Fatal(err)
	}
	row2 := append([]any(nil), row...)
	row2[5] = "changed"
	commit := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		ch   tidemark.Change
		pos  tidemark.Position
	}{
		{"insert with gtid", tidemark.Change{Op: tidemark.OpInsert, After: row}, tidemark.Position{GTID: "0-1001-42"}},
		{"update with file/pos", tidemark.Change{Op: tidemark.OpUpdate, Before: row, After: row2}, tidemark.Position{File: "bin.000003", Offset: 1234}},
		{"delete, split transaction", tidemark.Change{Op: tidemark.OpDelete, Before: row2}, tidemark.Position{}},
		{"snapshot read", tidemark.Change{Op: tidemark.OpRead, After: row}, tidemark.Position{GTID: "0-1001-42"}},
		{"key-only delete", tidemark.Change{Op: tidemark.OpDelete, Before: keyOnly(tbl, row), KeyOnly: true}, tidemark.Position{GTID: "0-1001-42"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ch := tt.ch
			ch.Table, ch.Version, ch.CommitTime = tbl, tidemark.Version{Seq: 42, Index: 3}, commit
			val, err := c.appendEnvelope(nil, &ch, tt.pos, commit.Add(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if err := validate(t, envSchema, val); err != nil {
				t.Fatalf("envelope does not validate: %v\n%s", err, val)
			}
			key, err := c.appendKey(nil, ch.Row())
			if err != nil {
				t.Fatal(err)
			}
			if err := validate(t, keySchema, key); err != nil {
				t.Fatalf("key does not validate: %v\n%s", err, key)
			}
			if want := `{"id":7,"j":{"nested":{"k":[true,false]}}}`; string(key) != want {
				t.Errorf("key = %s, want %s", key, want)
			}
		})
	}
	// The schema is not vacuous: broken envelopes fail it.
	bad := []string{
		`{"op":"c","before":null,"after":{"a":1},"key_only":true,"source":{"name":"s","server_id":null,"database":"d","table":"t","commit_time":null,"seq":1,"index":1,"gtid":null,"file":null,"pos":null},"ts":"2026-01-01T00:00:00.000000Z"}`,
		`{"op":"d","before":{"a":1},"after":null,"key_only":false,"source":{"name":"s","server_id":null,"database":"d","table":"t","commit_time":null,"seq":1,"index":1,"gtid":null,"file":null,"pos":null},"ts":"2026-01-01T00:00:00.000000Z"}`,
		`{}`,
		`{"op":"x","before":null,"after":{},"source":{},"ts":"2026-01-01T00:00:00.000000Z"}`,
		`{"op":"d","before":null,"after":{"a":1},"source":{"name":"s","server_id":null,"database":"d","table":"t","commit_time":null,"seq":1,"index":1,"gtid":null,"file":null,"pos":null},"ts":"2026-01-01T00:00:00.000000Z"}`,
		`{"op":"c","before":null,"after":{"a":1},"source":{"name":"s","server_id":null,"database":"d","table":"t","commit_time":null,"seq":1,"index":1,"gtid":null,"file":null,"pos":null},"ts":"2026-01-01T00:00:00Z"}`,
	}
	for _, doc := range bad {
		if err := validate(t, envSchema, []byte(doc)); err == nil {
			t.Errorf("schema accepts %s", doc)
		}
	}
}

func TestValueFormatsMatchSchemaDefs(t *testing.T) {
	tests := []struct {
		def  string
		kind tidemark.Kind
		vals []any
	}{
		{"decimal", tidemark.KindDecimal, []any{tidemark.Decimal("0"), tidemark.Decimal("-12.340")}},
		{"bytes", tidemark.KindBytes, []any{[]byte{}, []byte{1}, []byte{1, 2}, []byte{1, 2, 3}}},
		{"date", tidemark.KindDate, []any{time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)}},
		{"time", tidemark.KindTime, []any{-838 * time.Hour, time.Duration(0), 5 * time.Microsecond}},
		{"timestamp", tidemark.KindDateTime, []any{time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2038, 1, 19, 3, 14, 7, 999999999, time.UTC)}},
	}
	for _, tt := range tests {
		t.Run(tt.def, func(t *testing.T) {
			sch := schema(t, "#/$defs/"+tt.def)
			for _, v := range tt.vals {
				got, detail := appendValue(nil, tt.kind, v)
				if detail != "" {
					t.Fatal(detail)
				}
				if err := validate(t, sch, got); err != nil {
					t.Errorf("%s does not match $defs/%s: %v", got, tt.def, err)
				}
			}
		})
	}
}

func TestEnvelopeFieldOrderIsStable(t *testing.T) {
	tbl := ordersTable("shop")
	c, err := newCodec(tbl, "src", "topic", 0)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	ch := &tidemark.Change{Op: tidemark.OpInsert, Table: tbl, Version: tidemark.Version{Seq: 9, Index: 1}, CommitTime: at,
		After: []any{int64(1), "acme", tidemark.Decimal("9.99"), nil, at}}
	got, err := c.appendEnvelope(nil, ch, tidemark.Position{GTID: "0-1-9"}, at)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"op":"c","before":null,"after":{"id":1,"tenant":"acme","amount":"9.99","note":null,"updated_at":"2026-11-29T10:00:00.000000Z"},` +
		`"source":{"name":"src","server_id":null,"database":"shop","table":"orders","commit_time":"2026-11-29T10:00:00.000000Z","seq":9,"index":1,"gtid":"0-1-9","file":null,"pos":null},` +
		`"ts":"2026-11-29T10:00:00.000000Z"}`
	if string(got) != want {
		t.Errorf("envelope:\n got %s\nwant %s", got, want)
	}
	key, _ := c.appendKey(nil, ch.After)
	if string(key) != `{"tenant":"acme","id":1}` {
		t.Errorf("key = %s: want the key columns in key order", key)
	}
}

// keyOnly returns row with every column but the key NULL (a key-diff
// delete's before image).
func keyOnly(t *tidemark.Table, row []any) []any {
	out := make([]any, len(row))
	for _, k := range t.Key {
		out[k] = row[k]
	}
	return out
}

// TestKeyOnlyDelete: a delete found by the key diff (its before image holds
// the key alone) says so in the envelope ("key_only":true) and decodes
// back as a key-only delete; a delete with the full image has no such
// field.
func TestKeyOnlyDelete(t *testing.T) {
	tbl, row, c, as := allKindsCodec(t)
	for _, keyOnlyDelete := range []bool{true, false} {
		ch := tidemark.Change{Op: tidemark.OpDelete, Table: tbl, Before: row, KeyOnly: keyOnlyDelete, Version: tidemark.Version{Seq: 9}}
		if keyOnlyDelete {
			ch.Before = keyOnly(tbl, row)
		}
		val, err := c.appendEnvelope(nil, &ch, tidemark.Position{}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(val), `"after":null,"key_only":true,"source":`); got != keyOnlyDelete {
			t.Errorf("key-only %v: envelope %s", keyOnlyDelete, val)
		}
		back, err := decodeChange(val, as.table)
		if err != nil {
			t.Fatal(err)
		}
		if back.KeyOnly != keyOnlyDelete {
			t.Errorf("key-only %v: decoded KeyOnly %v", keyOnlyDelete, back.KeyOnly)
		}
	}
}

// TestAppendTimestampMatchesFormat compares the hand-written timestamp
// encoding with time.AppendFormat over the years DATETIME and TIMESTAMP
// can hold, zones other than UTC, and the years outside 0–9999 that it
// leaves to AppendFormat.
func TestAppendTimestampMatchesFormat(t *testing.T) {
	ist := time.FixedZone("IST", 5*3600+1800)
	times := []time.Time{
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1, 2, 3, 4, 5, 6, 7000, time.UTC),
		time.Date(1969, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 11, 29, 10, 0, 0, 123456789, ist),
		time.Date(2038, 1, 19, 3, 14, 7, 999999000, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 0, time.FixedZone("W", -3600)), // year 10000 in UTC
		time.Date(-1, 6, 1, 12, 0, 0, 0, time.UTC),
	}
	for i := 0; i < 2000; i++ {
		times = append(times, time.Unix(int64(i)*15_485_863_123-300_000_000_000, int64(i)*7_919_003%1_000_000_000).In(ist))
	}
	for _, tm := range times {
		want := `"` + tm.UTC().Format("2006-01-02T15:04:05.000000Z") + `"`
		if got := string(appendTimestamp([]byte("x"), tm)); got != "x"+want {
			t.Fatalf("appendTimestamp(%v) = %s, want x%s", tm, got, want)
		}
	}
}
