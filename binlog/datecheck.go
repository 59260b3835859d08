package binlog

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
)

// Invalid DATETIME values and go-mysql's ParseTime.
//
// With ParseTime, go-mysql decodes a DATETIME into a time.Time built by
// time.Date, which silently normalizes a date that does not exist: a
// '2026-02-30 10:00:00' stored under ALLOW_INVALID_DATES would arrive as
// 2026-03-02. Without ParseTime every DATETIME and TIMESTAMP is formatted
// with fmt.Sprintf or time.Format and parsed back — measured at a fifth of
// the decoder's time on a table with two temporal columns.
//
// So the tailer decodes with ParseTime and checks: decodeRows (go-mysql's
// RowsEventDecodeFunc) decodes the event as go-mysql would, then, for a
// table with DATETIME columns, walks the row images once more — lengths
// only, no allocation — and replaces every DATETIME whose raw day, hour,
// minute or second is out of range with the text go-mysql gives without
// ParseTime. convDateTime rejects that text naming the column, exactly as
// before. If the walk cannot account for the event's bytes (a format it
// does not know), the event's DATETIME values are replaced by
// uncheckedDateTime and the table is quarantined rather than risk a
// shifted date.

// uncheckedDateTime stands for a DATETIME value the tailer could not check.
type uncheckedDateTime struct{}

// uncheckedJSON stands for a MySQL JSON value the tailer could not render
// exactly (the row walk did not match the event): its table is quarantined.
type uncheckedJSON struct{}

// uncheckedJSONText prefixes the text of a MySQL JSON value that failed to
// decode: convJSON rejects it with the reason, naming the column.
const uncheckedJSONText = "\x00unchecked JSON: "

func hasJSON(t *replication.TableMapEvent) bool {
	for _, tp := range t.ColumnType {
		if tp == mysql.MYSQL_TYPE_JSON {
			return true
		}
	}
	return false
}

// decodeRows decodes a rows event and checks its DATETIME values. The rows
// of a table skip reports true for are not decoded at all (e.Rows stays
// empty): the tailer drops them anyway.
func decodeRows(e *replication.RowsEvent, data []byte, skip func(*replication.TableMapEvent) bool) error {
	pos, err := e.DecodeHeader(data)
	if err != nil {
		return err
	}
	if e.Table != nil && skip != nil && skip(e.Table) {
		return nil
	}
	if err := e.DecodeData(pos, data); err != nil {
		return err
	}
	if e.Table == nil || !(hasDateTime(e.Table) || hasJSON(e.Table)) {
		return nil
	}
	body := data[pos:]
	if checkDateTimes(e, body) {
		return nil
	}
	// A MariaDB compressed rows event: DecodeData decompressed it.
	if raw, err := mysql.DecompressMariadbData(body); err == nil && checkDateTimes(e, raw) {
		return nil
	}
	for _, row := range e.Rows {
		for i := range row {
			if i < len(e.Table.ColumnType) && isDateTimeType(e.Table.ColumnType[i]) {
				if _, ok := row[i].(time.Time); ok {
					row[i] = uncheckedDateTime{}
				}
			}
			if i < len(e.Table.ColumnType) && e.Table.ColumnType[i] == mysql.MYSQL_TYPE_JSON && row[i] != nil {
				row[i] = uncheckedJSON{}
			}
		}
	}
	return nil
}

func isDateTimeType(tp byte) bool {
	return tp == mysql.MYSQL_TYPE_DATETIME2 || tp == mysql.MYSQL_TYPE_DATETIME
}

func hasDateTime(t *replication.TableMapEvent) bool {
	for _, tp := range t.ColumnType {
		if isDateTimeType(tp) {
			return true
		}
	}
	return false
}

// dateFix is one decoded value to replace with its raw text.
type dateFix struct {
	row, col int
	text     string
}

// checkDateTimes walks the row images in body and replaces the invalid
// DATETIMEs in e.Rows. It reports false, changing nothing, when the walk
// does not match the decoded rows.
func checkDateTimes(e *replication.RowsEvent, body []byte) bool {
	t := e.Table
	ncols := int(e.ColumnCount)
	if ncols > len(t.ColumnType) || ncols > len(t.ColumnMeta) {
		return false
	}
	var fixes []dateFix
	pos, img := 0, 0
	for pos < len(body) {
		for _, bitmap := range [2][]byte{e.ColumnBitmap1, e.ColumnBitmap2} {
			if bitmap == nil {
				continue
			}
			if img >= len(e.Rows) {
				return false
			}
			n, ok := walkImage(t, body[pos:], bitmap, ncols, img, &fixes)
			if !ok {
				return false
			}
			pos += n
			img++
		}
	}
	if pos != len(body) || img != len(e.Rows) {
		return false
	}
	for _, f := range fixes {
		e.Rows[f.row][f.col] = f.text
	}
	return true
}

// walkImage walks one row image, recording invalid DATETIMEs of row img.
func walkImage(t *replication.TableMapEvent, data, bitmap []byte, ncols, img int, fixes *[]dateFix) (int, bool) {
	if len(bitmap)*8 < ncols {
		return 0, false
	}
	present := 0
	for i := 0; i < ncols; i++ {
		if bitmap[i>>3]&(1<<(uint(i)&7)) != 0 {
			present++
		}
	}
	nb := (present + 7) / 8
	if len(data) < nb {
		return 0, false
	}
	nulls := data[:nb]
	pos, ni := nb, 0
	for i := 0; i < ncols; i++ {
		if bitmap[i>>3]&(1<<(uint(i)&7)) == 0 {
			continue
		}
		isNull := nulls[ni>>3]&(1<<(uint(ni)&7)) != 0
		ni++
		if isNull {
			continue
		}
		tp, meta := t.ColumnType[i], t.ColumnMeta[i]
		n, ok := valueLen(data[pos:], tp, meta)
		if !ok || pos+n > len(data) {
			return 0, false
		}
		if isDateTimeType(tp) {
			if text, bad := invalidDateTime(data[pos:pos+n], tp, meta); bad {
				*fixes = append(*fixes, dateFix{row: img, col: i, text: text})
			}
		}
		if tp == mysql.MYSQL_TYPE_JSON {
			// MySQL's binary JSON, rendered exactly (mysqljson.go).
			lb := int(meta)
			if lb < 1 || lb > 4 || n < lb {
				return 0, false
			}
			text, err := renderMySQLJSON(data[pos+lb : pos+n])
			if err != nil {
				text = uncheckedJSONText + err.Error()
			}
			*fixes = append(*fixes, dateFix{row: img, col: i, text: text})
		}
		pos += n
	}
	return pos, true
}

// decimalDigitBytes is the bytes of a DECIMAL's partial group of 0–8 digits.
var decimalDigitBytes = [10]int{0, 1, 1, 2, 2, 3, 3, 4, 4, 4}

// valueLen returns the binlog length of a value of type tp with metadata
// meta, as go-mysql's decodeValue reads it.
func valueLen(data []byte, tp byte, meta uint16) (int, bool) {
	strLen := 0
	if tp == mysql.MYSQL_TYPE_STRING {
		if meta >= 256 {
			b0, b1 := uint8(meta>>8), uint8(meta&0xFF)
			if b0&0x30 != 0x30 {
				strLen = int(uint16(b1) | (uint16((b0&0x30)^0x30) << 4))
				tp = b0 | 0x30
			} else {
				strLen = int(meta & 0xFF)
				tp = b0
			}
		} else {
			strLen = int(meta)
		}
	}
	prefixed := func(bytes int) (int, bool) {
		if bytes < 1 || bytes > 4 || len(data) < bytes {
			return 0, false
		}
		l := 0
		for k := bytes - 1; k >= 0; k-- {
			l = l<<8 | int(data[k])
		}
		return bytes + l, true
	}
	switch tp {
	case mysql.MYSQL_TYPE_NULL:
		return 0, true
	case mysql.MYSQL_TYPE_TINY, mysql.MYSQL_TYPE_YEAR:
		return 1, true
	case mysql.MYSQL_TYPE_SHORT:
		return 2, true
	case mysql.MYSQL_TYPE_INT24, mysql.MYSQL_TYPE_DATE, mysql.MYSQL_TYPE_TIME:
		return 3, true
	case mysql.MYSQL_TYPE_LONG, mysql.MYSQL_TYPE_FLOAT, mysql.MYSQL_TYPE_TIMESTAMP:
		return 4, true
	case mysql.MYSQL_TYPE_LONGLONG, mysql.MYSQL_TYPE_DOUBLE, mysql.MYSQL_TYPE_DATETIME:
		return 8, true
	case mysql.MYSQL_TYPE_NEWDECIMAL:
		prec, scale := int(meta>>8), int(meta&0xFF)
		if scale > prec {
			return 0, false
		}
		integral := prec - scale
		return integral/9*4 + decimalDigitBytes[integral%9] + scale/9*4 + decimalDigitBytes[scale%9], true
	case mysql.MYSQL_TYPE_BIT:
		nbits := int(meta>>8)*8 + int(meta&0xFF)
		return (nbits + 7) / 8, true
	case mysql.MYSQL_TYPE_TIMESTAMP2:
		return 4 + int(meta+1)/2, true
	case mysql.MYSQL_TYPE_DATETIME2:
		return 5 + int(meta+1)/2, true
	case mysql.MYSQL_TYPE_TIME2:
		return 3 + int(meta+1)/2, true
	case mysql.MYSQL_TYPE_ENUM:
		if l := int(meta & 0xFF); l == 1 || l == 2 {
			return l, true
		}
		return 0, false
	case mysql.MYSQL_TYPE_SET:
		return int(meta & 0xFF), true
	case mysql.MYSQL_TYPE_BLOB, mysql.MYSQL_TYPE_GEOMETRY, mysql.MYSQL_TYPE_VECTOR, mysql.MYSQL_TYPE_JSON:
		return prefixed(int(meta))
	case mysql.MYSQL_TYPE_VARCHAR, mysql.MYSQL_TYPE_VAR_STRING:
		strLen = int(meta)
		fallthrough
	case mysql.MYSQL_TYPE_STRING:
		if strLen < 256 {
			return prefixed(1)
		}
		return prefixed(2)
	}
	return 0, false
}

func daysIn(month, year int) int {
	return time.Date(year, time.Month(month)+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// invalidDateTime reports whether go-mysql's ParseTime would have built a
// time.Time from a DATETIME whose fields are out of range, and returns the
// text go-mysql gives without ParseTime.
func invalidDateTime(v []byte, tp byte, meta uint16) (string, bool) {
	var year, month, day, hour, minute, second, frac int
	dec := 0
	switch tp {
	case mysql.MYSQL_TYPE_DATETIME2:
		if len(v) < 5 {
			return "", false
		}
		intPart := int64(mysql.BFixedLengthInt(v[0:5])) - 0x8000000000
		// go-mysql returns text (no time.Date) for zero, for dates
		// before 1970 and for a zero month or day.
		if intPart < 107420450816 {
			return "", false
		}
		dec = int(meta)
		switch dec {
		case 1, 2:
			frac = int(v[5]) * 10000
		case 3, 4:
			frac = int(binary.BigEndian.Uint16(v[5:7])) * 100
		case 5, 6:
			frac = int(mysql.BFixedLengthInt(v[5:8]))
		}
		ymdhms := intPart
		ymd := ymdhms >> 17
		ym := ymd >> 5
		hms := ymdhms % (1 << 17)
		day, month, year = int(ymd%(1<<5)), int(ym%13), int(ym/13)
		second, minute, hour = int(hms%(1<<6)), int((hms>>6)%(1<<6)), int(hms>>12)
	case mysql.MYSQL_TYPE_DATETIME:
		if len(v) < 8 {
			return "", false
		}
		i64 := binary.LittleEndian.Uint64(v)
		if i64 == 0 {
			return "", false
		}
		d, t := i64/1000000, i64%1000000
		year, month, day = int(d/10000), int(d%10000)/100, int(d%100)
		hour, minute, second = int(t/10000), int(t%10000)/100, int(t%100)
	default:
		return "", false
	}
	if month == 0 || day == 0 {
		return "", false // text already
	}
	if month <= 12 && day <= daysIn(month, year) && hour <= 23 && minute <= 59 && second <= 59 {
		return "", false
	}
	s := fmt.Sprintf("%04d-%02d-%02d %02d:%02d:%02d", year, month, day, hour, minute, second)
	if dec > 0 {
		s += fmt.Sprintf(".%06d", frac)[:dec+1]
	}
	return s, true
}

// rowFilter says which tables' rows go undecoded: those the config does not
// include. It caches the answer per table and is used by go-mysql's decode
// goroutine alone.
type rowFilter struct {
	cfg     *Config
	lastTbl *replication.TableMapEvent
	last    bool
	known   map[string]bool
}

func (f *rowFilter) skip(tm *replication.TableMapEvent) bool {
	if tm == f.lastTbl {
		return f.last
	}
	name := string(tm.Schema) + "." + string(tm.Table)
	in, ok := f.known[name]
	if !ok {
		in = f.cfg.included(string(tm.Schema), string(tm.Table))
		if f.known == nil || len(f.known) > 4096 {
			f.known = map[string]bool{}
		}
		f.known[name] = in
	}
	f.lastTbl, f.last = tm, !in
	return !in
}
