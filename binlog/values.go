package binlog

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"tidemark"
)

// converter turns one go-mysql decoded value into its tidemark
// representation (see tidemark.Kind). nil stays nil.
type converter func(v any) (any, error)

// Stats counts what the tailer saw. Safe for concurrent reads.
type Stats struct {
	// ZeroDates counts zero dates turned into NULL.
	ZeroDates atomic.Uint64
	// Changes counts row changes emitted.
	Changes atomic.Uint64
	// Transactions counts committed transactions seen.
	Transactions atomic.Uint64
	// Reconnects counts reconnects after transient errors.
	Reconnects atomic.Uint64
	// SchemaReads counts the information_schema reads made for table
	// maps (a table's indexes, its JSON columns).
	SchemaReads atomic.Uint64
}

type valueEnv struct {
	table     tidemark.TableID
	column    string
	zone      tidemark.ZonePolicy
	zeroDates string
	stats     *Stats
	// injective names why the column's values must stay distinct ("key",
	// "unique index"; "" for other columns): a DATETIME in a DST gap is
	// then refused whatever the gap policy (convDateTime).
	injective string
	span      *tidemark.ZoneSpan // ToUTCIn's cache for the column's DATETIMEs (nil: none)
}

// injective is valueEnv.injective of a column.
func injective(key, unique bool) string {
	switch {
	case key:
		return "key"
	case unique:
		return "unique index"
	}
	return ""
}

func (e *valueEnv) errf(format string, args ...any) error {
	return &tidemark.ValueError{Table: e.table, Column: e.column, Detail: fmt.Sprintf(format, args...)}
}

func (e *valueEnv) wrap(detail string, err error) error {
	return &tidemark.ValueError{Table: e.table, Column: e.column, Detail: detail, Err: err}
}

func (e *valueEnv) zero() (any, error) {
	if e.zeroDates == ZeroDateError {
		return nil, e.wrap("zero date with zero_dates=error", tidemark.ErrZeroDate)
	}
	e.stats.ZeroDates.Add(1)
	return nil, nil
}

func toInt64(v any) (int64, bool) {
	switch x := v.(type) {
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case int:
		return int64(x), true
	}
	return 0, false
}

func toUint64(v any) (uint64, bool) {
	switch x := v.(type) {
	case uint8:
		return uint64(x), true
	case uint16:
		return uint64(x), true
	case uint32:
		return uint64(x), true
	case uint64:
		return x, true
	case int64:
		if x >= 0 {
			return uint64(x), true
		}
	case int32:
		if x >= 0 {
			return uint64(x), true
		}
	}
	return 0, false
}

func (e *valueEnv) convInt(v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	if _, ok := v.(int64); ok {
		return v, nil // already boxed: no new allocation
	}
	if n, ok := toInt64(v); ok {
		return n, nil
	}
	return nil, e.errf("want a signed integer, got %T", v)
}

func (e *valueEnv) convUint(v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	if _, ok := v.(uint64); ok {
		return v, nil
	}
	if n, ok := toUint64(v); ok {
		return n, nil
	}
	return nil, e.errf("want an unsigned integer, got %T", v)
}

func (e *valueEnv) convDecimal(v any) (any, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case string:
		if !validDecimal(x) {
			return nil, e.errf("malformed decimal")
		}
		return tidemark.Decimal(x), nil
	}
	return nil, e.errf("want a decimal string, got %T", v)
}

// decimalBytes is convDecimal for an SQL read's bytes (readTable.bconv).
func (e *valueEnv) decimalBytes(b []byte) (any, error) {
	if !validDecimal(b) {
		return nil, e.errf("malformed decimal")
	}
	return tidemark.Decimal(b), nil
}

func validDecimal[T string | []byte](s T) bool {
	if len(s) == 0 {
		return false
	}
	if s[0] == '-' {
		s = s[1:]
	}
	dot := false
	digits := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			digits++
		case c == '.' && !dot:
			dot = true
		default:
			return false
		}
	}
	return digits > 0
}

func (e *valueEnv) convFloat(v any) (any, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case float32:
		return x, nil
	case float64:
		// SQL reads return FLOAT as float64 parsed from the server's text.
		return float32(x), nil
	}
	return nil, e.errf("want float32, got %T", v)
}

func (e *valueEnv) convDouble(v any) (any, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case float64:
		return v, nil
	case float32:
		return float64(x), nil
	}
	return nil, e.errf("want float64, got %T", v)
}

// convText returns a valid UTF-8 string: the bytes decoded from the
// column's character set by dec (charsets.go), or checked to be UTF-8 when
// dec is nil.
func (e *valueEnv) convText(dec textDecoder) converter {
	return func(v any) (any, error) {
		var s string
		boxed := false
		switch x := v.(type) {
		case nil:
			return nil, nil
		case string:
			s, boxed = x, true
		case []byte:
			s = string(x)
		default:
			return nil, e.errf("want text, got %T", v)
		}
		if dec != nil {
			out, err := dec(s)
			if err != nil {
				return nil, e.wrap("text has bytes its character set does not define", err)
			}
			return out, nil
		}
		if !utf8.ValidString(s) {
			return nil, e.errf("text is not valid UTF-8 (check the column's character set)")
		}
		if boxed {
			return v, nil // the decoder's string, already boxed
		}
		return s, nil
	}
}

func (e *valueEnv) convBytes(v any) (any, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case []byte:
		return append([]byte(nil), x...), nil
	case string:
		return []byte(x), nil
	}
	return nil, e.errf("want bytes, got %T", v)
}

// convBinary returns a BINARY(n) value padded to its n bytes with 0x00, as
// the column stores it: the binlog image omits the trailing pad bytes (and
// an SQL read returns all n).
func (e *valueEnv) convBinary(n int) converter {
	return func(v any) (any, error) {
		x, err := e.convBytes(v)
		if b, ok := x.([]byte); ok && len(b) < n {
			x = append(b, make([]byte, n-len(b))...)
		}
		return x, err
	}
}

func (e *valueEnv) convBit(v any) (any, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case int64:
		return uint64(x), nil
	}
	if n, ok := toUint64(v); ok {
		return n, nil
	}
	return nil, e.errf("want bit value, got %T", v)
}

func (e *valueEnv) convYear(v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	if n, ok := toInt64(v); ok {
		return n, nil
	}
	if n, ok := v.(uint64); ok && n < 1<<16 {
		return int64(n), nil
	}
	return nil, e.errf("want year, got %T", v)
}

func (e *valueEnv) convEnum(names []string) converter {
	return func(v any) (any, error) {
		if v == nil {
			return nil, nil
		}
		n, ok := toInt64(v)
		if !ok {
			return nil, e.errf("want enum index, got %T", v)
		}
		if n == 0 {
			return "", nil // MySQL's invalid-value member
		}
		if names == nil || int(n) > len(names) {
			return nil, e.errf("enum index %d has no member name (binlog_row_metadata=FULL sends them)", n)
		}
		return names[n-1], nil
	}
}

func (e *valueEnv) convSet(names []string) converter {
	return func(v any) (any, error) {
		if v == nil {
			return nil, nil
		}
		n, ok := toInt64(v)
		if !ok {
			return nil, e.errf("want set bitmap, got %T", v)
		}
		var parts []string
		for i := 0; i < 64; i++ {
			if uint64(n)&(1<<uint(i)) == 0 {
				continue
			}
			if names == nil || i >= len(names) {
				return nil, e.errf("set bit %d has no member name (binlog_row_metadata=FULL sends them)", i)
			}
			parts = append(parts, names[i])
		}
		return strings.Join(parts, ","), nil
	}
}

func (e *valueEnv) convJSON(v any) (any, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case string:
		if x == "" {
			return tidemark.JSON("null"), nil
		}
		if strings.HasPrefix(x, uncheckedJSONText) {
			return nil, e.errf("cannot decode this MySQL JSON value: %s", x[len(uncheckedJSONText):])
		}
		return tidemark.JSON(x), nil
	case uncheckedJSON:
		return nil, e.errf("cannot render this MySQL JSON value exactly: the rows event's format was not recognized (see binlog/datecheck.go)")
	case []byte:
		if len(x) == 0 {
			return tidemark.JSON("null"), nil
		}
		if !utf8.Valid(x) {
			return nil, e.errf("JSON text is not valid UTF-8")
		}
		return tidemark.JSON(string(x)), nil
	}
	return nil, e.errf("want JSON text, got %T", v)
}

// parseCivil parses "YYYY-MM-DD[ HH:MM:SS[.ffffff]]" into its fields. zero
// reports a zero date (year, month or day 0). s is the text of a binlog
// value or an SQL read's bytes (readTable.bconv: no string made of them).
func parseCivil[T string | []byte](s T) (t time.Time, zero bool, err error) {
	if len(s) < 10 || s[4] != '-' || s[7] != '-' {
		return time.Time{}, false, fmt.Errorf("malformed date %q", string(s))
	}
	y, ok1 := civilDigits(s[0:4])
	mo, ok2 := civilDigits(s[5:7])
	d, ok3 := civilDigits(s[8:10])
	if !ok1 || !ok2 || !ok3 {
		return time.Time{}, false, fmt.Errorf("malformed date %q", string(s))
	}
	var h, mi, sec, ns int
	if len(s) > 10 {
		rest := s[10:]
		if len(rest) < 9 || rest[0] != ' ' || rest[3] != ':' || rest[6] != ':' {
			return time.Time{}, false, fmt.Errorf("malformed datetime %q", string(s))
		}
		var ok1, ok2, ok3 bool
		h, ok1 = civilDigits(rest[1:3])
		mi, ok2 = civilDigits(rest[4:6])
		sec, ok3 = civilDigits(rest[7:9])
		if !ok1 || !ok2 || !ok3 {
			return time.Time{}, false, fmt.Errorf("malformed datetime %q", string(s))
		}
		if len(rest) > 9 {
			if rest[9] != '.' || len(rest) > 16 {
				return time.Time{}, false, fmt.Errorf("malformed fraction in %q", string(s))
			}
			frac := rest[10:]
			f, ok := civilDigits(frac)
			if !ok {
				return time.Time{}, false, fmt.Errorf("malformed fraction in %q", string(s))
			}
			for i := len(frac); i < 9; i++ {
				f *= 10
			}
			ns = f
		}
	}
	if y == 0 || mo == 0 || d == 0 {
		return time.Time{}, true, nil
	}
	if mo > 12 || d > 31 || h > 23 || mi > 59 || sec > 59 {
		return time.Time{}, false, fmt.Errorf("out-of-range date/time %q", string(s))
	}
	t = time.Date(y, time.Month(mo), d, h, mi, sec, ns, time.UTC)
	if t.Day() != d {
		return time.Time{}, false, fmt.Errorf("nonexistent date %q", string(s))
	}
	return t, false, nil
}

// civilDigits parses a field of parseCivil: one or more ASCII digits (at
// most 9, as a fraction of a second has).
func civilDigits[T string | []byte](s T) (int, bool) {
	if len(s) == 0 || len(s) > 9 {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

func (e *valueEnv) convDate(v any) (any, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case string:
		t, zero, err := parseCivil(x)
		if err != nil {
			return nil, e.wrap("parse DATE", err)
		}
		if zero {
			return e.zero()
		}
		return t, nil
	case time.Time:
		y, m, d := x.Date()
		return time.Date(y, m, d, 0, 0, 0, 0, time.UTC), nil
	}
	return nil, e.errf("want DATE, got %T", v)
}

// convDateTime interprets a DATETIME (zone-less wall clock) in the column's
// source zone: a time.Time labelled UTC carrying the wall digits (go-mysql's
// ParseTime), or text — from SQL reads, for dates before 1970, and for an
// invalid date, which decodeRows hands on as text so that it is an error
// here rather than a silently normalized date.
func (e *valueEnv) convDateTime(v any) (any, error) {
	var wall time.Time
	switch x := v.(type) {
	case nil:
		return nil, nil
	case time.Time:
		wall = x
	case string:
		return dateTimeText(e, x)
	case uncheckedDateTime:
		return nil, e.errf("cannot check this DATETIME for an invalid date: the rows event's format was not recognized (see binlog/datecheck.go)")
	default:
		return nil, e.errf("want DATETIME, got %T", v)
	}
	return e.dateTimeWall(wall)
}

// dateTimeText is convDateTime of a DATETIME's text: a binlog value's, or
// an SQL read's bytes (readTable.bconv).
func dateTimeText[T string | []byte](e *valueEnv, s T) (any, error) {
	wall, zero, err := parseCivil(s)
	if err != nil {
		return nil, e.wrap("parse DATETIME", err)
	}
	if zero {
		return e.zero()
	}
	return e.dateTimeWall(wall)
}

// dateTimeWall is convDateTime of a DATETIME's wall clock digits.
func (e *valueEnv) dateTimeWall(wall time.Time) (any, error) {
	z := e.zone
	if e.injective != "" {
		// The gap policies "later" and "earlier" map a local time the
		// clocks skipped onto the instant of another local time (02:30 and
		// 03:30 on spring-forward day in New York are both 07:30Z with
		// "later"): two source keys would become one target row. A key
		// column refuses the gap instead (a fold is no collision: each
		// local reading still maps to one instant of its own).
		z.Gap = tidemark.ResolveError
	}
	t, err := z.ToUTCIn(wall, e.span)
	if err != nil {
		if e.injective != "" && e.zone.Gap != tidemark.ResolveError && errors.Is(err, tidemark.ErrNonexistentTime) {
			return nil, e.wrap(fmt.Sprintf("%s column value %s is in a DST gap of %s (a local time the clocks skipped): the gap policy %q would map it onto the instant of another local time, "+
				"so two distinct source values could become one; refused for key and unique columns", e.injective, wall.Format("2006-01-02 15:04:05.999999"), zoneName(e.zone), e.zone.Gap), err)
		}
		return nil, e.wrap("normalize DATETIME to UTC", err)
	}
	return t, nil
}

func zoneName(z tidemark.ZonePolicy) string {
	if z.Location == nil {
		return "UTC"
	}
	return z.Location.String()
}

// convTimestamp returns the UTC instant of a TIMESTAMP. With ParseTime
// go-mysql returns a time.Time holding the right instant (labelled with the
// daemon's local zone, which .UTC() discards); zero is a string.
func (e *valueEnv) convTimestamp(v any) (any, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case time.Time:
		return x.UTC(), nil
	case string:
		// Zero from the binlog, or text from an SQL read in a session at
		// time_zone +00:00.
		return timestampText(e, x)
	}
	return nil, e.errf("want TIMESTAMP, got %T", v)
}

// timestampText is convTimestamp of a TIMESTAMP's text: a binlog value's,
// or an SQL read's bytes (readTable.bconv).
func timestampText[T string | []byte](e *valueEnv, s T) (any, error) {
	t, zero, err := parseCivil(s)
	if err != nil {
		return nil, e.wrap("parse TIMESTAMP", err)
	}
	if zero {
		return e.zero()
	}
	return t, nil
}

// parseTimeOfDay parses MySQL TIME text "[-]HHH:MM:SS[.ffffff]".
func parseTimeOfDay(s string) (time.Duration, error) {
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	parts := strings.SplitN(s, ":", 3)
	if len(parts) != 3 {
		return 0, fmt.Errorf("malformed TIME %q", s)
	}
	h, err1 := strconv.Atoi(parts[0])
	m, err2 := strconv.Atoi(parts[1])
	secPart, fracPart, _ := strings.Cut(parts[2], ".")
	sec, err3 := strconv.Atoi(secPart)
	if err1 != nil || err2 != nil || err3 != nil || m > 59 || sec > 59 || h > 838 {
		return 0, fmt.Errorf("malformed TIME %q", s)
	}
	var us int
	if fracPart != "" {
		if len(fracPart) > 6 {
			return 0, fmt.Errorf("malformed TIME fraction %q", s)
		}
		f, err := strconv.Atoi(fracPart)
		if err != nil {
			return 0, fmt.Errorf("malformed TIME fraction %q", s)
		}
		for i := len(fracPart); i < 6; i++ {
			f *= 10
		}
		us = f
	}
	d := time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + time.Duration(sec)*time.Second + time.Duration(us)*time.Microsecond
	if neg {
		d = -d
	}
	return d, nil
}

func (e *valueEnv) convTime(v any) (any, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case string:
		d, err := parseTimeOfDay(x)
		if err != nil {
			return nil, e.wrap("parse TIME", err)
		}
		return d, nil
	}
	return nil, e.errf("want TIME text, got %T", v)
}

// valueSize estimates the memory of a converted value.
func valueSize(v any) int {
	switch x := v.(type) {
	case string:
		return 16 + len(x)
	case []byte:
		return 24 + len(x)
	case tidemark.JSON:
		return 16 + len(x)
	case tidemark.Decimal:
		return 16 + len(x)
	case time.Time:
		return 24
	}
	return 16
}

// cp1252 high half: MySQL's latin1 is Windows-1252 (0x80–0x9F are printable;
// the five undefined bytes map to the C1 controls like MySQL does).
var cp1252 = [32]rune{
	0x20AC, 0x0081, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021,
	0x02C6, 0x2030, 0x0160, 0x2039, 0x0152, 0x008D, 0x017D, 0x008F,
	0x0090, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014,
	0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x009D, 0x017E, 0x0178,
}

func decodeCP1252(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			ascii = false
			break
		}
	}
	if ascii {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) * 2)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c < 0x80:
			b.WriteByte(c)
		case c < 0xA0:
			b.WriteRune(cp1252[c-0x80])
		default:
			b.WriteRune(rune(c))
		}
	}
	return b.String()
}

// convFor returns the converter of a column of kind k that needs nothing
// but its kind, shared by the tailer (table maps) and the reader (SQL
// results); nil for ENUM, SET and text, whose converters need the table
// map's members or the column's collation (each path chooses those).
// bytesConv returns, for the kinds whose SQL read values arrive as bytes,
// the converter an SQL read (Reader.Read) applies to them: what convFor's
// converter (for text: convText(nil)) does with the same bytes, without
// boxing them first or making a string to parse. nil for the other kinds.
// What it returns never points into b.
func (e *valueEnv) bytesConv(k tidemark.Kind) func([]byte) (any, error) {
	switch k {
	case tidemark.KindDecimal:
		return e.decimalBytes
	case tidemark.KindDateTime:
		return func(b []byte) (any, error) { return dateTimeText(e, b) }
	case tidemark.KindTimestamp:
		return func(b []byte) (any, error) { return timestampText(e, b) }
	case tidemark.KindText:
		return func(b []byte) (any, error) {
			if !utf8.Valid(b) {
				return nil, e.errf("text is not valid UTF-8 (check the column's character set)")
			}
			return string(b), nil
		}
	case tidemark.KindJSON:
		return func(b []byte) (any, error) { return e.convJSON(b) }
	case tidemark.KindBytes:
		return func(b []byte) (any, error) { return append([]byte(nil), b...), nil }
	}
	return nil
}

func (e *valueEnv) convFor(k tidemark.Kind) converter {
	switch k {
	case tidemark.KindInt:
		return e.convInt
	case tidemark.KindUint:
		return e.convUint
	case tidemark.KindDecimal:
		return e.convDecimal
	case tidemark.KindFloat:
		return e.convFloat
	case tidemark.KindDouble:
		return e.convDouble
	case tidemark.KindBit:
		return e.convBit
	case tidemark.KindYear:
		return e.convYear
	case tidemark.KindDate:
		return e.convDate
	case tidemark.KindTime:
		return e.convTime
	case tidemark.KindDateTime:
		return e.convDateTime
	case tidemark.KindTimestamp:
		return e.convTimestamp
	case tidemark.KindJSON:
		return e.convJSON
	case tidemark.KindBytes:
		return e.convBytes
	}
	return nil
}
