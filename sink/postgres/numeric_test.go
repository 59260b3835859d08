package postgres

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
)

// TestNumericBinaryMatchesPgx: the fast binary numeric of a decimal text
// decodes (with pgx's own decoder) to the same value and scale as pgx's
// encoding of the same decimal through big.Int.
func TestNumericBinaryMatchesPgx(t *testing.T) {
	m := pgtype.NewMap()
	cases := []string{"0", "0.00", "-0.00", "1", "-1", "12.5", "1234", "12345", "0.0001", "0.00010", "-99999999.9999",
		"10000", "100000000", "0.1", "123456789012345678901234567890.0123456789", "+7", "000123.4500", ".5", "5."}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 2000; i++ {
		var b strings.Builder
		if r.IntN(2) == 0 {
			b.WriteByte('-')
		}
		for j := r.IntN(20); j >= 0; j-- {
			b.WriteByte(byte('0' + r.IntN(10)))
		}
		if r.IntN(3) > 0 {
			b.WriteByte('.')
			for j := r.IntN(15); j >= 0; j-- {
				b.WriteByte(byte('0' + r.IntN(10)))
			}
		}
		cases = append(cases, b.String())
	}
	for _, s := range cases {
		fast, err := appendNumericBinary(nil, s)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		want, detail := parseDecimal(s)
		if detail != "" {
			t.Fatalf("%q: %s", s, detail)
		}
		slow, err := m.Encode(pgtype.NumericOID, pgtype.BinaryFormatCode, want, nil)
		if err != nil {
			t.Fatal(err)
		}
		var a, b pgtype.Numeric
		if err := m.Scan(pgtype.NumericOID, pgtype.BinaryFormatCode, fast, &a); err != nil {
			t.Fatalf("%q: decode fast encoding % x: %v", s, fast, err)
		}
		if err := m.Scan(pgtype.NumericOID, pgtype.BinaryFormatCode, slow, &b); err != nil {
			t.Fatal(err)
		}
		if numRat(a).Cmp(numRat(b)) != 0 {
			t.Fatalf("%q: fast %s, pgx %s", s, numRat(a).FloatString(20), numRat(b).FloatString(20))
		}
		// The display scale is the text's number of fractional digits.
		_, frac, _ := strings.Cut(s, ".")
		if got := int(fast[6])<<8 | int(fast[7]); got != len(frac) {
			t.Fatalf("%q: dscale %d, want %d", s, got, len(frac))
		}
	}
	for _, bad := range []string{"", "-", "1.2.3", "1e5", "--1", "12a", "+-1"} {
		if _, err := appendNumericBinary(nil, bad); err == nil {
			t.Errorf("%q encoded", bad)
		}
	}
	if got := fmt.Sprint(validDecimal("1.5")); got != "" {
		t.Errorf("validDecimal(1.5) = %q", got)
	}
}

func abs(x int32) int32 {
	if x < 0 {
		return -x
	}
	return x
}
