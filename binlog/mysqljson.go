package binlog

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// renderMySQLJSON renders a MySQL binary JSON value (sql-common/json_binary.h:
// a type byte, then the value) as JSON text with MySQL's number semantics:
//
//   - integers as their exact digits (INT64/UINT64 included);
//   - DECIMAL values (opaque NEWDECIMAL) with every digit and their scale;
//   - DOUBLE values with the shortest digits that read back as the same
//     double — the digits MySQL prints — and ".0" when they would read as an
//     integer, so the value stays a double; scientific notation below 1e-5
//     and from 1e15 on;
//   - DATE, TIME, DATETIME and TIMESTAMP values (opaque) as MySQL prints
//     them in JSON: quoted, with six fractional digits for times;
//   - other opaque values as MySQL does: "base64:type<N>:<base64>";
//   - object keys in stored order (MySQL's: by length, then bytes).
//
// go-mysql's own rendering prints integral doubles in full ('f' format:
// 1e300 as 301 digits, a different number once PostgreSQL stores it as
// numeric) and does not know DATETIME inside JSON under its MySQL type
// codes, so the tailer re-renders MySQL JSON columns with this.
func renderMySQLJSON(data []byte) (string, error) {
	if len(data) == 0 {
		return "null", nil // an empty value: MySQL's JSON null
	}
	var b bytes.Buffer
	if err := jsonValue(&b, data[0], data[1:], 0); err != nil {
		return "", fmt.Errorf("decode MySQL JSON: %w", err)
	}
	return b.String(), nil
}

const maxJSONDepth = 150 // MySQL allows 100

var errJSONShort = errors.New("value truncated")

func jsonValue(b *bytes.Buffer, tp byte, d []byte, depth int) error {
	if depth > maxJSONDepth {
		return errors.New("nested too deep")
	}
	need := func(n int) error {
		if len(d) < n {
			return errJSONShort
		}
		return nil
	}
	switch tp {
	case 0x00, 0x01, 0x02, 0x03: // small/large object, small/large array
		return jsonContainer(b, d, tp <= 0x01, tp == 0x01 || tp == 0x03, depth)
	case 0x04: // literal
		if err := need(1); err != nil {
			return err
		}
		switch d[0] {
		case 0x00:
			b.WriteString("null")
		case 0x01:
			b.WriteString("true")
		case 0x02:
			b.WriteString("false")
		default:
			return fmt.Errorf("unknown literal %d", d[0])
		}
	case 0x05, 0x06: // int16, uint16
		if err := need(2); err != nil {
			return err
		}
		v := binary.LittleEndian.Uint16(d)
		if tp == 0x05 {
			b.WriteString(strconv.FormatInt(int64(int16(v)), 10))
		} else {
			b.WriteString(strconv.FormatUint(uint64(v), 10))
		}
	case 0x07, 0x08: // int32, uint32
		if err := need(4); err != nil {
			return err
		}
		v := binary.LittleEndian.Uint32(d)
		if tp == 0x07 {
			b.WriteString(strconv.FormatInt(int64(int32(v)), 10))
		} else {
			b.WriteString(strconv.FormatUint(uint64(v), 10))
		}
	case 0x09, 0x0a: // int64, uint64
		if err := need(8); err != nil {
			return err
		}
		v := binary.LittleEndian.Uint64(d)
		if tp == 0x09 {
			b.WriteString(strconv.FormatInt(int64(v), 10))
		} else {
			b.WriteString(strconv.FormatUint(v, 10))
		}
	case 0x0b: // double
		if err := need(8); err != nil {
			return err
		}
		b.WriteString(formatJSONDouble(math.Float64frombits(binary.LittleEndian.Uint64(d))))
	case 0x0c: // string
		n, k, err := jsonVarLen(d)
		if err != nil {
			return err
		}
		if len(d) < k+n {
			return errJSONShort
		}
		writeJSONString(b, d[k:k+n])
	case 0x0f: // opaque: field type, length, bytes
		if err := need(1); err != nil {
			return err
		}
		ft := d[0]
		n, k, err := jsonVarLen(d[1:])
		if err != nil {
			return err
		}
		if len(d) < 1+k+n {
			return errJSONShort
		}
		return jsonOpaque(b, ft, d[1+k:1+k+n])
	default:
		return fmt.Errorf("unknown JSON type %d", tp)
	}
	return nil
}

func jsonContainer(b *bytes.Buffer, d []byte, object, large bool, depth int) error {
	w := 2
	if large {
		w = 4
	}
	rd := func(off int) (int, error) {
		if off < 0 || off+w > len(d) {
			return 0, errJSONShort
		}
		if large {
			return int(binary.LittleEndian.Uint32(d[off:])), nil
		}
		return int(binary.LittleEndian.Uint16(d[off:])), nil
	}
	count, err := rd(0)
	if err != nil {
		return err
	}
	size, err := rd(w)
	if err != nil {
		return err
	}
	if size > len(d) {
		return errJSONShort
	}
	d = d[:size]
	keyEntries := 2 * w
	valEntries := keyEntries
	if object {
		valEntries += count * (w + 2)
	}
	open, closing := byte('['), byte(']')
	if object {
		open, closing = '{', '}'
	}
	b.WriteByte(open)
	for i := 0; i < count; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		if object {
			ke := keyEntries + i*(w+2)
			off, err := rd(ke)
			if err != nil {
				return err
			}
			if ke+w+2 > len(d) {
				return errJSONShort
			}
			kl := int(binary.LittleEndian.Uint16(d[ke+w:]))
			if off+kl > len(d) {
				return errJSONShort
			}
			writeJSONString(b, d[off:off+kl])
			b.WriteString(": ")
		}
		ve := valEntries + i*(1+w)
		if ve+1+w > len(d) {
			return errJSONShort
		}
		tp := d[ve]
		inline := tp == 0x04 || tp == 0x05 || tp == 0x06 || (large && (tp == 0x07 || tp == 0x08))
		if inline {
			if err := jsonValue(b, tp, d[ve+1:ve+1+w], depth+1); err != nil {
				return err
			}
			continue
		}
		off, err := rd(ve + 1)
		if err != nil {
			return err
		}
		if off > len(d) {
			return errJSONShort
		}
		if err := jsonValue(b, tp, d[off:], depth+1); err != nil {
			return err
		}
	}
	b.WriteByte(closing)
	return nil
}

// jsonVarLen reads json_binary's variable-length integer (7 bits a byte,
// low first): its value and its size.
func jsonVarLen(d []byte) (n, size int, err error) {
	for i := 0; i < 5 && i < len(d); i++ {
		n |= int(d[i]&0x7f) << (7 * i)
		if d[i]&0x80 == 0 {
			return n, i + 1, nil
		}
	}
	return 0, 0, errJSONShort
}

// MySQL field types of opaque JSON values.
const (
	myTypeTimestamp  = 7
	myTypeDate       = 10
	myTypeTime       = 11
	myTypeDateTime   = 12
	myTypeNewDecimal = 246
)

func jsonOpaque(b *bytes.Buffer, ft byte, d []byte) error {
	switch ft {
	case myTypeNewDecimal:
		if len(d) < 2 {
			return errJSONShort
		}
		s, err := decimalText(d[2:], int(d[0]), int(d[1]))
		if err != nil {
			return err
		}
		b.WriteString(s)
		return nil
	case myTypeDate, myTypeDateTime, myTypeTimestamp, myTypeTime:
		if len(d) < 8 {
			return errJSONShort
		}
		v := int64(binary.LittleEndian.Uint64(d))
		b.WriteByte('"')
		b.WriteString(packedTemporal(ft, v))
		b.WriteByte('"')
		return nil
	}
	b.WriteString(`"base64:type` + strconv.Itoa(int(ft)) + ":" + base64.StdEncoding.EncodeToString(d) + `"`)
	return nil
}

// packedTemporal formats MySQL's packed temporal (my_datetime_packed,
// my_time_packed) as MySQL prints it inside JSON.
func packedTemporal(ft byte, v int64) string {
	sign := ""
	if v < 0 {
		sign, v = "-", -v
	}
	frac := v % (1 << 24)
	i := v >> 24
	if ft == myTypeTime {
		return fmt.Sprintf("%s%02d:%02d:%02d.%06d", sign, (i>>12)%(1<<10), (i>>6)%(1<<6), i%(1<<6), frac)
	}
	ymd, hms := i>>17, i%(1<<17)
	ym := ymd >> 5
	date := fmt.Sprintf("%04d-%02d-%02d", ym/13, ym%13, ymd%(1<<5))
	if ft == myTypeDate {
		return date
	}
	return fmt.Sprintf("%s %02d:%02d:%02d.%06d", date, hms>>12, (hms>>6)%(1<<6), hms%(1<<6), frac)
}

// decimalText decodes MySQL's binary DECIMAL (decimal2bin) of the given
// precision and scale into its text, with exactly scale fraction digits.
func decimalText(d []byte, precision, scale int) (string, error) {
	intg := precision - scale
	size := func(digits int) int { return digits/9*4 + decimalDigitBytes[digits%9] }
	total := size(intg) + size(scale)
	if precision <= 0 || scale > precision || len(d) < total {
		return "", fmt.Errorf("bad DECIMAL(%d,%d)", precision, scale)
	}
	buf := append([]byte(nil), d[:total]...)
	neg := buf[0]&0x80 == 0
	buf[0] ^= 0x80
	if neg {
		for i := range buf {
			buf[i] = ^buf[i]
		}
	}
	pos := 0
	group := func(nbytes, digits int) string {
		var v uint32
		for k := 0; k < nbytes; k++ {
			v = v<<8 | uint32(buf[pos+k])
		}
		pos += nbytes
		s := strconv.FormatUint(uint64(v), 10)
		return strings.Repeat("0", max(0, digits-len(s))) + s
	}
	var ip strings.Builder
	if lead := intg % 9; lead > 0 {
		ip.WriteString(group(decimalDigitBytes[lead], lead))
	}
	for k := 0; k < intg/9; k++ {
		ip.WriteString(group(4, 9))
	}
	var fp strings.Builder
	for k := 0; k < scale/9; k++ {
		fp.WriteString(group(4, 9))
	}
	if rest := scale % 9; rest > 0 {
		fp.WriteString(group(decimalDigitBytes[rest], rest))
	}
	is := strings.TrimLeft(ip.String(), "0")
	if is == "" {
		is = "0"
	}
	out := is
	if scale > 0 {
		out += "." + fp.String()
	}
	if neg {
		out = "-" + out
	}
	return out, nil
}

// formatJSONDouble prints a double with the shortest digits that read back
// as the same value (what MySQL's my_gcvt prints), keeping it a double.
func formatJSONDouble(f float64) string {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "null" // MySQL cannot store them in JSON
	}
	abs := math.Abs(f)
	if abs != 0 && (abs < 1e-5 || abs >= 1e15) {
		s := strconv.FormatFloat(f, 'e', -1, 64) // 1e+300, 1.5e-07
		mant, exp, _ := strings.Cut(s, "e")
		neg := strings.HasPrefix(exp, "-")
		exp = strings.TrimLeft(strings.TrimLeft(exp, "+-"), "0")
		if neg {
			exp = "-" + exp
		}
		return mant + "e" + exp
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}

// writeJSONString writes s as a JSON string as MySQL escapes it: quote,
// backslash and control characters; other bytes as they are.
func writeJSONString(b *bytes.Buffer, s []byte) {
	const hexdigits = "0123456789abcdef"
	b.WriteByte('"')
	for _, c := range s {
		switch {
		case c == '"':
			b.WriteString(`\"`)
		case c == '\\':
			b.WriteString(`\\`)
		case c == '\b':
			b.WriteString(`\b`)
		case c == '\f':
			b.WriteString(`\f`)
		case c == '\n':
			b.WriteString(`\n`)
		case c == '\r':
			b.WriteString(`\r`)
		case c == '\t':
			b.WriteString(`\t`)
		case c < 0x20:
			b.WriteString(`\u00`)
			b.WriteByte(hexdigits[c>>4])
			b.WriteByte(hexdigits[c&0xf])
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}
