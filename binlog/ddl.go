package binlog

import (
	"strings"

	"tidemark"
)

// DDL statements arrive as query events with the statement's text. tidemark
// does not parse SQL in general: a small tokenizer recognizes the few
// statements that change what a table holds or how its target must look,
// and everything it does not recognize is ignored (column types, order and
// the key come from the next row's table map, not from the statement):
//
//	TRUNCATE [TABLE] t
//	DROP [TEMPORARY] TABLE [IF EXISTS] t [, t ...]
//	RENAME TABLE [IF EXISTS] a TO b [, c TO d ...]
//	CREATE [OR REPLACE] [TEMPORARY] TABLE [IF NOT EXISTS] t ...
//	ALTER [ONLINE] [IGNORE] TABLE [IF EXISTS] t spec [, spec ...] where spec is
//	  ADD [COLUMN] [IF NOT EXISTS] c def | ADD [COLUMN] (c def, ...)
//	  DROP [COLUMN] [IF EXISTS] c
//	  CHANGE [COLUMN] [IF EXISTS] old new def
//	  RENAME COLUMN old TO new
//	  RENAME [TO | AS] t2
//	  DROP | TRUNCATE | EXCHANGE PARTITION ...
//	CREATE [OR REPLACE] [UNIQUE | FULLTEXT | SPATIAL] INDEX ... ON t ...
//	DROP INDEX [IF EXISTS] name ON t
//
// Every ALTER TABLE and both index statements are reported as
// DDLAlterTable; the Tailer attaches the table's secondary indexes read
// after the statement (indexes.go), so index changes (ADD/DROP INDEX, a
// dropped column that shrinks an index) are followed without parsing them.
//
// Temporary tables are never replicated. Only tables that pass the include
// filter produce events.

// tokKind is the kind of a SQL token.
type tokKind uint8

const (
	tokWord   tokKind = iota + 1 // bare word: keyword, identifier or number
	tokIdent                     // `quoted identifier`
	tokString                    // 'string' or "string"
	tokPunct                     // one other character
)

type token struct {
	kind tokKind
	text string // identifier or string without quotes and escapes
}

// is reports whether the token is the bare word w (case-insensitive).
func (t token) is(w string) bool { return t.kind == tokWord && strings.EqualFold(t.text, w) }

// isName reports whether the token can be an identifier.
func (t token) isName() bool { return t.kind == tokWord || t.kind == tokIdent }

func isWordByte(c byte) bool {
	return c == '_' || c == '$' || c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// tokenize splits a statement into tokens, skipping whitespace and comments.
// MariaDB's executable comments (/*! ... */, /*M! ... */) are read as code.
// ok is false when a quote or comment is not closed.
func tokenize(q string) (toks []token, ok bool) {
	inExec := false
	for i := 0; i < len(q); {
		c := q[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
		case c == '#' || (c == '-' && strings.HasPrefix(q[i:], "--") && (i+2 == len(q) || q[i+2] <= ' ')):
			for i < len(q) && q[i] != '\n' {
				i++
			}
		case c == '/' && strings.HasPrefix(q[i:], "/*"):
			if strings.HasPrefix(q[i:], "/*!") || strings.HasPrefix(q[i:], "/*M!") {
				i += strings.Index(q[i:], "!") + 1
				for i < len(q) && q[i] >= '0' && q[i] <= '9' {
					i++
				}
				inExec = true
				continue
			}
			end := strings.Index(q[i+2:], "*/")
			if end < 0 {
				return nil, false
			}
			i += end + 4
		case c == '*' && inExec && strings.HasPrefix(q[i:], "*/"):
			inExec = false
			i += 2
		case c == '`' || c == '\'' || c == '"':
			var b strings.Builder
			j := i + 1
			closed := false
			for j < len(q) {
				d := q[j]
				if d == c {
					if j+1 < len(q) && q[j+1] == c {
						b.WriteByte(c)
						j += 2
						continue
					}
					closed = true
					j++
					break
				}
				if d == '\\' && c != '`' && j+1 < len(q) {
					b.WriteByte(q[j+1])
					j += 2
					continue
				}
				b.WriteByte(d)
				j++
			}
			if !closed {
				return nil, false
			}
			kind := tokString
			if c == '`' {
				kind = tokIdent
			}
			toks = append(toks, token{kind: kind, text: b.String()})
			i = j
		case isWordByte(c):
			j := i
			for j < len(q) && isWordByte(q[j]) {
				j++
			}
			toks = append(toks, token{kind: tokWord, text: q[i:j]})
			i = j
		default:
			toks = append(toks, token{kind: tokPunct, text: q[i : i+1]})
			i++
		}
	}
	return toks, true
}

// ddlParser walks the tokens of one statement.
type ddlParser struct {
	toks []token
	pos  int
	db   string // the statement's default database
}

func (p *ddlParser) peek() token {
	if p.pos < len(p.toks) {
		return p.toks[p.pos]
	}
	return token{}
}

func (p *ddlParser) next() token {
	t := p.peek()
	if p.pos < len(p.toks) {
		p.pos++
	}
	return t
}

// accept consumes the bare words ws if they come next, all of them.
func (p *ddlParser) accept(ws ...string) bool {
	if p.pos+len(ws) > len(p.toks) {
		return false
	}
	for i, w := range ws {
		if !p.toks[p.pos+i].is(w) {
			return false
		}
	}
	p.pos += len(ws)
	return true
}

func (p *ddlParser) punct(s string) bool {
	if t := p.peek(); t.kind == tokPunct && t.text == s {
		p.pos++
		return true
	}
	return false
}

// table reads [db.]name.
func (p *ddlParser) table() (tidemark.TableID, bool) {
	a := p.next()
	if !a.isName() {
		return tidemark.TableID{}, false
	}
	if p.punct(".") {
		b := p.next()
		if !b.isName() {
			return tidemark.TableID{}, false
		}
		return tidemark.TableID{Database: a.text, Name: b.text}, true
	}
	if p.db == "" {
		return tidemark.TableID{}, false
	}
	return tidemark.TableID{Database: p.db, Name: a.text}, true
}

// parseDDL returns the events of one statement for the tables keep accepts,
// stamped with version. db is the statement's default database. Statements
// it does not recognize give no events.
func parseDDL(db, query string, version tidemark.Version, keep func(tidemark.TableID) bool) []tidemark.DDLEvent {
	toks, ok := tokenize(query)
	if !ok || len(toks) == 0 {
		return nil
	}
	p := &ddlParser{toks: toks, db: db}
	var out []tidemark.DDLEvent
	emit := func(ev tidemark.DDLEvent) {
		if keep(ev.Table) {
			ev.Version = version
			out = append(out, ev)
		}
	}
	switch {
	case p.accept("TRUNCATE"):
		p.accept("TABLE")
		if id, ok := p.table(); ok {
			emit(tidemark.DDLEvent{Op: tidemark.DDLTruncate, Table: id})
		}
	case p.accept("DROP"):
		if p.accept("INDEX") {
			// DROP INDEX [IF EXISTS] name ON t: the indexes changed.
			p.accept("IF", "EXISTS")
			if !p.next().isName() || !p.accept("ON") {
				return nil
			}
			if id, ok := p.table(); ok {
				emit(tidemark.DDLEvent{Op: tidemark.DDLAlterTable, Table: id})
			}
			return out
		}
		if p.accept("TEMPORARY") || !p.accept("TABLE") {
			return nil
		}
		p.accept("IF", "EXISTS")
		for {
			id, ok := p.table()
			if !ok {
				break
			}
			emit(tidemark.DDLEvent{Op: tidemark.DDLDropTable, Table: id})
			if !p.punct(",") {
				break
			}
		}
	case p.accept("RENAME"):
		if !p.accept("TABLE") {
			return nil
		}
		p.accept("IF", "EXISTS")
		for {
			from, ok1 := p.table()
			if !ok1 || !p.accept("TO") {
				break
			}
			to, ok2 := p.table()
			if !ok2 {
				break
			}
			emit(tidemark.DDLEvent{Op: tidemark.DDLDropTable, Table: from, Reason: "renamed to " + to.String()})
			emit(tidemark.DDLEvent{Op: tidemark.DDLCreateTable, Table: to, Reason: "renamed from " + from.String(), From: from})
			if !p.punct(",") {
				break
			}
		}
	case p.accept("CREATE"):
		replace := p.accept("OR", "REPLACE")
		if p.accept("UNIQUE") || p.accept("FULLTEXT") || p.accept("SPATIAL") || p.peek().is("INDEX") {
			// CREATE [UNIQUE|FULLTEXT|SPATIAL] INDEX [IF NOT EXISTS] name
			// [USING type] ON t (...): the indexes changed.
			if !p.accept("INDEX") {
				return nil
			}
			p.accept("IF", "NOT", "EXISTS")
			if !p.next().isName() {
				return nil
			}
			if p.accept("USING") {
				p.next()
			}
			if !p.accept("ON") {
				return nil
			}
			if id, ok := p.table(); ok {
				emit(tidemark.DDLEvent{Op: tidemark.DDLAlterTable, Table: id})
			}
			return out
		}
		if p.accept("TEMPORARY") || !p.accept("TABLE") {
			return nil
		}
		p.accept("IF", "NOT", "EXISTS")
		if id, ok := p.table(); ok {
			if replace {
				emit(tidemark.DDLEvent{Op: tidemark.DDLDropTable, Table: id, Reason: "CREATE OR REPLACE"})
			}
			emit(tidemark.DDLEvent{Op: tidemark.DDLCreateTable, Table: id})
		}
	case p.accept("ALTER"):
		p.accept("ONLINE")
		p.accept("IGNORE")
		if !p.accept("TABLE") {
			return nil
		}
		p.accept("IF", "EXISTS")
		id, ok := p.table()
		if !ok {
			return nil
		}
		if p.accept("WAIT") {
			p.next()
		} else {
			p.accept("NOWAIT")
		}
		ev := tidemark.DDLEvent{Op: tidemark.DDLAlterTable, Table: id}
		var renamed *tidemark.TableID
		for _, spec := range splitTop(p.toks[p.pos:], 0) {
			if to, ok := p.alterSpec(spec, &ev); ok {
				renamed = &to
			}
		}
		if renamed != nil {
			// The table is gone under this name; the new name is a new
			// table. ev's column changes are picked up by the snapshot.
			emit(tidemark.DDLEvent{Op: tidemark.DDLDropTable, Table: id, Reason: "renamed to " + renamed.String()})
			emit(tidemark.DDLEvent{Op: tidemark.DDLCreateTable, Table: *renamed, Reason: "renamed from " + id.String(), From: id})
			break
		}
		// Every ALTER is reported, also one that only changes types: it
		// is a batch boundary, so a batch never mixes a table's rows of
		// before and after it.
		emit(ev)
	}
	return out
}

// splitTop splits tokens at commas outside parentheses, starting at depth.
func splitTop(toks []token, depth int) [][]token {
	var out [][]token
	start := 0
	for i, t := range toks {
		if t.kind != tokPunct {
			continue
		}
		switch t.text {
		case "(":
			depth++
		case ")":
			depth--
		case ",":
			if depth == 0 {
				out = append(out, toks[start:i])
				start = i + 1
			}
		case ";":
			if depth == 0 {
				out = append(out, toks[start:i])
				return out
			}
		}
	}
	return append(out, toks[start:])
}

// notColumn lists what follows ADD or DROP when it is not a column.
var notColumn = map[string]bool{"INDEX": true, "KEY": true, "CONSTRAINT": true, "PRIMARY": true, "UNIQUE": true,
	"FULLTEXT": true, "SPATIAL": true, "FOREIGN": true, "CHECK": true, "PARTITION": true, "PERIOD": true,
	"SYSTEM": true, "VECTOR": true}

// alterSpec records one ALTER TABLE specification in ev. It returns the new
// name when the spec renames the table.
func (p *ddlParser) alterSpec(spec []token, ev *tidemark.DDLEvent) (tidemark.TableID, bool) {
	sp := &ddlParser{toks: spec, db: p.db}
	upper := func(t token) string {
		if t.kind != tokWord {
			return ""
		}
		return strings.ToUpper(t.text)
	}
	switch {
	case sp.accept("ADD"):
		column := sp.accept("COLUMN")
		if !column && notColumn[upper(sp.peek())] {
			return tidemark.TableID{}, false
		}
		sp.accept("IF", "NOT", "EXISTS")
		if sp.punct("(") {
			inner := sp.toks[sp.pos:]
			if n := len(inner); n > 0 && inner[n-1].kind == tokPunct && inner[n-1].text == ")" {
				inner = inner[:n-1]
			}
			for _, def := range splitTop(inner, 0) {
				if len(def) > 0 && def[0].isName() && !notColumn[upper(def[0])] {
					addColumn(ev, def[0].text, def[1:])
				}
			}
			return tidemark.TableID{}, false
		}
		if c := sp.next(); c.isName() {
			addColumn(ev, c.text, sp.toks[sp.pos:])
		}
	case sp.accept("DROP"):
		column := sp.accept("COLUMN")
		if !column && notColumn[upper(sp.peek())] {
			if sp.peek().is("PARTITION") {
				ev.Backfill = true // rows removed without row events
			}
			return tidemark.TableID{}, false
		}
		sp.accept("IF", "EXISTS")
		if c := sp.next(); c.isName() {
			ev.Dropped = append(ev.Dropped, c.text)
		}
	case sp.accept("CHANGE"):
		sp.accept("COLUMN")
		sp.accept("IF", "EXISTS")
		from, to := sp.next(), sp.next()
		if from.isName() && to.isName() && from.text != to.text {
			ev.Renames = append(ev.Renames, tidemark.ColumnRename{From: from.text, To: to.text})
		}
	case sp.accept("RENAME"):
		switch {
		case sp.accept("COLUMN"):
			sp.accept("IF", "EXISTS")
			from := sp.next()
			if sp.accept("TO") {
				if to := sp.next(); from.isName() && to.isName() && from.text != to.text {
					ev.Renames = append(ev.Renames, tidemark.ColumnRename{From: from.text, To: to.text})
				}
			}
		case sp.peek().is("INDEX") || sp.peek().is("KEY"):
		default:
			if !sp.accept("TO") {
				sp.accept("AS")
			}
			if id, ok := sp.table(); ok {
				return id, true
			}
		}
	case sp.accept("TRUNCATE", "PARTITION"), sp.accept("EXCHANGE", "PARTITION"):
		ev.Backfill = true
	}
	return tidemark.TableID{}, false
}

// addColumn records an added column and whether existing rows get a value
// the binlog does not carry: anything but NULL (a default, NOT NULL's
// implicit default, a generated or AUTO_INCREMENT value).
func addColumn(ev *tidemark.DDLEvent, name string, def []token) {
	ev.Added = append(ev.Added, name)
	for i, t := range def {
		switch {
		case t.is("DEFAULT"):
			if i+1 >= len(def) || !def[i+1].is("NULL") {
				ev.Backfill = true
			}
		case t.is("NOT"):
			if i+1 < len(def) && def[i+1].is("NULL") {
				ev.Backfill = true
			}
		case t.is("AS"), t.is("GENERATED"), t.is("AUTO_INCREMENT"), t.is("SERIAL"):
			ev.Backfill = true
		}
	}
}
