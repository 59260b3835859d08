package postgres

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/big"
	"testing"
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
