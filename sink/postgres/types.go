package postgres

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"tidemark"
)

// Type mapping (also in docs/type-mapping.md). Every value is converted to
// the Go type pgx encodes exactly into the target type; a value of any other
// Go type than the kind's representation (schema.go) is a
// *tidemark.ValueError naming table and column, never a guess. nil is NULL
// for every kind.
//
//	kind        Column.Bits/Precision   PostgreSQL          value sent
//	int         8, 16                   smallint            int16 (range-checked)
//	int         24, 32                  integer             int32 (range-checked)
//	int         64 (or 0 = unknown)     bigint              int64
//	uint        8                       smallint            int16
//	uint        16, 24                  integer             int32
//	uint        32                      bigint              int64
//	uint        64 (or 0 = unknown)     numeric(20,0)       pgtype.Numeric (exact)
//	decimal     P,S (P = 0: unknown)    numeric(P,S)        pgtype.Numeric parsed from the text
//	float                               real                float32
//	double                              double precision    float64
//	text/enum/set                       text                string (valid UTF-8, no NUL)
//	bytes                               bytea               []byte
//	bit         N = 1..64 (0: unknown)  bit(N)              pgtype.Bits of N bits (bit varying(64) when unknown)
//	year                                smallint            int16
//	date                                date                pgtype.Date (value must be midnight UTC)
//	time                                interval            pgtype.Interval, microseconds only (negative and >24h kept)
//	datetime/timestamp                  timestamptz         time.Time in UTC (microsecond precision)
//	json                                jsonb               string (validated; jsonb normalizes text)
//
// Unsigned integers get the next wider signed type so every value fits;
// BIGINT UNSIGNED needs numeric(20,0). Sub-microsecond times and durations
// are rejected rather than truncated: PostgreSQL stores microseconds and the
// round trip must be exact.

// pgType returns the PostgreSQL type of a column.
func pgType(c *tidemark.Column) (string, error) {
	switch c.Kind {
	case tidemark.KindInt:
		switch c.Bits {
		case 8, 16:
			return "smallint", nil
		case 24, 32:
			return "integer", nil
		case 64, 0:
			return "bigint", nil
		}
		return "", fmt.Errorf("integer width %d bits is not one of 8, 16, 24, 32, 64", c.Bits)
	case tidemark.KindUint:
		switch c.Bits {
		case 8:
			return "smallint", nil
		case 16, 24:
			return "integer", nil
		case 32:
			return "bigint", nil
		case 64, 0:
			return "numeric(20,0)", nil
		}
		return "", fmt.Errorf("unsigned integer width %d bits is not one of 8, 16, 24, 32, 64", c.Bits)
	case tidemark.KindDecimal:
		if c.Precision == 0 && c.Scale == 0 {
			return "numeric", nil
		}
		if c.Precision < 1 || c.Precision > 1000 || c.Scale < 0 || c.Scale > c.Precision {
			return "", fmt.Errorf("decimal precision %d, scale %d out of range", c.Precision, c.Scale)
		}
		return fmt.Sprintf("numeric(%d,%d)", c.Precision, c.Scale), nil
	case tidemark.KindFloat:
		return "real", nil
	case tidemark.KindDouble:
		return "double precision", nil
	case tidemark.KindText, tidemark.KindEnum, tidemark.KindSet:
		return "text", nil
	case tidemark.KindBytes:
		return "bytea", nil
	case tidemark.KindBit:
		if c.Bits == 0 {
			return "bit varying(64)", nil
		}
		if c.Bits < 1 || c.Bits > 64 {
			return "", fmt.Errorf("BIT width %d out of range 1..64", c.Bits)
		}
		return fmt.Sprintf("bit(%d)", c.Bits), nil
	case tidemark.KindYear:
		return "smallint", nil
	case tidemark.KindDate:
		return "date", nil
	case tidemark.KindTime:
		return "interval", nil
	case tidemark.KindDateTime, tidemark.KindTimestamp:
		return "timestamptz", nil
	case tidemark.KindJSON:
		return "jsonb", nil
	}
	return "", fmt.Errorf("unsupported column kind %s", c.Kind)
}

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

func wrongType(c *tidemark.Column, want string, v any) string {
	return fmt.Sprintf("want %s for kind %s, got %T", want, c.Kind, v)
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
		return pgDecimal(v.(tidemark.Decimal)), ""
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
