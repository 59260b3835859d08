package mysqlprimary

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"strings"
)

// This file encodes MySQL's binary JSON format (sql-common/json_binary.h in
// the MySQL source: "JSON binary format"), which MySQL 8 writes into the
// binlog for JSON columns. It is written from the documented format, not
// from go-mysql; the tests check every encoding against vitess's decoder
// (vitess.io/vitess/go/mysql/binlog.ParseBinaryJSON).

// JSON value types the encoder accepts, besides nil (JSON null), bool,
// string, int, int64, uint64, float64 and []any (an array):

// JSONObject is a JSON object; MySQL stores its keys sorted by length, then
// bytes (the encoder sorts them), and a later duplicate key wins.
type JSONObject []JSONMember

// JSONMember is one key of a JSONObject.
type JSONMember struct {
	Key   string
	Value any
}

// JSONDecimal is a DECIMAL inside JSON (an opaque value of type
// NEWDECIMAL), e.g. CAST('12.50' AS DECIMAL(10,2)) stored in a JSON
// document. Digits is its text ("-12.50"); Precision and Scale its type.
type JSONDecimal struct {
	Digits           string
	Precision, Scale int
}

// JSONTemporal is a DATETIME, DATE, TIME or TIMESTAMP inside JSON (an opaque
// value of that MySQL type, stored packed as MySQL's my_time_packed /
// my_datetime_packed).
type JSONTemporal struct {
	Type                                       byte // TypeDateTime2, TypeDate, TypeTime2 or TypeTimestamp2
	Year, Month, Day, Hour, Minute, Second, Us int
	Negative                                   bool // TIME only
}

// JSON type tags (json_binary.h).
const (
	jsonSmallObject = 0x00
	jsonLargeObject = 0x01
	jsonSmallArray  = 0x02
	jsonLargeArray  = 0x03
	jsonLiteral     = 0x04
	jsonInt16       = 0x05
	jsonUint16      = 0x06
	jsonInt32       = 0x07
	jsonUint32      = 0x08
	jsonInt64       = 0x09
	jsonUint64      = 0x0a
	jsonDouble      = 0x0b
	jsonString      = 0x0c
	jsonOpaque      = 0x0f

	jsonNull  = 0x00
	jsonTrue  = 0x01
	jsonFalse = 0x02
)

// EncodeJSON returns the binary JSON encoding of v as MySQL stores it.
func EncodeJSON(v any) ([]byte, error) {
	typ, body, err := jsonValue(v, false)
	if err != nil {
		return nil, err
	}
	return append([]byte{typ}, body...), nil
}

// jsonValue returns the type tag and the encoding of v. For an object or
// array it tries the small format (16-bit offsets) first, as MySQL does.
func jsonValue(v any, _ bool) (byte, []byte, error) {
	switch x := v.(type) {
	case nil:
		return jsonLiteral, []byte{jsonNull}, nil
	case bool:
		if x {
			return jsonLiteral, []byte{jsonTrue}, nil
		}
		return jsonLiteral, []byte{jsonFalse}, nil
	case int:
		return jsonInt(int64(x))
	case int64:
		return jsonInt(x)
	case uint64:
		switch {
		case x <= math.MaxUint16:
			return jsonUint16, binary.LittleEndian.AppendUint16(nil, uint16(x)), nil
		case x <= math.MaxUint32:
			return jsonUint32, binary.LittleEndian.AppendUint32(nil, uint32(x)), nil
		}
		return jsonUint64, binary.LittleEndian.AppendUint64(nil, x), nil
	case float64:
		return jsonDouble, binary.LittleEndian.AppendUint64(nil, math.Float64bits(x)), nil
	case string:
		return jsonString, append(varLen(nil, len(x)), x...), nil
	case JSONDecimal:
		bin, err := decimalBinary(x.Digits, x.Precision, x.Scale)
		if err != nil {
			return 0, nil, err
		}
		data := append([]byte{byte(x.Precision), byte(x.Scale)}, bin...)
		return jsonOpaque, append(varLen([]byte{TypeNewDecimal}, len(data)), data...), nil
	case JSONTemporal:
		packed := binary.LittleEndian.AppendUint64(nil, uint64(x.packed()))
		return jsonOpaque, append(varLen([]byte{x.Type}, len(packed)), packed...), nil
	case []any:
		if body, ok, err := jsonContainer(nil, x, false); err != nil || ok {
			return jsonSmallArray, body, err
		}
		body, _, err := jsonContainer(nil, x, true)
		return jsonLargeArray, body, err
	case JSONObject:
		keys, vals := sortedMembers(x)
		if body, ok, err := jsonContainer(keys, vals, false); err != nil || ok {
			return jsonSmallObject, body, err
		}
		body, _, err := jsonContainer(keys, vals, true)
		return jsonLargeObject, body, err
	}
	return 0, nil, fmt.Errorf("encode JSON: unsupported Go type %T", v)
}

func jsonInt(x int64) (byte, []byte, error) {
	switch {
	case x >= math.MinInt16 && x <= math.MaxInt16:
		return jsonInt16, binary.LittleEndian.AppendUint16(nil, uint16(int16(x))), nil
	case x >= math.MinInt32 && x <= math.MaxInt32:
		return jsonInt32, binary.LittleEndian.AppendUint32(nil, uint32(int32(x))), nil
	}
	return jsonInt64, binary.LittleEndian.AppendUint64(nil, uint64(x)), nil
}

// sortedMembers orders an object's keys as MySQL stores them: by length,
// then by bytes; of duplicate keys the last one is kept.
func sortedMembers(o JSONObject) ([]string, []any) {
	last := map[string]any{}
	for _, m := range o {
		last[m.Key] = m.Value
	}
	keys := make([]string, 0, len(last))
	for k := range last {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if len(keys[i]) != len(keys[j]) {
			return len(keys[i]) < len(keys[j])
		}
		return keys[i] < keys[j]
	})
	vals := make([]any, len(keys))
	for i, k := range keys {
		vals[i] = last[k]
	}
	return keys, vals
}

// inlined reports whether a scalar of type typ is stored in its value entry.
func inlined(typ byte, large bool) bool {
	switch typ {
	case jsonLiteral, jsonInt16, jsonUint16:
		return true
	case jsonInt32, jsonUint32:
		return large
	}
	return false
}

// jsonContainer encodes an object (keys != nil) or an array: element count,
// total size, key entries, value entries, keys, values. ok is false when
// the small format's 16-bit offsets cannot hold it.
func jsonContainer(keys []string, vals []any, large bool) (body []byte, ok bool, err error) {
	off := 2
	if large {
		off = 4
	}
	putN := func(b []byte, n int) []byte {
		if large {
			return binary.LittleEndian.AppendUint32(b, uint32(n))
		}
		return binary.LittleEndian.AppendUint16(b, uint16(n))
	}
	limit := math.MaxUint16
	if large {
		limit = math.MaxUint32
	}
	n := len(vals)
	header := 2 * off
	if keys != nil {
		header += n * (off + 2)
	}
	header += n * (1 + off)
	var tail []byte // keys then non-inlined values
	keyEntries := make([]byte, 0, n*(off+2))
	for _, k := range keys {
		if len(k) > math.MaxUint16 {
			return nil, false, fmt.Errorf("encode JSON: key of %d bytes", len(k))
		}
		keyEntries = putN(keyEntries, header+len(tail))
		keyEntries = binary.LittleEndian.AppendUint16(keyEntries, uint16(len(k)))
		tail = append(tail, k...)
	}
	valEntries := make([]byte, 0, n*(1+off))
	for _, v := range vals {
		typ, enc, err := jsonValue(v, large)
		if err != nil {
			return nil, false, err
		}
		valEntries = append(valEntries, typ)
		if inlined(typ, large) {
			padded := make([]byte, off)
			copy(padded, enc)
			valEntries = append(valEntries, padded...)
			continue
		}
		if header+len(tail) > limit {
			return nil, false, nil
		}
		valEntries = putN(valEntries, header+len(tail))
		tail = append(tail, enc...)
	}
	size := header + len(tail)
	if size > limit {
		return nil, false, nil
	}
	body = putN(nil, n)
	body = putN(body, size)
	body = append(body, keyEntries...)
	body = append(body, valEntries...)
	body = append(body, tail...)
	return body, true, nil
}

// varLen appends n in json_binary's variable-length format: 7 bits a byte,
// low bits first, the high bit set on every byte but the last.
func varLen(b []byte, n int) []byte {
	for {
		c := byte(n & 0x7f)
		n >>= 7
		if n == 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// packed returns MySQL's packed representation (my_datetime_packed,
// my_time_packed) that JSON stores for temporal values.
func (t JSONTemporal) packed() int64 {
	if t.Type == TypeTime {
		hms := int64(t.Hour)<<12 | int64(t.Minute)<<6 | int64(t.Second)
		v := hms<<24 + int64(t.Us)
		if t.Negative {
			v = -v
		}
		return v
	}
	ymd := (int64(t.Year)*13+int64(t.Month))<<5 | int64(t.Day)
	hms := int64(t.Hour)<<12 | int64(t.Minute)<<6 | int64(t.Second)
	return (ymd<<17|hms)<<24 + int64(t.Us)
}

// decimalBinary encodes a decimal as MySQL's decimal2bin: the integer and
// fraction digits in groups of nine per 4-byte big-endian word (leftover
// digits in 1–4 bytes), all bits inverted for a negative number, and the
// top bit of the first byte flipped.
func decimalBinary(digits string, precision, scale int) ([]byte, error) {
	neg := strings.HasPrefix(digits, "-")
	digits = strings.TrimPrefix(digits, "-")
	intPart, frac, _ := strings.Cut(digits, ".")
	intg := precision - scale
	if len(strings.TrimLeft(intPart, "0")) > intg || len(frac) > scale {
		return nil, fmt.Errorf("encode decimal %s: does not fit DECIMAL(%d,%d)", digits, precision, scale)
	}
	intPart = strings.Repeat("0", intg-len(intPart)) + intPart
	intPart = intPart[len(intPart)-intg:]
	frac += strings.Repeat("0", scale-len(frac))
	dig2bytes := [10]int{0, 1, 1, 2, 2, 3, 3, 4, 4, 4}
	var out []byte
	putGroup := func(s string, nbytes int) {
		var v uint32
		for _, c := range s {
			v = v*10 + uint32(c-'0')
		}
		for i := nbytes - 1; i >= 0; i-- {
			out = append(out, byte(v>>(8*i)))
		}
	}
	lead := intg % 9
	if lead > 0 {
		putGroup(intPart[:lead], dig2bytes[lead])
	}
	for i := lead; i < intg; i += 9 {
		putGroup(intPart[i:i+9], 4)
	}
	full := scale / 9 * 9
	for i := 0; i < full; i += 9 {
		putGroup(frac[i:i+9], 4)
	}
	if rest := scale - full; rest > 0 {
		putGroup(frac[full:], dig2bytes[rest])
	}
	if neg {
		for i := range out {
			out[i] = ^out[i]
		}
	}
	out[0] ^= 0x80
	return out, nil
}
