package postgres

import (
	"fmt"

	"tidemark"
)

// Type mapping (also in docs/type-mapping.md). Every value is encoded
// exactly into the target type's binary COPY format (encode.go; the last
// column is the pgx value the encoding is held to in the tests); a value of
// any other Go type than the kind's representation (schema.go) is a
// *tidemark.ValueError naming table and column, never a guess. nil is NULL
// for every kind.
//
//	kind        Column.Bits/Precision   PostgreSQL          same bytes as pgx's
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

// wrongType describes a value of the wrong Go type for its column.
func wrongType(c *tidemark.Column, want string, v any) string {
	return fmt.Sprintf("want %s for kind %s, got %T", want, c.Kind, v)
}
