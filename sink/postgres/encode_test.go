package postgres

import (
	"bytes"
	"encoding/binary"
	"io"
	"math"
	"math/big"
	"testing"
	"testing/iotest"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"tidemark"
)

// TestBinaryMatchesPgx: for every kind, the sink's own binary encoding of a
// value is what pgx encodes for the converted value (numerics: the same
// number), and a value convertValue rejects is rejected with the same
// message.
func TestBinaryMatchesPgx(t *testing.T) {
	m := pgtype.NewMap()
	ist := time.FixedZone("IST", 19800)
	cases := []struct {
		col    tidemark.Column
		oid    uint32
		values []any
	}{
		{tidemark.Column{Kind: tidemark.KindInt, Bits: 8}, pgtype.Int2OID, []any{int64(-128), int64(0), int64(127), int64(40000)}},
		{tidemark.Column{Kind: tidemark.KindInt, Bits: 24}, pgtype.Int4OID, []any{int64(-8388608), int64(1), int64(math.MaxInt32 + 1)}},
		{tidemark.Column{Kind: tidemark.KindInt, Bits: 64}, pgtype.Int8OID, []any{int64(math.MinInt64), int64(math.MaxInt64), "1"}},
		{tidemark.Column{Kind: tidemark.KindUint, Bits: 8}, pgtype.Int2OID, []any{uint64(255), uint64(40000)}},
		{tidemark.Column{Kind: tidemark.KindUint, Bits: 24}, pgtype.Int4OID, []any{uint64(16777215)}},
		{tidemark.Column{Kind: tidemark.KindUint, Bits: 32}, pgtype.Int8OID, []any{uint64(math.MaxUint32)}},
		{tidemark.Column{Kind: tidemark.KindUint, Bits: 64}, pgtype.NumericOID, []any{uint64(0), uint64(math.MaxUint64), int64(1)}},
		{tidemark.Column{Kind: tidemark.KindDecimal, Precision: 30, Scale: 10}, pgtype.NumericOID, []any{tidemark.Decimal("-12345678901234567890.0123456789"), tidemark.Decimal("0.0000000000"), tidemark.Decimal("1e5"), 1.5}},
		{tidemark.Column{Kind: tidemark.KindFloat}, pgtype.Float4OID, []any{float32(3.1415927), float32(math.Inf(-1)), 1.5}},
		{tidemark.Column{Kind: tidemark.KindDouble}, pgtype.Float8OID, []any{0.1, math.MaxFloat64, math.NaN()}},
		{tidemark.Column{Kind: tidemark.KindText}, pgtype.TextOID, []any{"", "héllo 🐳", "a\x00b", "\xff", []byte("x")}},
		{tidemark.Column{Kind: tidemark.KindBytes}, pgtype.ByteaOID, []any{[]byte{}, []byte{0, 0xff, 0x10}, "x"}},
		{tidemark.Column{Kind: tidemark.KindBit, Bits: 10}, pgtype.BitOID, []any{uint64(0x2AA), uint64(1), uint64(1 << 10)}},
		{tidemark.Column{Kind: tidemark.KindBit}, pgtype.VarbitOID, []any{uint64(math.MaxUint64)}},
		{tidemark.Column{Kind: tidemark.KindYear}, pgtype.Int2OID, []any{int64(2026), int64(0), int64(-1)}},
		{tidemark.Column{Kind: tidemark.KindDate}, pgtype.DateOID, []any{time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC), time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 10, 5, 0, 0, 0, time.UTC)}},
		{tidemark.Column{Kind: tidemark.KindTime}, pgtype.IntervalOID, []any{-838*time.Hour - 59*time.Minute - 59*time.Second, 1500 * time.Microsecond, time.Nanosecond}},
		{tidemark.Column{Kind: tidemark.KindDateTime}, pgtype.TimestamptzOID, []any{time.Date(2026, 3, 10, 23, 58, 0, 123456000, ist), time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC), time.Date(2026, 1, 1, 0, 0, 0, 1, time.UTC)}},
		{tidemark.Column{Kind: tidemark.KindTimestamp}, pgtype.TimestamptzOID, []any{time.Date(1970, 1, 1, 0, 0, 1, 0, time.UTC), "2024-01-01"}},
		{tidemark.Column{Kind: tidemark.KindJSON}, pgtype.JSONBOID, []any{tidemark.JSON(`{"a": [1, 2.50, {"b": null}]}`), tidemark.JSON("{"), `{}`}},
	}
	for _, tc := range cases {
		col := tc.col
		col.Name = "c"
		for _, v := range tc.values {
			got, detail := appendValue(nil, &col, v)
			conv, want := convertValue(&col, v)
			if detail != want {
				t.Errorf("%s %v: sink says %q, convertValue %q", col.Kind, v, detail, want)
				continue
			}
			if detail != "" {
				if len(got) != 0 {
					t.Errorf("%s %v: rejected but wrote % x", col.Kind, v, got)
				}
				continue
			}
			if n := int(binary.BigEndian.Uint32(got)); n != len(got)-4 {
				t.Errorf("%s %v: length prefix %d for %d bytes", col.Kind, v, n, len(got)-4)
				continue
			}
			body := got[4:]
			ref, err := m.Encode(tc.oid, pgtype.BinaryFormatCode, conv, nil)
			if err != nil {
				t.Fatalf("%s %v: pgx: %v", col.Kind, v, err)
			}
			if tc.oid == pgtype.NumericOID {
				var a, b pgtype.Numeric
				if err := m.Scan(tc.oid, pgtype.BinaryFormatCode, body, &a); err != nil {
					t.Fatalf("%s %v: decode % x: %v", col.Kind, v, body, err)
				}
				if err := m.Scan(tc.oid, pgtype.BinaryFormatCode, ref, &b); err != nil {
					t.Fatal(err)
				}
				// The same number and the same display scale.
				if numRat(a).Cmp(numRat(b)) != 0 || !bytes.Equal(body[6:8], ref[6:8]) {
					t.Errorf("%s %v: sink % x, pgx % x", col.Kind, v, body, ref)
				}
				continue
			}
			if !bytes.Equal(body, ref) {
				t.Errorf("%s %v: sink % x, pgx % x", col.Kind, v, body, ref)
			}
		}
	}
	if got, _ := appendValue(nil, &tidemark.Column{Kind: tidemark.KindInt, Bits: 64}, nil); !bytes.Equal(got, []byte{0xff, 0xff, 0xff, 0xff}) {
		t.Errorf("NULL = % x", got)
	}
}

// numRat is the exact value of a numeric.
func numRat(n pgtype.Numeric) *big.Rat {
	r := new(big.Rat).SetInt(n.Int)
	p := new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(abs(n.Exp))), nil))
	if n.Exp < 0 {
		return r.Quo(r, p)
	}
	return r.Mul(r, p)
}

func TestJSONHasNUL(t *testing.T) {
	for in, want := range map[string]bool{
		`{"k": "fine"}`:         false,
		`{"k": "a\u0000b"}`:     true,
		`["\u0000"]`:            true,
		`["\\u0000"]`:           false, // an escaped backslash, then text
		`["\\\u0000"]`:          true,
		`{"\u0000k": 1}`:        true,
		`["\u00001"]`:           true,
		`["\u0001", "\n\\"]`:    false,
		`"\\"`:                  false,
		`{"a":"\"\u0000"}`:      true,
		`{"a":"\\\\u0000"}`:     false,
		`[1, 2, "x\\", "\\\\"]`: false,
	} {
		if got := jsonHasNUL(in); got != want {
			t.Errorf("jsonHasNUL(%s) = %v, want %v", in, got, want)
		}
	}
}

// TestCopyStreams: the streams pgconn reads are, byte for byte, the binary
// COPY format of the group's rows (header; per row its field count, the op
// for the staging table, its encoded span, the direct path's suffix;
// trailer), whatever sizes the reads ask for; an empty group is a header
// and a trailer.
func TestCopyStreams(t *testing.T) {
	var r copyRows
	ops := []string{"i", "u", "d"}
	for i, v := range []string{"alpha", "", "a longer value of the third row"} {
		start := len(r.buf)
		r.buf = appendText(r.buf, v)
		r.buf = binary.BigEndian.AppendUint32(r.buf, uint32(i))
		r.rows = append(r.rows, copyRow{op: ops[i], start: start, end: len(r.buf)})
	}
	loaded := time.Date(2026, 12, 4, 21, 0, 0, 123456000, time.UTC)
	stage := func(r *copyRows, fields int) []byte {
		out := append([]byte(nil), copyHeader...)
		for _, row := range r.rows {
			out = binary.BigEndian.AppendUint16(out, uint16(fields))
			out = appendText(out, row.op)
			out = append(out, r.buf[row.start:row.end]...)
		}
		return append(out, copyTrailer...)
	}
	direct := func(r *copyRows, fields int, soft bool) []byte {
		out := append([]byte(nil), copyHeader...)
		for _, row := range r.rows {
			out = binary.BigEndian.AppendUint16(out, uint16(fields))
			out = append(out, r.buf[row.start:row.end]...)
			out = appendTimestamptz(out, loaded)
			if soft {
				out = append(out, 0, 0, 0, 1, 0)
				out = append(out, 0xff, 0xff, 0xff, 0xff)
			}
		}
		return append(out, copyTrailer...)
	}
	for _, g := range []struct {
		name string
		rows *copyRows
	}{{"three rows", &r}, {"no rows", &copyRows{}}} {
		cases := []struct {
			name string
			s    func() io.Reader
			want []byte
		}{
			{"staged", func() io.Reader { return g.rows.stageStream(2) }, stage(g.rows, 6)},
			{"direct", func() io.Reader { return g.rows.directStream(2, loaded, false) }, direct(g.rows, 6, false)},
			{"direct soft", func() io.Reader { return g.rows.directStream(2, loaded, true) }, direct(g.rows, 8, true)},
		}
		for _, c := range cases {
			if err := iotest.TestReader(c.s(), c.want); err != nil {
				t.Errorf("%s, %s: %v", g.name, c.name, err)
			}
			for _, size := range []int{1, 3, 7, 64 << 10} {
				got, err := io.ReadAll(io.LimitReader(readSized{c.s(), size}, 1<<20))
				if err != nil || !bytes.Equal(got, c.want) {
					t.Errorf("%s, %s, reads of %d bytes: got %x (%v), want %x", g.name, c.name, size, got, err, c.want)
				}
			}
		}
	}
}

// readSized reads at most size bytes per Read.
type readSized struct {
	r    io.Reader
	size int
}

func (s readSized) Read(p []byte) (int, error) { return s.r.Read(p[:min(len(p), s.size)]) }
