package kafka

import (
	"encoding/base64"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"tidemark"
)

// EnvelopeVersion is the version of the change envelope, published in the
// schema_version header of every change record. docs/kafka-envelope.schema.json
// describes it; a change that breaks consumers increments it.
const EnvelopeVersion = "1"

// The envelope is written by hand, in a fixed field order, straight into one
// buffer per batch (no reflection, no maps):
//
//	{"op":"u",
//	 "before":{"id":1,"name":"a"},        // null for c and r
//	 "after":{"id":1,"name":"b"},         // null for d
//	 "key_only":true,                     // only on a delete found by the key diff
//	 "source":{"name":"shop","server_id":1001,"database":"shop","table":"orders",
//	           "commit_time":"2026-11-29T10:00:00.000000Z","seq":42,"index":1,
//	           "gtid":"0-1001-42","file":null,"pos":null},
//	 "ts":"2026-11-29T10:00:00.123456Z"}
//
// Column values by kind (see appendValue): integers, BIT, YEAR and floats
// are JSON numbers (a BIGINT UNSIGNED above 2^53 is written with all its
// digits: parse it as an unsigned 64-bit integer, not a double); DECIMAL is
// a string with the exact digits; text, ENUM and SET are strings; bytes are
// standard base64 strings; DATE is "YYYY-MM-DD"; TIME is "[-]HH:MM:SS.ffffff"
// (hours may exceed 23); DATETIME and TIMESTAMP are UTC RFC 3339 with exactly
// six fractional digits and "Z"; JSON columns are embedded as JSON; NULL is
// null.

// codec holds what every change of one table (as of one schema) shares.
type codec struct {
	table *tidemark.Table
	topic string
	// names[i] is `"column":` for Columns[i], escaped once.
	names [][]byte
	// source is `,"source":{"name":…,"server_id":…,"database":…,"table":…,`.
	source []byte
	// fingerprint is the table_schema header: a hash of Table.Fingerprint.
	fingerprint []byte
	// sourceName names the source in the schema control record
	// (ControlRecords); since is the version the layout was first
	// announced before (kept when it is announced again).
	sourceName string
	since      tidemark.Version
}

// tableKey names a table of a source (the codecs of its layouts).
type tableKey struct {
	source string
	id     tidemark.TableID
}

type codecKey struct {
	source      string
	id          tidemark.TableID
	fingerprint string
	// jsonUnknown names the columns marked JSONUnknown, which the schema
	// record carries (not part of the fingerprint: the same layout).
	jsonUnknown string
}

// jsonUnknownOf names t's JSONUnknown columns (codecKey.jsonUnknown).
func jsonUnknownOf(t *tidemark.Table) string {
	if !t.HasJSONUnknown() {
		return ""
	}
	var b strings.Builder
	for _, c := range t.Columns {
		if c.JSONUnknown {
			b.WriteString(c.Name)
			b.WriteByte(0)
		}
	}
	return b.String()
}

func newCodec(t *tidemark.Table, source, topic string, serverID uint32) (*codec, error) {
	if len(t.Key) == 0 {
		return nil, fmt.Errorf("encode changes of %s: table has no business key", t.ID)
	}
	for _, k := range t.Key {
		if k < 0 || k >= len(t.Columns) {
			return nil, fmt.Errorf("encode changes of %s: key column index %d out of range", t.ID, k)
		}
	}
	c := &codec{table: t, topic: topic, names: make([][]byte, len(t.Columns))}
	var errs []error
	str := func(dst []byte, s string) []byte {
		out, err := appendString(dst, s)
		errs = append(errs, err)
		return out
	}
	for i, col := range t.Columns {
		c.names[i] = append(str(nil, col.Name), ':')
	}
	b := append([]byte(nil), `,"source":{"name":`...)
	b = str(b, source)
	b = append(b, `,"server_id":`...)
	if serverID == 0 {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendUint(b, uint64(serverID), 10)
	}
	b = append(b, `,"database":`...)
	b = str(b, t.ID.Database)
	b = append(b, `,"table":`...)
	b = str(b, t.ID.Name)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("encode changes of %s: a name: %w", t.ID, err)
	}
	c.source = append(b, ',')
	h := fnv.New64a()
	h.Write([]byte(t.Fingerprint()))
	c.fingerprint = fmt.Appendf(nil, "%016x", h.Sum64())
	c.sourceName = source
	return c, nil
}

// appendKey appends the business key of row as a JSON object, key columns in
// Table.Key order.
func (c *codec) appendKey(dst []byte, row []any) ([]byte, error) {
	if len(row) != len(c.table.Columns) {
		return dst, fmt.Errorf("encode key of %s: row has %d values for %d columns", c.table.ID, len(row), len(c.table.Columns))
	}
	dst = append(dst, '{')
	for i, k := range c.table.Key {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, c.names[k]...)
		var err error
		if dst, err = c.appendColumn(dst, k, row[k]); err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

// appendRow appends a row image as a JSON object in column order, or null.
func (c *codec) appendRow(dst []byte, row []any) ([]byte, error) {
	if row == nil {
		return append(dst, "null"...), nil
	}
	if len(row) != len(c.table.Columns) {
		return dst, fmt.Errorf("encode row of %s: row has %d values for %d columns", c.table.ID, len(row), len(c.table.Columns))
	}
	dst = append(dst, '{')
	for i, v := range row {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, c.names[i]...)
		var err error
		if dst, err = c.appendColumn(dst, i, v); err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

func (c *codec) appendColumn(dst []byte, i int, v any) ([]byte, error) {
	col := &c.table.Columns[i]
	out, detail := appendValue(dst, col.Kind, v)
	if detail != "" {
		return dst, &tidemark.ValueError{Table: c.table.ID, Column: col.Name, Detail: detail}
	}
	return out, nil
}

// appendEnvelope appends the change envelope of ch. batchPos is the
// checkpoint of the batch (zero for a part of a split transaction); ts is
// the publish time.
func (c *codec) appendEnvelope(dst []byte, ch *tidemark.Change, batchPos tidemark.Position, ts time.Time) ([]byte, error) {
	tail, err := envelopeTail(batchPos, ts)
	if err != nil {
		return dst, fmt.Errorf("encode change of %s: %w", c.table.ID, err)
	}
	return c.appendEnvelopeTail(dst, ch, tail)
}

// envelopeTail is the end of every envelope of a batch, from its position
// on: `,"gtid":…,"file":…,"pos":…},"ts":…}`. encode builds it once per
// batch.
func envelopeTail(batchPos tidemark.Position, ts time.Time) ([]byte, error) {
	dst := append([]byte(nil), `,"gtid":`...)
	dst, err1 := appendStringOrNull(dst, batchPos.GTID)
	dst = append(dst, `,"file":`...)
	dst, err2 := appendStringOrNull(dst, batchPos.File)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("the position %s: %w", batchPos, err)
	}
	dst = append(dst, `,"pos":`...)
	if batchPos.File == "" {
		dst = append(dst, "null"...)
	} else {
		dst = strconv.AppendUint(dst, batchPos.Offset, 10)
	}
	dst = append(dst, `},"ts":`...)
	dst = appendTimestamp(dst, ts)
	return append(dst, '}'), nil
}

// appendEnvelopeTail is appendEnvelope with the batch's envelopeTail.
func (c *codec) appendEnvelopeTail(dst []byte, ch *tidemark.Change, tail []byte) ([]byte, error) {
	var err error
	dst = append(dst, `{"op":"`...)
	dst = append(dst, opCode(ch.Op)...)
	dst = append(dst, `","before":`...)
	before := ch.Before
	if ch.Op == tidemark.OpInsert || ch.Op == tidemark.OpRead {
		before = nil
	}
	if dst, err = c.appendRow(dst, before); err != nil {
		return dst, err
	}
	dst = append(dst, `,"after":`...)
	after := ch.After
	if ch.Op == tidemark.OpDelete {
		after = nil
	}
	if dst, err = c.appendRow(dst, after); err != nil {
		return dst, err
	}
	if ch.Op == tidemark.OpDelete && ch.KeyOnly {
		// A delete found by the key diff: only the key of before is
		// known, its other columns are null because they are unknown.
		dst = append(dst, `,"key_only":true`...)
	}
	dst = append(dst, c.source...)
	dst = append(dst, `"commit_time":`...)
	if ch.CommitTime.IsZero() {
		dst = append(dst, "null"...)
	} else {
		dst = appendTimestamp(dst, ch.CommitTime)
	}
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendUint(dst, ch.Version.Seq, 10)
	dst = append(dst, `,"index":`...)
	dst = strconv.AppendUint(dst, uint64(ch.Version.Index), 10)
	return append(dst, tail...), nil
}

// opCode returns the envelope's op: c, u, d or r.
func opCode(op tidemark.Op) string {
	switch op {
	case tidemark.OpInsert:
		return "c"
	case tidemark.OpUpdate:
		return "u"
	case tidemark.OpDelete:
		return "d"
	case tidemark.OpRead:
		return "r"
	}
	return ""
}

// appendValue appends v, the Go value of a column of kind k, as JSON. It
// returns a description of the problem (never the value, which may be
// secret) when v is not the representation tidemark.Kind documents.
func appendValue(dst []byte, k tidemark.Kind, v any) ([]byte, string) {
	if v == nil {
		return append(dst, "null"...), ""
	}
	switch k {
	case tidemark.KindInt, tidemark.KindYear:
		if x, ok := v.(int64); ok {
			return strconv.AppendInt(dst, x, 10), ""
		}
	case tidemark.KindUint, tidemark.KindBit:
		if x, ok := v.(uint64); ok {
			return strconv.AppendUint(dst, x, 10), ""
		}
	case tidemark.KindDecimal:
		switch x := v.(type) {
		case tidemark.Decimal:
			return appendText(dst, string(x))
		case string:
			return appendText(dst, x)
		}
	case tidemark.KindFloat:
		if x, ok := v.(float32); ok {
			return appendFloat(dst, float64(x), 32)
		}
	case tidemark.KindDouble:
		if x, ok := v.(float64); ok {
			return appendFloat(dst, x, 64)
		}
	case tidemark.KindText, tidemark.KindEnum, tidemark.KindSet:
		if x, ok := v.(string); ok {
			return appendText(dst, x)
		}
	case tidemark.KindBytes:
		if x, ok := v.([]byte); ok {
			dst = append(dst, '"')
			dst = base64.StdEncoding.AppendEncode(dst, x)
			return append(dst, '"'), ""
		}
	case tidemark.KindDate:
		if x, ok := v.(time.Time); ok {
			dst = append(dst, '"')
			dst = x.UTC().AppendFormat(dst, "2006-01-02")
			return append(dst, '"'), ""
		}
	case tidemark.KindTime:
		if x, ok := v.(time.Duration); ok {
			return appendDuration(dst, x), ""
		}
	case tidemark.KindDateTime, tidemark.KindTimestamp:
		if x, ok := v.(time.Time); ok {
			return appendTimestamp(dst, x), ""
		}
	case tidemark.KindJSON:
		var doc string
		switch x := v.(type) {
		case tidemark.JSON:
			doc = string(x)
		case string:
			doc = x
		default:
			return dst, fmt.Sprintf("kind %s: want tidemark.JSON, got %T", k, v)
		}
		if !tidemark.JSON(doc).Valid() {
			return dst, "kind json: not a valid JSON document"
		}
		return append(dst, doc...), ""
	default:
		return dst, fmt.Sprintf("unknown kind %s", k)
	}
	return dst, fmt.Sprintf("kind %s: want %s, got %T", k, goType(k), v)
}

func goType(k tidemark.Kind) string {
	switch k {
	case tidemark.KindInt, tidemark.KindYear:
		return "int64"
	case tidemark.KindUint, tidemark.KindBit:
		return "uint64"
	case tidemark.KindDecimal:
		return "tidemark.Decimal"
	case tidemark.KindFloat:
		return "float32"
	case tidemark.KindDouble:
		return "float64"
	case tidemark.KindText, tidemark.KindEnum, tidemark.KindSet:
		return "string"
	case tidemark.KindBytes:
		return "[]byte"
	case tidemark.KindDate, tidemark.KindDateTime, tidemark.KindTimestamp:
		return "time.Time"
	case tidemark.KindTime:
		return "time.Duration"
	}
	return "?"
}

// appendTimestamp appends t in UTC as RFC 3339 with exactly six fractional
// digits (truncated) and "Z", quoted.
func appendTimestamp(dst []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		dst = append(dst, '"')
		dst = t.AppendFormat(dst, "2006-01-02T15:04:05.000000Z")
		return append(dst, '"')
	}
	// By hand: time.AppendFormat was most of the encoding's time after
	// the rows (issue 25's CPU profile of the tailer).
	hour, min, sec := t.Clock()
	us := t.Nanosecond() / 1000
	var b [29]byte // "YYYY-MM-DDTHH:MM:SS.ffffffZ" quoted
	b[0] = '"'
	b[1], b[2], b[3], b[4] = byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10)
	b[5] = '-'
	b[6], b[7] = byte('0'+int(month)/10), byte('0'+int(month)%10)
	b[8] = '-'
	b[9], b[10] = byte('0'+day/10), byte('0'+day%10)
	b[11] = 'T'
	b[12], b[13] = byte('0'+hour/10), byte('0'+hour%10)
	b[14] = ':'
	b[15], b[16] = byte('0'+min/10), byte('0'+min%10)
	b[17] = ':'
	b[18], b[19] = byte('0'+sec/10), byte('0'+sec%10)
	b[20] = '.'
	for i := 26; i >= 21; i-- {
		b[i] = byte('0' + us%10)
		us /= 10
	}
	b[27], b[28] = 'Z', '"'
	return append(dst, b[:]...)
}

// appendDuration appends a TIME value as "[-]HH:MM:SS.ffffff", quoted.
func appendDuration(dst []byte, d time.Duration) []byte {
	dst = append(dst, '"')
	us := int64(d / time.Microsecond)
	if us < 0 {
		dst = append(dst, '-')
		us = -us
	}
	h, m, s, f := us/3_600_000_000, us/60_000_000%60, us/1_000_000%60, us%1_000_000
	if h < 10 {
		dst = append(dst, '0')
	}
	dst = strconv.AppendInt(dst, h, 10)
	dst = append(dst, ':', byte('0'+m/10), byte('0'+m%10), ':', byte('0'+s/10), byte('0'+s%10), '.')
	for div := int64(100_000); div > 0; div /= 10 {
		dst = append(dst, byte('0'+f/div%10))
	}
	return append(dst, '"')
}

// appendFloat appends f as a JSON number the way encoding/json does
// (shortest representation that round-trips at the given bit size). NaN and
// infinities have no JSON form.
func appendFloat(dst []byte, f float64, bits int) ([]byte, string) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return dst, "not a finite number"
	}
	abs := math.Abs(f)
	fmtc := byte('f')
	if abs != 0 {
		if bits == 64 && (abs < 1e-6 || abs >= 1e21) || bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
			fmtc = 'e'
		}
	}
	dst = strconv.AppendFloat(dst, f, fmtc, -1, bits)
	if fmtc == 'e' {
		// Clean up e-09 to e-9.
		n := len(dst)
		if n >= 4 && dst[n-4] == 'e' && dst[n-3] == '-' && dst[n-2] == '0' {
			dst[n-2] = dst[n-1]
			dst = dst[:n-1]
		}
	}
	return dst, ""
}

func appendStringOrNull(dst []byte, s string) ([]byte, error) {
	if s == "" {
		return append(dst, "null"...), nil
	}
	return appendString(dst, s)
}

const hexDigits = "0123456789abcdef"

// appendText is appendString for a value: invalid UTF-8 is described (the
// value itself is never part of an error).
func appendText(dst []byte, s string) ([]byte, string) {
	out, err := appendString(dst, s)
	if err != nil {
		return dst, "text is not valid UTF-8 (a character set tidemark did not decode); substituting U+FFFD would publish other text than the source holds"
	}
	return out, ""
}

// errNotUTF8 is text that is not valid UTF-8: JSON cannot carry it, and
// substituting U+FFFD would publish other text than the source holds.
var errNotUTF8 = errors.New("text is not valid UTF-8")

// appendString appends s as a JSON string. Invalid UTF-8 is an error
// (errNotUTF8), never replaced: a value in a character set tidemark did
// not decode must not reach a consumer as other text.
func appendString(dst []byte, s string) ([]byte, error) {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			return dst, errNotUTF8
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"'), nil
}
