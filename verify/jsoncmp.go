package verify

import (
	"bytes"
	"sort"
	"strconv"
	"strings"
)

// jsonComparer decides whether two JSON texts (MariaDB's stored text and
// PostgreSQL's jsonb output) hold the same document. Its fast path
// normalizes both texts into reused buffers — no insignificant space,
// object members sorted by their key text, numbers as digits and an
// exponent — and compares the bytes. The normalization keeps every
// significant character, so equal normal forms mean equal documents. When
// the forms differ (or a text has something the fast path does not
// normalize: a duplicate key, a huge exponent, invalid JSON), the exact,
// slower canonicalJSON decides, so two spellings of one document (string
// escapes such as "\u00e9" and "é") still compare equal.
//
// Not safe for concurrent use: the verify engine compares chunks on one
// goroutine.
type jsonComparer struct {
	a, b jsonNormalizer
}

func (c *jsonComparer) equal(x, y string) bool {
	if x == y {
		return true
	}
	nx, okx := c.a.normalize(x)
	ny, oky := c.b.normalize(y)
	if okx && oky && bytes.Equal(nx, ny) {
		return true
	}
	return canonicalJSON(x) == canonicalJSON(y)
}

// jsonNormalizer holds the buffers of one side's normalization.
type jsonNormalizer struct {
	out     []byte
	members []jsonMember
	tmp     []byte
	s       string
	i       int
	ok      bool
}

// jsonMember is one object member's span in out: key text (with quotes)
// and the member's whole normalized text "key:value".
type jsonMember struct{ keyEnd, start, end int }

// normalize returns the normal form of s and whether the fast path could
// produce it. The slice is valid until the next call.
func (n *jsonNormalizer) normalize(s string) ([]byte, bool) {
	n.out, n.members, n.s, n.i, n.ok = n.out[:0], n.members[:0], s, 0, true
	n.value(0)
	n.space()
	if n.i != len(n.s) {
		n.ok = false
	}
	return n.out, n.ok
}

func (n *jsonNormalizer) space() {
	for n.i < len(n.s) {
		switch n.s[n.i] {
		case ' ', '\t', '\n', '\r':
			n.i++
		default:
			return
		}
	}
}

func (n *jsonNormalizer) value(depth int) {
	n.space()
	if !n.ok || n.i >= len(n.s) || depth > 512 {
		n.ok = false
		return
	}
	switch c := n.s[n.i]; {
	case c == '{':
		n.object(depth)
	case c == '[':
		n.array(depth)
	case c == '"':
		n.str()
	case c == '-' || (c >= '0' && c <= '9'):
		n.number()
	default:
		for _, lit := range [...]string{"true", "false", "null"} {
			if len(n.s)-n.i >= len(lit) && n.s[n.i:n.i+len(lit)] == lit {
				n.out = append(n.out, lit...)
				n.i += len(lit)
				return
			}
		}
		n.ok = false
	}
}

// str copies a string token as written (escapes included).
func (n *jsonNormalizer) str() {
	j := n.i + 1
	for j < len(n.s) {
		switch c := n.s[j]; {
		case c == '\\':
			if j+1 >= len(n.s) || !strings.ContainsRune(`"\/bfnrtu`, rune(n.s[j+1])) {
				n.ok = false
				return
			}
			if n.s[j+1] == 'u' {
				if j+6 > len(n.s) || !isHex4(n.s[j+2:j+6]) {
					n.ok = false
					return
				}
				j += 6
				continue
			}
			j += 2
			continue
		case c < 0x20:
			n.ok = false // a raw control character: invalid JSON
			return
		case c == '"':
			n.out = append(n.out, n.s[n.i:j+1]...)
			n.i = j + 1
			return
		}
		j++
	}
	n.ok = false
}

func (n *jsonNormalizer) array(depth int) {
	n.i++
	n.out = append(n.out, '[')
	n.space()
	if n.i < len(n.s) && n.s[n.i] == ']' {
		n.i++
		n.out = append(n.out, ']')
		return
	}
	for n.ok {
		n.value(depth + 1)
		n.space()
		if n.i >= len(n.s) {
			n.ok = false
			return
		}
		switch n.s[n.i] {
		case ',':
			n.i++
			n.out = append(n.out, ',')
		case ']':
			n.i++
			n.out = append(n.out, ']')
			return
		default:
			n.ok = false
		}
	}
}

func (n *jsonNormalizer) object(depth int) {
	n.i++
	n.out = append(n.out, '{')
	n.space()
	if n.i < len(n.s) && n.s[n.i] == '}' {
		n.i++
		n.out = append(n.out, '}')
		return
	}
	base := len(n.members)
	start := len(n.out)
	for n.ok {
		n.space()
		if n.i >= len(n.s) || n.s[n.i] != '"' {
			n.ok = false
			return
		}
		m := jsonMember{start: len(n.out)}
		n.str()
		m.keyEnd = len(n.out)
		n.space()
		if !n.ok || n.i >= len(n.s) || n.s[n.i] != ':' {
			n.ok = false
			return
		}
		n.i++
		n.out = append(n.out, ':')
		n.value(depth + 1)
		m.end = len(n.out)
		n.members = append(n.members, m)
		n.space()
		if n.i >= len(n.s) {
			n.ok = false
			return
		}
		if n.s[n.i] == ',' {
			n.i++
			continue
		}
		if n.s[n.i] != '}' {
			n.ok = false
			return
		}
		n.i++
		break
	}
	if !n.ok {
		return
	}
	ms := n.members[base:]
	key := func(m jsonMember) []byte { return n.out[m.start:m.keyEnd] }
	sorted := sort.SliceIsSorted(ms, func(i, j int) bool { return bytes.Compare(key(ms[i]), key(ms[j])) < 0 })
	if !sorted {
		sort.Slice(ms, func(i, j int) bool { return bytes.Compare(key(ms[i]), key(ms[j])) < 0 })
	}
	for i := 1; i < len(ms); i++ {
		if bytes.Equal(key(ms[i-1]), key(ms[i])) {
			n.ok = false // a duplicate key: which one counts is the exact path's call
			return
		}
	}
	// Rewrite the members in order, comma-separated, after the '{'.
	n.tmp = n.tmp[:0]
	for i, m := range ms {
		if i > 0 {
			n.tmp = append(n.tmp, ',')
		}
		n.tmp = append(n.tmp, n.out[m.start:m.end]...)
	}
	n.out = append(append(n.out[:start], n.tmp...), '}')
	n.members = n.members[:base]
}

// number writes a JSON number as [-]D[.DDD]e<exp> with no leading or
// trailing zeros in the digits (0 for zero), so 2.50, 2.5 and 25e-1 are
// one text. Exponents beyond ±1e9 leave the fast path.
func (n *jsonNormalizer) number() {
	s, i := n.s, n.i
	neg := s[i] == '-'
	if neg {
		i++
	}
	var digits [64]byte
	d := digits[:0]
	big := false // more digits than the array holds
	exp := 0     // decimal exponent of the last digit kept
	intStart := i
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		if len(d) < cap(d) {
			d = append(d, s[i])
		} else {
			big = true
		}
		i++
	}
	if i == intStart || (s[intStart] == '0' && i-intStart > 1) {
		n.ok = false
		return
	}
	if i < len(s) && s[i] == '.' {
		i++
		fracStart := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			if len(d) < cap(d) {
				d = append(d, s[i])
				exp--
			} else {
				big = true
			}
			i++
		}
		if i == fracStart {
			n.ok = false
			return
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		eneg := false
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			eneg = s[i] == '-'
			i++
		}
		e, expStart := 0, i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			if i-expStart >= 9 {
				n.ok = false
				return
			}
			e = e*10 + int(s[i]-'0')
			i++
		}
		if i == expStart {
			n.ok = false
			return
		}
		if eneg {
			e = -e
		}
		exp += e
	}
	if big {
		n.ok = false
		return
	}
	n.i = i
	// Strip leading zeros (they carry no exponent) and trailing zeros.
	for len(d) > 0 && d[0] == '0' {
		d = d[1:]
	}
	for len(d) > 0 && d[len(d)-1] == '0' {
		d = d[:len(d)-1]
		exp++
	}
	if len(d) == 0 {
		n.out = append(n.out, '0')
		return
	}
	if neg {
		n.out = append(n.out, '-')
	}
	n.out = append(n.out, d...)
	n.out = append(n.out, 'e')
	n.out = strconv.AppendInt(n.out, int64(exp), 10)
}

func isHex4(s string) bool {
	for i := 0; i < 4; i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}
