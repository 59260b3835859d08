package tidemark

// Valid reports whether j is one JSON value (RFC 8259, surrounded by
// optional whitespace), exactly as encoding/json.Valid does, including its
// nesting limit of 10,000 and its acceptance of any bytes ≥ 0x20 inside
// strings. It is a plain loop over the bytes: encoding/json.Valid, a state
// machine with a call per byte, was a tenth of a snapshot's CPU in the
// sinks, which check every JSON value before PostgreSQL or a Kafka record
// gets it. FuzzJSONValid compares the two.
func (j JSON) Valid() bool {
	v := jsonValidator{s: string(j)}
	v.space()
	if !v.value(0) {
		return false
	}
	v.space()
	return v.i == len(v.s)
}

// jsonMaxDepth is encoding/json's maxNestingDepth.
const jsonMaxDepth = 10000

type jsonValidator struct {
	s string
	i int
}

func (v *jsonValidator) space() {
	for v.i < len(v.s) {
		switch v.s[v.i] {
		case ' ', '\t', '\n', '\r':
			v.i++
		default:
			return
		}
	}
}

// value checks the value at v.i (no leading whitespace), depth being the
// number of arrays and objects it is inside.
func (v *jsonValidator) value(depth int) bool {
	if v.i >= len(v.s) {
		return false
	}
	switch c := v.s[v.i]; {
	case c == '{':
		return v.object(depth + 1)
	case c == '[':
		return v.array(depth + 1)
	case c == '"':
		return v.str()
	case c == '-' || c >= '0' && c <= '9':
		return v.number()
	case c == 't':
		return v.word("true")
	case c == 'f':
		return v.word("false")
	case c == 'n':
		return v.word("null")
	}
	return false
}

func (v *jsonValidator) word(w string) bool {
	if len(v.s)-v.i < len(w) || v.s[v.i:v.i+len(w)] != w {
		return false
	}
	v.i += len(w)
	return true
}

func (v *jsonValidator) object(depth int) bool {
	if depth > jsonMaxDepth {
		return false
	}
	v.i++ // {
	v.space()
	if v.i < len(v.s) && v.s[v.i] == '}' {
		v.i++
		return true
	}
	for {
		if v.i >= len(v.s) || v.s[v.i] != '"' || !v.str() {
			return false
		}
		v.space()
		if v.i >= len(v.s) || v.s[v.i] != ':' {
			return false
		}
		v.i++
		v.space()
		if !v.value(depth) {
			return false
		}
		if done, ok := v.next('}'); done || !ok {
			return ok
		}
	}
}

func (v *jsonValidator) array(depth int) bool {
	if depth > jsonMaxDepth {
		return false
	}
	v.i++ // [
	v.space()
	if v.i < len(v.s) && v.s[v.i] == ']' {
		v.i++
		return true
	}
	for {
		if !v.value(depth) {
			return false
		}
		if done, ok := v.next(']'); done || !ok {
			return ok
		}
	}
}

// next reads what follows a member of an array or object: a comma (another
// member follows; done false) or the closing bracket close (done true).
func (v *jsonValidator) next(close byte) (done, ok bool) {
	v.space()
	if v.i >= len(v.s) {
		return false, false
	}
	switch v.s[v.i] {
	case ',':
		v.i++
		v.space()
		return false, true
	case close:
		v.i++
		return true, true
	}
	return false, false
}

// str checks the string at v.i (its opening quote).
func (v *jsonValidator) str() bool {
	s, i := v.s, v.i+1
	for i < len(s) {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
			continue
		}
		switch {
		case c == '"':
			v.i = i + 1
			return true
		case c < 0x20:
			return false
		}
		// A backslash.
		i++
		if i >= len(s) {
			return false
		}
		switch s[i] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i++
		case 'u':
			if len(s)-i < 5 {
				return false
			}
			for k := i + 1; k < i+5; k++ {
				if h := s[k]; !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
					return false
				}
			}
			i += 5
		default:
			return false
		}
	}
	return false
}

// number checks -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? at v.i.
func (v *jsonValidator) number() bool {
	if v.s[v.i] == '-' {
		v.i++
	}
	if v.i >= len(v.s) {
		return false
	}
	switch c := v.s[v.i]; {
	case c == '0':
		v.i++
	case c >= '1' && c <= '9':
		v.digits()
	default:
		return false
	}
	if v.i < len(v.s) && v.s[v.i] == '.' {
		v.i++
		if v.digits() == 0 {
			return false
		}
	}
	if v.i < len(v.s) && (v.s[v.i] == 'e' || v.s[v.i] == 'E') {
		v.i++
		if v.i < len(v.s) && (v.s[v.i] == '+' || v.s[v.i] == '-') {
			v.i++
		}
		if v.digits() == 0 {
			return false
		}
	}
	return true
}

func (v *jsonValidator) digits() int {
	n := 0
	for v.i < len(v.s) && v.s[v.i] >= '0' && v.s[v.i] <= '9' {
		v.i++
		n++
	}
	return n
}
