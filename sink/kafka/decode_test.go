package kafka

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"tidemark"
)

// TestFastDecodeMatchesJSON decodes envelopes with the fast decoder and
// with encoding/json: tidemark's own envelopes (every kind, every op, a
// key-only delete, text that needs escapes) take the fast path, and the
// two give the same change; envelopes in another layout (spaces, members
// in another order, an escaped key, a duplicate column) fall back and
// still decode the same; broken ones fail both ways.
func TestFastDecodeMatchesJSON(t *testing.T) {
	tbl, row, c, as := allKindsCodec(t)
	other := append([]any(nil), row...)
	other[5] = "tab\there, quote \" and backslash \\ and é"
	other[15] = "only\tescapes\\"
	commit := time.Date(2026, 11, 29, 10, 5, 0, 0, time.UTC)
	var own [][]byte
	for _, ch := range []tidemark.Change{
		{Op: tidemark.OpInsert, After: row},
		{Op: tidemark.OpUpdate, Before: row, After: other},
		{Op: tidemark.OpDelete, Before: other},
		{Op: tidemark.OpDelete, Before: keyOnly(tbl, row), KeyOnly: true},
		{Op: tidemark.OpRead, After: row},
	} {
		ch.Table, ch.Version, ch.CommitTime = tbl, tidemark.Version{Seq: 1 << 60, Index: 4}, commit
		v, err := c.appendEnvelope(nil, &ch, tidemark.Position{GTID: "0-1-2"}, commit)
		if err != nil {
			t.Fatal(err)
		}
		own = append(own, v)
	}
	for i, v := range own {
		if _, err := decodeChangeFast(v, as.table); err != nil {
			t.Errorf("envelope %d: the fast decoder did not read tidemark's own envelope: %v\n%s", i, err, v)
		}
	}
	// Text that needs escapes comes back as it was.
	if got, err := decodeChange(own[1], as.table); err != nil || got.After[5] != other[5] || got.After[15] != other[15] {
		t.Errorf("escaped text: %q, %q (%v), want %q, %q", got.After[5], got.After[15], err, other[5], other[15])
	}
	upd := string(own[1])
	relaid := []string{
		strings.ReplaceAll(strings.ReplaceAll(upd, `":`, `" : `), `,"`, ` , "`),
		`{"ts":"x","source":` + upd[strings.Index(upd, `{"name"`):strings.LastIndex(upd, `,"ts"`)] + `,` + upd[1:strings.Index(upd, `,"source"`)] + `}`,
		strings.Replace(upd, `"op"`, `"o\u0070"`, 1),
		strings.Replace(upd, `{"id":7,`, `{"id":7,"id":7,`, 1),
	}
	broken := []string{
		upd[:len(upd)-1],
		upd + "x",
		strings.Replace(upd, `"op":"u"`, `"op":"z"`, 1),
		strings.Replace(upd, `{"id":7,`, `{"idx":7,`, 1),
		strings.Replace(upd, `"seq":`, `"seq":-`, 1),
		strings.Replace(upd, `"table":"all kinds"`, `"table":"other"`, 1),
		strings.Replace(upd, `"commit_time":"2026-11-29T10:05:00.000000Z"`, `"commit_time":"2026-02-30T10:05:00.000000Z"`, 1),
	}
	for _, doc := range append(append(append([]string{}, func() []string {
		var out []string
		for _, v := range own {
			out = append(out, string(v))
		}
		return out
	}()...), relaid...), broken...) {
		fast, ferr := decodeChange([]byte(doc), as.table)
		slow, serr := decodeChangeJSON([]byte(doc), as.table)
		if (ferr == nil) != (serr == nil) || ferr != nil && ferr.Error() != serr.Error() {
			t.Errorf("errors differ: fast %v, json %v\n%s", ferr, serr, doc)
			continue
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Errorf("decoded differently:\nfast %+v\njson %+v\n%s", fast, slow, doc)
		}
	}
	for _, doc := range broken {
		if _, err := decodeChange([]byte(doc), as.table); err == nil {
			t.Errorf("broken envelope decoded:\n%s", doc)
		}
	}
	for _, doc := range relaid {
		if _, err := decodeChangeFast([]byte(doc), as.table); err != nil && !errors.Is(err, errNotFast) {
			t.Errorf("fast decoder: %v (want a result or errNotFast)\n%s", err, doc)
		}
	}
}

// allKindsCodec returns allKindsTable, its codec (source "src") and the
// schema an applier reads back from the codec's schema record.
func allKindsCodec(t *testing.T) (*tidemark.Table, []any, *codec, *announcedSchema) {
	t.Helper()
	tbl, row := allKindsTable()
	c, err := newCodec(tbl, "src", "topic", 1001)
	if err != nil {
		t.Fatal(err)
	}
	as, err := parseSchema(appendSchema(nil, c.sourceName, c.table, c.fingerprint, tidemark.Version{Seq: 7, Index: 1}, tidemark.Version{Seq: 5, Index: 2}))
	if err != nil {
		t.Fatal(err)
	}
	return tbl, row, c, as
}

// TestSchemaRecordJSONUnknown: a column the source could not tell from JSON
// (tidemark.Column.JSONUnknown) is announced with "json_unknown":true and
// read back so; other columns' records do not have the field (records as
// before), and json_unknown on a column that is not text is refused. The
// flag gets its own codec (its schema record), not its own fingerprint.
func TestSchemaRecordJSONUnknown(t *testing.T) {
	tbl := &tidemark.Table{ID: tidemark.TableID{Database: "db", Name: "t"}, Key: []int{0}, Columns: []tidemark.Column{
		{Name: "id", Kind: tidemark.KindInt, Bits: 64},
		{Name: "j", Kind: tidemark.KindText, Nullable: true, JSONUnknown: true},
		{Name: "s", Kind: tidemark.KindText, Nullable: true},
	}}
	rec := appendSchema(nil, "src", tbl, []byte("0123456789abcdef"), tidemark.Version{Seq: 1}, tidemark.Version{})
	if n := strings.Count(string(rec), `"json_unknown"`); n != 1 || !strings.Contains(string(rec), `"name":"j","kind":"text","bits":0,"precision":0,"scale":0,"nullable":true,"json_unknown":true`) {
		t.Fatalf("schema record %s: want json_unknown on j only", rec)
	}
	as, err := parseSchema(rec)
	if err != nil {
		t.Fatal(err)
	}
	if !as.table.Columns[1].JSONUnknown || as.table.Columns[2].JSONUnknown || as.table.Fingerprint() != tbl.Fingerprint() {
		t.Errorf("read back %+v", as.table.Columns)
	}
	plain := *tbl
	plain.Columns = slices.Clone(tbl.Columns)
	plain.Columns[1].JSONUnknown = false
	if plain.Fingerprint() != tbl.Fingerprint() || jsonUnknownOf(&plain) == jsonUnknownOf(tbl) {
		t.Errorf("fingerprint or codec key: the flag must change the codec, not the fingerprint")
	}
	bad := strings.Replace(string(appendSchema(nil, "src", tbl, []byte("0123456789abcdef"), tidemark.Version{Seq: 1}, tidemark.Version{})), `"kind":"text","bits":0,"precision":0,"scale":0,"nullable":true,"json_unknown"`, `"kind":"json","bits":0,"precision":0,"scale":0,"nullable":true,"json_unknown"`, 1)
	if _, err := parseSchema([]byte(bad)); err == nil || !strings.Contains(err.Error(), "json_unknown") {
		t.Errorf("json_unknown on a json column: %v, want refused", err)
	}
}
