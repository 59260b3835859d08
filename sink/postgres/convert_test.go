package postgres

import (
	"encoding/binary"
	"math"
	"math/big"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"tidemark"
)

// The pgx values of tidemark's values: the reference the sink's own binary
// COPY (encode.go) is held to (TestBinaryMatchesPgx) and the benchmark
// ceiling's input (BenchmarkCopyCeiling).

// convert turns a Change value of column c into what pgx encodes into the
// column's PostgreSQL type. The error is a *tidemark.ValueError; it never
// holds the value itself (columns may carry secrets).
func convert(id tidemark.TableID, c *tidemark.Column, v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	out, detail := convertValue(c, v)
	if detail != "" {
		return nil, &tidemark.ValueError{Table: id, Column: c.Name, Detail: detail}
	}
	return out, nil
}

// convertValue returns the value pgx would encode for v (the sink writes its
// own binary COPY, encode.go; this is the reference its tests compare with,
// and the benchmark ceiling's input), or why v cannot be stored — the
// checks are appendBody's.
func convertValue(c *tidemark.Column, v any) (any, string) {
	if _, detail := appendBody(nil, c, v); detail != "" {
		return nil, detail
	}
	switch c.Kind {
	case tidemark.KindInt, tidemark.KindYear:
		x := v.(int64)
		switch {
		case c.Kind == tidemark.KindYear || c.Bits == 8 || c.Bits == 16:
			return int16(x), ""
		case c.Bits == 24 || c.Bits == 32:
			return int32(x), ""
		}
		return x, ""
	case tidemark.KindUint:
		x := v.(uint64)
		switch c.Bits {
		case 8:
			return int16(x), ""
		case 16, 24:
			return int32(x), ""
		case 32:
			return int64(x), ""
		}
		return pgtype.Numeric{Int: new(big.Int).SetUint64(x), Valid: true}, ""
	case tidemark.KindDecimal:
		n, _ := parseDecimal(string(v.(tidemark.Decimal)))
		return n, ""
	case tidemark.KindBit:
		n := c.Bits
		if n == 0 {
			n = 64
		}
		var buf [8]byte
		binary.BigEndian.PutUint64(buf[:], v.(uint64)<<uint(64-n))
		return pgtype.Bits{Bytes: buf[:(n+7)/8], Len: int32(n), Valid: true}, ""
	case tidemark.KindDate:
		return pgtype.Date{Time: v.(time.Time).UTC(), Valid: true}, ""
	case tidemark.KindTime:
		return pgtype.Interval{Microseconds: int64(v.(time.Duration) / time.Microsecond), Valid: true}, ""
	case tidemark.KindDateTime, tidemark.KindTimestamp:
		return v.(time.Time).UTC(), ""
	case tidemark.KindJSON:
		// A plain string, which pgx writes as JSON text unchanged.
		return string(v.(tidemark.JSON)), ""
	}
	return v, "" // float32, float64, string, []byte
}

// parseDecimal parses the canonical decimal text [-+]digits[.digits] into an
// exact pgtype.Numeric.
func parseDecimal(s string) (pgtype.Numeric, string) {
	body := s
	neg := false
	if body != "" && (body[0] == '-' || body[0] == '+') {
		neg = body[0] == '-'
		body = body[1:]
	}
	intPart, frac, _ := strings.Cut(body, ".")
	if intPart == "" && frac == "" {
		return pgtype.Numeric{}, "decimal is empty or not a number"
	}
	digits := intPart + frac
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return pgtype.Numeric{}, "decimal is not in the form [-]digits[.digits]"
		}
	}
	if len(frac) > math.MaxInt16 {
		return pgtype.Numeric{}, "decimal has too many fractional digits"
	}
	n, ok := new(big.Int).SetString(digits, 10)
	if !ok {
		return pgtype.Numeric{}, "decimal is not a number"
	}
	if neg {
		n.Neg(n)
	}
	return pgtype.Numeric{Int: n, Exp: -int32(len(frac)), Valid: true}, ""
}
