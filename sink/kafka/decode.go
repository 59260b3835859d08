package kafka

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"tidemark"
)

// A fast decoder of change envelopes for the applier. encoding/json into
// maps cost ~90 allocations and several microseconds per change, more than
// the tailer spends encoding it (BenchmarkDecodeVsEncode). The envelope is
// tidemark's own, written by appendEnvelope in a fixed layout, so the
// decoder scans it in place: it finds each member's raw value, compares a
// row's keys with the column names in order, and converts values without
// reflection (strings without escapes are sliced, not unquoted). Anything
// it does not expect — an escaped key, a duplicate or unknown column,
// malformed JSON — sends the record to the encoding/json decoder
// (decodeChangeJSON), which gives the same result or the canonical error.

// errNotFast says that the fast decoder cannot read a value.
var errNotFast = errors.New("not the layout the fast decoder reads")

// scanner walks one JSON document.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) skipSpace() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// consume reports whether the next non-space byte is c, moving past it.
func (s *scanner) consume(c byte) bool {
	s.skipSpace()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// value returns the raw JSON value at the cursor and moves past it.
// Objects and arrays are matched by depth (strings inside them skipped);
// their contents are checked only when they are read.
func (s *scanner) value() ([]byte, bool) {
	s.skipSpace()
	start := s.i
	if s.i >= len(s.b) {
		return nil, false
	}
	switch c := s.b[s.i]; c {
	case '"':
		end, ok := stringEnd(s.b, s.i)
		if !ok {
			return nil, false
		}
		s.i = end
	case '{', '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				end, ok := stringEnd(s.b, s.i)
				if !ok {
					return nil, false
				}
				s.i = end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			s.i++
			if depth == 0 {
				return s.b[start:s.i], true
			}
		}
		return nil, false
	default:
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return s.b[start:s.i], s.i > start
			}
			s.i++
		}
	}
	return s.b[start:s.i], true
}

// stringEnd returns the index after the string starting at b[i] ('"').
func stringEnd(b []byte, i int) (int, bool) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1, true
		}
	}
	return 0, false
}

// members calls fn with each member of the object at the cursor: its key
// (which must have no escapes) and raw value.
func (s *scanner) members(fn func(key, raw []byte) error) error {
	if !s.consume('{') {
		return errNotFast
	}
	if s.consume('}') {
		return nil
	}
	for {
		s.skipSpace()
		k, ok := s.value()
		if !ok || len(k) < 2 || k[0] != '"' || bytes.IndexByte(k, '\\') >= 0 {
			return errNotFast
		}
		if !s.consume(':') {
			return errNotFast
		}
		raw, ok := s.value()
		if !ok {
			return errNotFast
		}
		if err := fn(k[1:len(k)-1], raw); err != nil {
			return err
		}
		if s.consume(',') {
			continue
		}
		if s.consume('}') {
			return nil
		}
		return errNotFast
	}
}

// plainString returns the contents of a JSON string that needs no
// unquoting (no escapes, no control characters, valid UTF-8).
func plainString(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	in := raw[1 : len(raw)-1]
	for _, c := range in {
		if c < 0x20 || c == '\\' || c == '"' {
			return "", false
		}
	}
	if !utf8.Valid(in) {
		return "", false
	}
	return string(in), true
}

// decodeChange decodes a change envelope written with schema t, the inverse
// of appendEnvelope. Errors name the table and column, never a value.
func decodeChange(value []byte, t *tidemark.Table) (tidemark.Change, error) {
	ch, err := decodeChangeFast(value, t)
	if errors.Is(err, errNotFast) {
		return decodeChangeJSON(value, t)
	}
	return ch, err
}

func decodeChangeFast(value []byte, t *tidemark.Table) (tidemark.Change, error) {
	var (
		op                   tidemark.Op
		opSeen, keyOnly      bool
		before, after, store []byte
	)
	s := scanner{b: value}
	err := s.members(func(key, raw []byte) error {
		switch string(key) {
		case "op":
			code, ok := plainString(raw)
			if !ok {
				return errNotFast
			}
			if op, ok = opByCode[code]; !ok {
				return fmt.Errorf("decode change of %s: unknown op %q", t.ID, code)
			}
			opSeen = true
		case "before":
			before = raw
		case "after":
			after = raw
		case "key_only":
			switch string(raw) {
			case "true":
				keyOnly = true
			case "false", "null":
			default:
				return errNotFast
			}
		case "source":
			store = raw
		}
		return nil
	})
	if err != nil {
		return tidemark.Change{}, err
	}
	if s.skipSpace(); s.i != len(s.b) || !opSeen || store == nil {
		return tidemark.Change{}, errNotFast
	}
	ch := tidemark.Change{Op: op, Table: t, Size: len(value), KeyOnly: keyOnly && op == tidemark.OpDelete}
	var db, table string
	var commit []byte
	src := scanner{b: store}
	err = src.members(func(key, raw []byte) error {
		var ok bool
		switch string(key) {
		case "database":
			db, ok = plainString(raw)
		case "table":
			table, ok = plainString(raw)
		case "commit_time":
			commit, ok = raw, true
		case "seq":
			v, err := strconv.ParseUint(string(raw), 10, 64)
			ch.Version.Seq, ok = v, err == nil
		case "index":
			v, err := strconv.ParseUint(string(raw), 10, 32)
			ch.Version.Index, ok = uint32(v), err == nil
		default:
			ok = true
		}
		if !ok {
			return errNotFast
		}
		return nil
	})
	if err != nil {
		return tidemark.Change{}, err
	}
	if db != t.ID.Database || table != t.ID.Name {
		return tidemark.Change{}, fmt.Errorf("decode change of %s: envelope names table %s.%s", t.ID, db, table)
	}
	if commit != nil && string(commit) != "null" {
		v, ok := plainString(commit)
		if !ok {
			return tidemark.Change{}, errNotFast
		}
		ct, err := parseTimestamp(v)
		if err != nil {
			return tidemark.Change{}, fmt.Errorf("decode change of %s: commit_time: %w", t.ID, err)
		}
		ch.CommitTime = ct
	}
	if ch.Before, err = decodeRowFast(before, t); err != nil {
		return tidemark.Change{}, err
	}
	if ch.After, err = decodeRowFast(after, t); err != nil {
		return tidemark.Change{}, err
	}
	if op == tidemark.OpDelete && ch.Before == nil || op != tidemark.OpDelete && ch.After == nil {
		return tidemark.Change{}, fmt.Errorf("decode change of %s: op %s without its row image", t.ID, headerOp[op])
	}
	return ch, nil
}

// decodeRowFast decodes a row image (nil for a missing or null one).
func decodeRowFast(raw []byte, t *tidemark.Table) ([]any, error) {
	if raw == nil || string(raw) == "null" {
		return nil, nil
	}
	row := make([]any, len(t.Columns))
	n := 0
	s := scanner{b: raw}
	err := s.members(func(key, v []byte) error {
		i := n
		if i >= len(t.Columns) || string(key) != t.Columns[i].Name {
			// Not in column order: a duplicate or unknown name, or
			// another writer. encoding/json sorts it out.
			return errNotFast
		}
		n++
		col := &t.Columns[i]
		val, err := decodeValue(v, col.Kind)
		if err != nil {
			return &tidemark.ValueError{Table: t.ID, Column: col.Name, Detail: err.Error()}
		}
		row[i] = val
		return nil
	})
	if err != nil {
		return nil, err
	}
	if n != len(t.Columns) {
		return nil, errNotFast
	}
	return row, nil
}

// parseTimestamp parses the envelope's timestamps, "2006-01-02T15:04:05.000000Z"
// without time.Parse when it has exactly that layout, and any RFC 3339
// time otherwise; the result is in UTC.
func parseTimestamp(s string) (time.Time, error) {
	if len(s) == 27 && s[4] == '-' && s[7] == '-' && s[10] == 'T' && s[13] == ':' && s[16] == ':' && s[19] == '.' && s[26] == 'Z' {
		num := func(from, to int) (int, bool) {
			v := 0
			for i := from; i < to; i++ {
				c := s[i]
				if c < '0' || c > '9' {
					return 0, false
				}
				v = v*10 + int(c-'0')
			}
			return v, true
		}
		y, ok1 := num(0, 4)
		mo, ok2 := num(5, 7)
		d, ok3 := num(8, 10)
		h, ok4 := num(11, 13)
		mi, ok5 := num(14, 16)
		se, ok6 := num(17, 19)
		us, ok7 := num(20, 26)
		if ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7 && mo >= 1 && mo <= 12 && d >= 1 && h < 24 && mi < 60 && se < 60 {
			ts := time.Date(y, time.Month(mo), d, h, mi, se, us*1000, time.UTC)
			if ts.Day() == d { // not normalized from an impossible date
				return ts, nil
			}
		}
	}
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, err
	}
	return ts.UTC(), nil
}
