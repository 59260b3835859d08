package postgres

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"tidemark"
)

// COPY in PostgreSQL's binary format, written by the sink itself. pgx's
// CopyFrom takes a row of boxed values and, for every value, looks up an
// encode plan and boxes again; on the benchmark that was a fifth of the
// sink's CPU. Here each change is checked and encoded once, when the batch
// is planned, straight from tidemark's values into the column types the
// sink creates (pgType); a COPY then only concatenates the encoded rows.
// TestBinaryMatchesPgx holds every kind to the bytes pgx would send for the
// same value.

// copyHeader starts a binary COPY stream: signature, flags, extension.
var copyHeader = []byte("PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00")

// copyTrailer ends it.
var copyTrailer = []byte{0xff, 0xff}

// pgEpoch is PostgreSQL's epoch (2000-01-01 UTC) in Unix seconds.
const pgEpoch = 946684800

// appendNull appends a NULL field.
func appendNull(buf []byte) []byte { return binary.BigEndian.AppendUint32(buf, math.MaxUint32) }

// appendTimestamptz appends a timestamptz field.
func appendTimestamptz(buf []byte, t time.Time) []byte {
	buf = binary.BigEndian.AppendUint32(buf, 8)
	us := (t.Unix()-pgEpoch)*1_000_000 + int64(t.Nanosecond()/1000)
	return binary.BigEndian.AppendUint64(buf, uint64(us))
}

// appendText appends a text field.
func appendText(buf []byte, s string) []byte {
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(s)))
	return append(buf, s...)
}

// appendValue appends the field (length and bytes) of value v of column c,
// or returns a description of why v cannot be stored.
func appendValue(buf []byte, c *tidemark.Column, v any) ([]byte, string) {
	if v == nil {
		return appendNull(buf), ""
	}
	start := len(buf)
	buf = append(buf, 0, 0, 0, 0) // the length, set below
	buf, detail := appendBody(buf, c, v)
	if detail != "" {
		return buf[:start], detail
	}
	binary.BigEndian.PutUint32(buf[start:], uint32(len(buf)-start-4))
	return buf, ""
}

func appendInt(buf []byte, c *tidemark.Column, x int64) ([]byte, string) {
	switch c.Bits {
	case 8, 16:
		if x < math.MinInt16 || x > math.MaxInt16 {
			return buf, fmt.Sprintf("%d-bit integer out of smallint range", c.Bits)
		}
		return binary.BigEndian.AppendUint16(buf, uint16(int16(x))), ""
	case 24, 32:
		if x < math.MinInt32 || x > math.MaxInt32 {
			return buf, fmt.Sprintf("%d-bit integer out of integer range", c.Bits)
		}
		return binary.BigEndian.AppendUint32(buf, uint32(int32(x))), ""
	}
	return binary.BigEndian.AppendUint64(buf, uint64(x)), ""
}

func appendBody(buf []byte, c *tidemark.Column, v any) ([]byte, string) {
	switch c.Kind {
	case tidemark.KindInt:
		x, ok := v.(int64)
		if !ok {
			return buf, wrongType(c, "int64", v)
		}
		return appendInt(buf, c, x)
	case tidemark.KindUint:
		x, ok := v.(uint64)
		if !ok {
			return buf, wrongType(c, "uint64", v)
		}
		switch c.Bits {
		case 8:
			if x > math.MaxInt16 {
				return buf, "unsigned 8-bit integer out of smallint range"
			}
			return binary.BigEndian.AppendUint16(buf, uint16(x)), ""
		case 16, 24:
			if x > math.MaxInt32 {
				return buf, fmt.Sprintf("unsigned %d-bit integer out of integer range", c.Bits)
			}
			return binary.BigEndian.AppendUint32(buf, uint32(x)), ""
		case 32:
			if x > math.MaxInt64 {
				return buf, "unsigned 32-bit integer out of bigint range"
			}
			return binary.BigEndian.AppendUint64(buf, x), ""
		}
		b, err := appendNumericBinary(buf, strconv.FormatUint(x, 10))
		if err != nil {
			return buf, err.Error()
		}
		return b, ""
	case tidemark.KindDecimal:
		x, ok := v.(tidemark.Decimal)
		if !ok {
			return buf, wrongType(c, "tidemark.Decimal", v)
		}
		if detail := validDecimal(string(x)); detail != "" {
			return buf, detail
		}
		b, err := appendNumericBinary(buf, string(x))
		if err != nil {
			return buf, err.Error()
		}
		return b, ""
	case tidemark.KindFloat:
		x, ok := v.(float32)
		if !ok {
			return buf, wrongType(c, "float32", v)
		}
		return binary.BigEndian.AppendUint32(buf, math.Float32bits(x)), ""
	case tidemark.KindDouble:
		x, ok := v.(float64)
		if !ok {
			return buf, wrongType(c, "float64", v)
		}
		return binary.BigEndian.AppendUint64(buf, math.Float64bits(x)), ""
	case tidemark.KindText, tidemark.KindEnum, tidemark.KindSet:
		x, ok := v.(string)
		if !ok {
			return buf, wrongType(c, "string", v)
		}
		if strings.IndexByte(x, 0) >= 0 {
			return buf, "text contains a NUL byte, which PostgreSQL text cannot store"
		}
		if !utf8.ValidString(x) {
			return buf, "text is not valid UTF-8"
		}
		return append(buf, x...), ""
	case tidemark.KindBytes:
		x, ok := v.([]byte)
		if !ok {
			return buf, wrongType(c, "[]byte", v)
		}
		return append(buf, x...), ""
	case tidemark.KindBit:
		x, ok := v.(uint64)
		if !ok {
			return buf, wrongType(c, "uint64", v)
		}
		n := c.Bits
		if n == 0 {
			n = 64
		}
		if n < 64 && x>>uint(n) != 0 {
			return buf, fmt.Sprintf("value has more than %d bits", n)
		}
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], x<<uint(64-n))
		buf = binary.BigEndian.AppendUint32(buf, uint32(n))
		return append(buf, b[:(n+7)/8]...), ""
	case tidemark.KindYear:
		x, ok := v.(int64)
		if !ok {
			return buf, wrongType(c, "int64", v)
		}
		if x < 0 || x > math.MaxInt16 {
			return buf, "year out of range"
		}
		return binary.BigEndian.AppendUint16(buf, uint16(x)), ""
	case tidemark.KindDate:
		x, ok := v.(time.Time)
		if !ok {
			return buf, wrongType(c, "time.Time", v)
		}
		x = x.UTC()
		if x.Hour() != 0 || x.Minute() != 0 || x.Second() != 0 || x.Nanosecond() != 0 {
			return buf, "date is not midnight UTC"
		}
		days := (x.Unix() - pgEpoch) / 86400
		if days < math.MinInt32 || days > math.MaxInt32 {
			return buf, "date out of range"
		}
		return binary.BigEndian.AppendUint32(buf, uint32(int32(days))), ""
	case tidemark.KindTime:
		x, ok := v.(time.Duration)
		if !ok {
			return buf, wrongType(c, "time.Duration", v)
		}
		if x%time.Microsecond != 0 {
			return buf, "time has sub-microsecond precision"
		}
		buf = binary.BigEndian.AppendUint64(buf, uint64(int64(x/time.Microsecond)))
		return append(buf, 0, 0, 0, 0, 0, 0, 0, 0), "" // days, months
	case tidemark.KindDateTime, tidemark.KindTimestamp:
		x, ok := v.(time.Time)
		if !ok {
			return buf, wrongType(c, "time.Time", v)
		}
		if x.Nanosecond()%1000 != 0 {
			return buf, "time has sub-microsecond precision"
		}
		us := (x.Unix()-pgEpoch)*1_000_000 + int64(x.Nanosecond()/1000)
		return binary.BigEndian.AppendUint64(buf, uint64(us)), ""
	case tidemark.KindJSON:
		x, ok := v.(tidemark.JSON)
		if !ok {
			return buf, wrongType(c, "tidemark.JSON", v)
		}
		if !x.Valid() {
			return buf, "not valid JSON"
		}
		if jsonHasNUL(string(x)) {
			return buf, `JSON string contains a NUL byte (\u0000), which PostgreSQL jsonb cannot store`
		}
		buf = append(buf, 1) // jsonb binary format version
		return append(buf, x...), ""
	}
	return buf, fmt.Sprintf("unsupported column kind %s", c.Kind)
}

// copyRows is a group's rows encoded for COPY: for each row its op code and
// the span of buf holding its fields after _tm_op — the table's columns,
// _tm_seq, _tm_idx and _tm_commit_time.
type copyRows struct {
	buf  []byte
	rows []copyRow
}

type copyRow struct {
	op         string
	start, end int
}

// stageStream returns the COPY stream of the staging table: (_tm_op,
// columns…, _tm_seq, _tm_idx, _tm_commit_time).
func (r *copyRows) stageStream(ncols int) *copyStream {
	return &copyStream{rows: r, fields: uint16(ncols + 4), op: true}
}

// directStream returns the COPY stream of the target table for the direct
// insert path: (columns…, _tm_seq, _tm_idx, _tm_commit_time, _tm_loaded_at
// [, _tm_deleted, _tm_deleted_at]).
func (r *copyRows) directStream(ncols int, loadedAt time.Time, soft bool) *copyStream {
	fields := ncols + 4
	suffix := appendTimestamptz(nil, loadedAt)
	if soft {
		fields += 2
		suffix = binary.BigEndian.AppendUint32(suffix, 1)
		suffix = append(suffix, 0) // _tm_deleted false
		suffix = appendNull(suffix)
	}
	return &copyStream{rows: r, fields: uint16(fields), suffix: suffix}
}

// copyStream is a binary COPY stream of a group's rows, produced as
// pgconn reads it: each row is its field count (and op, for the staging
// table), its span of the encoded fields, and a suffix shared by all rows.
// Nothing of the size of the whole stream is built: the rows' bytes are
// copied once, from the group's buffer into pgconn's.
type copyStream struct {
	rows   *copyRows
	fields uint16
	op     bool   // each row starts with its _tm_op (the staging table)
	suffix []byte // after each row's span

	state   int    // 0 header, 1 rows, 2 trailer, 3 end
	next    int    // the next row
	part    int    // the current row's next piece: 1 span, 2 suffix, 3 none
	pending []byte // bytes of the current piece not yet read
	prefix  []byte // the current row's field count (and op)
}

// Read implements io.Reader.
func (s *copyStream) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n := 0
	for n < len(p) {
		if len(s.pending) == 0 && !s.advance() {
			break
		}
		c := copy(p[n:], s.pending)
		s.pending = s.pending[c:]
		n += c
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// advance makes the stream's next piece pending; false at its end.
func (s *copyStream) advance() bool {
	switch s.state {
	case 0:
		s.state, s.part = 1, 3
		s.pending = copyHeader
		return true
	case 1:
		r := s.rows
		switch {
		case s.part == 1:
			row := r.rows[s.next-1]
			s.part, s.pending = 2, r.buf[row.start:row.end]
		case s.part == 2 && len(s.suffix) > 0:
			s.part, s.pending = 3, s.suffix
		case s.next < len(r.rows):
			row := r.rows[s.next]
			s.next++
			s.prefix = binary.BigEndian.AppendUint16(s.prefix[:0], s.fields)
			if s.op {
				s.prefix = appendText(s.prefix, row.op)
			}
			s.part, s.pending = 1, s.prefix
		default:
			s.state, s.pending = 2, copyTrailer
		}
		return true
	case 2:
		s.state = 3
	}
	return false
}

// copySQL is a COPY … FROM STDIN in binary format into table (quoted) and
// columns (unquoted).
func copySQL(table string, columns []string) string {
	q := make([]string, len(columns))
	for i, c := range columns {
		q[i] = tidemark.QuotePostgres(c)
	}
	return "COPY " + table + " (" + strings.Join(q, ", ") + ") FROM STDIN (FORMAT binary)"
}

// jsonHasNUL reports whether valid JSON text holds the escape \u0000 in a
// string (a raw NUL byte is not valid JSON). An escaped backslash followed
// by "u0000" is not one.
func jsonHasNUL(s string) bool {
	for i := strings.Index(s, `\`); i >= 0 && i+1 < len(s); {
		if s[i+1] == 'u' && strings.HasPrefix(s[i+2:], "0000") {
			return true
		}
		j := strings.Index(s[i+2:], `\`)
		if j < 0 {
			return false
		}
		i += 2 + j
	}
	return false
}
