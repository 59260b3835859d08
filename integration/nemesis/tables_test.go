package nemesis

import (
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strings"
)

// A table's shape is its key layout.
var shapes = []string{
	"pk",    // id BIGINT PRIMARY KEY
	"uk1",   // surrogate AUTO_INCREMENT id + UNIQUE (code)
	"uk2",   // surrogate AUTO_INCREMENT id + UNIQUE (order_id, line_item_id): the seed incident's table
	"cpk",   // composite PRIMARY KEY (a, b text)
	"nullu", // id PRIMARY KEY + a nullable UNIQUE column
	"nokey", // no key at all
}

// family is a column type family of the type zoo: its MariaDB type and a
// value generator (an SQL literal).
type family struct {
	name, sqlType string
	widen         string // a widening MODIFY COLUMN type, "" when none is drawn
	gen           func(r *rand.Rand) string
}

var utf8Words = []string{"plain", "é", "naïve", "日本語", "emoji 😀", "tab\tnew\nline", "quote ' \" \\", "Ünïcødé", "  spaced  ", ""}
var latin1Words = []string{"plain", "café", "Müller", "straße", "œuvre", "niño", "ÀÉÎÕÜ", "x", ""}

func lit(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(s) + "'"
}

func nullOr(r *rand.Rand, v string) string {
	if r.IntN(10) == 0 {
		return "NULL"
	}
	return v
}

func word(r *rand.Rand, ws []string) string {
	return ws[r.IntN(len(ws))] + fmt.Sprint(r.IntN(1000))
}

// dtLiteral is a DATETIME value away from the DST folds and gaps of the
// zones a campaign draws (hours 04–23): the nemesis tests streaming, not the
// fold/gap policies (TestTemporalEdges does).
func dtLiteral(r *rand.Rand) string {
	return fmt.Sprintf("'%04d-%02d-%02d %02d:%02d:%02d.%06d'", 1971+r.IntN(66), 1+r.IntN(12), 1+r.IntN(28), 4+r.IntN(20), r.IntN(60), r.IntN(60), r.IntN(1000000))
}

var families = []family{
	{"int", "INT NULL", "BIGINT NULL", func(r *rand.Rand) string { return nullOr(r, fmt.Sprint(int32(r.Uint32()))) }},
	{"ubig", "BIGINT UNSIGNED NOT NULL DEFAULT 0", "", func(r *rand.Rand) string { return fmt.Sprint(r.Uint64()) }},
	{"dec", "DECIMAL(18,4) NULL", "DECIMAL(22,6) NULL", func(r *rand.Rand) string {
		return nullOr(r, fmt.Sprintf("%d.%04d", r.Int64N(1e13)-5e12, r.IntN(10000)))
	}},
	{"dbl", "DOUBLE NULL", "", func(r *rand.Rand) string { return nullOr(r, fmt.Sprintf("%.17g", (r.Float64()-0.5)*1e6)) }},
	{"utf8", "VARCHAR(64) CHARACTER SET utf8mb4 NULL", "VARCHAR(200) CHARACTER SET utf8mb4 NULL", func(r *rand.Rand) string { return nullOr(r, lit(word(r, utf8Words))) }},
	{"latin1", "VARCHAR(64) CHARACTER SET latin1 NULL", "", func(r *rand.Rand) string { return nullOr(r, lit(word(r, latin1Words))) }},
	{"text", "TEXT NULL", "", func(r *rand.Rand) string {
		return nullOr(r, lit(strings.Repeat(word(r, utf8Words)+" ", 1+r.IntN(60))))
	}},
	{"dt", "DATETIME(6) NULL", "", func(r *rand.Rand) string { return nullOr(r, dtLiteral(r)) }},
	{"ts", "TIMESTAMP(6) NULL", "", func(r *rand.Rand) string {
		// Written in the session's zone: no DST gap either (MariaDB refuses those).
		return nullOr(r, dtLiteral(r))
	}},
	{"json", "JSON NULL", "", func(r *rand.Rand) string {
		return nullOr(r, lit(fmt.Sprintf(`{"n": %d, "s": %q, "a": [1, 2.5, null, true]}`, r.IntN(1e6), word(r, utf8Words))))
	}},
	{"bin", "VARBINARY(32) NULL", "", func(r *rand.Rand) string {
		b := make([]byte, r.IntN(33))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		if len(b) == 0 {
			return "''"
		}
		return nullOr(r, "X'"+hex.EncodeToString(b)+"'")
	}},
	{"blob", "BLOB NULL", "", func(r *rand.Rand) string {
		b := make([]byte, 1+r.IntN(3000))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		return nullOr(r, "X'"+hex.EncodeToString(b)+"'")
	}},
	{"enum", "ENUM('new','paid','shipped','cancelled') NULL", "", func(r *rand.Rand) string {
		return nullOr(r, lit([]string{"new", "paid", "shipped", "cancelled"}[r.IntN(4)]))
	}},
	{"set", "SET('a','b','c','d') NULL", "", func(r *rand.Rand) string {
		var m []string
		for _, s := range []string{"a", "b", "c", "d"} {
			if r.IntN(2) == 0 {
				m = append(m, s)
			}
		}
		return nullOr(r, lit(strings.Join(m, ",")))
	}},
	{"bit", "BIT(10) NULL", "", func(r *rand.Rand) string { return nullOr(r, fmt.Sprint(r.IntN(1024))) }},
	{"year", "YEAR NULL", "", func(r *rand.Rand) string { return nullOr(r, fmt.Sprint(1901+r.IntN(254))) }},
	{"date", "DATE NULL", "", func(r *rand.Rand) string {
		return nullOr(r, fmt.Sprintf("'%04d-%02d-%02d'", 1000+r.IntN(9000), 1+r.IntN(12), 1+r.IntN(28)))
	}},
	{"time", "TIME(3) NULL", "", func(r *rand.Rand) string {
		return nullOr(r, fmt.Sprintf("'%s%d:%02d:%02d.%03d'", []string{"", "-"}[r.IntN(2)], r.IntN(839), r.IntN(60), r.IntN(60), r.IntN(1000)))
	}},
	{"char", "CHAR(8) CHARACTER SET utf8mb4 NULL", "", func(r *rand.Rand) string {
		return nullOr(r, lit([]string{"a", "ab ", "é", "  x", "12345678"}[r.IntN(5)]))
	}},
	{"bool", "TINYINT(1) NULL", "SMALLINT NULL", func(r *rand.Rand) string { return nullOr(r, fmt.Sprint(r.IntN(2))) }},
}

func familyByName(n string) family {
	for _, f := range families {
		if f.name == n {
			return f
		}
	}
	panic("no family " + n)
}

// col is a value column of a table (not a key column).
type col struct {
	name string
	fam  family
}

// row is a live source row: rid is its stable identity (the surrogate id of
// the uk shapes), kid the number its key columns are derived from (a
// key-changing UPDATE gives it a new kid).
type row struct{ rid, kid int64 }

// table is the campaign's model of one source table: enough to write
// statements that hit live rows, not a copy of the data (the source is the
// truth the oracle reads).
type table struct {
	name  string
	shape string
	cols  []col
	// bk is the business key declared in the config (nil: the primary key).
	bk   []string
	live []row
	next int64 // the next rid and kid
	// mayQuarantine is why the draws make a quarantine of this table a
	// documented refusal ("" when a quarantine would be a finding).
	mayQuarantine string
	colSeq        int
	indexes       []string // secondary index names added by DDL
	// extCols are value columns of the extension draws (ext_test.go): no
	// schema change touches them, and their values come from ext, not from
	// the workload's stream.
	extCols []col
	ext     *rand.Rand
}

func (tb *table) keyCols() []string {
	switch tb.shape {
	case "pk", "nullu":
		return []string{"id"}
	case "uk1":
		return []string{"code"}
	case "uk2":
		return []string{"order_id", "line_item_id"}
	case "cpk":
		return []string{"a", "b"}
	default:
		return []string{"k"}
	}
}

// compareKey is the key the oracle matches rows on: the business key when
// one is declared, else the primary key.
func (tb *table) compareKey() []string {
	if tb.bk != nil {
		return tb.bk
	}
	switch tb.shape {
	case "uk1", "uk2":
		return []string{"id"}
	}
	return tb.keyCols()
}

// keyDDL is the key columns and indexes of the CREATE TABLE.
func (tb *table) keyDDL() []string {
	switch tb.shape {
	case "pk":
		return []string{"id BIGINT NOT NULL PRIMARY KEY"}
	case "uk1":
		return []string{"id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY", "code VARCHAR(40) CHARACTER SET utf8mb4 NOT NULL", "UNIQUE KEY uk_code (code)"}
	case "uk2":
		return []string{"id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY", "order_id BIGINT NOT NULL", "line_item_id INT NOT NULL", "UNIQUE KEY uk_order_line (order_id, line_item_id)"}
	case "cpk":
		return []string{"a BIGINT NOT NULL", "b VARCHAR(16) CHARACTER SET utf8mb4 NOT NULL", "PRIMARY KEY (a, b)"}
	case "nullu":
		return []string{"id BIGINT NOT NULL PRIMARY KEY", "email VARCHAR(64) NULL", "UNIQUE KEY uk_email (email)"}
	default:
		return []string{"k BIGINT NOT NULL"}
	}
}

func (tb *table) createSQL(db, name string) string {
	parts := tb.keyDDL()
	for _, c := range append(append([]col(nil), tb.cols...), tb.extCols...) {
		parts = append(parts, fmt.Sprintf("`%s` %s", c.name, c.fam.sqlType))
	}
	parts = append(parts, "updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)")
	return fmt.Sprintf("CREATE TABLE `%s`.`%s` (\n  %s\n) DEFAULT CHARSET=utf8mb4", db, name, strings.Join(parts, ",\n  "))
}

// keyValues are the key columns' values (SQL literals) of kid.
func (tb *table) keyValues(kid int64) []string {
	switch tb.shape {
	case "pk", "nullu", "nokey":
		return []string{fmt.Sprint(kid)}
	case "uk1":
		return []string{lit(fmt.Sprintf("c-%d-é", kid))}
	case "uk2":
		return []string{fmt.Sprint(1000 + kid/8), fmt.Sprint(kid % 8)}
	default:
		return []string{fmt.Sprint(kid / 5), lit(fmt.Sprintf("k%dü", kid%5))}
	}
}

// where selects a row: by its surrogate id in the uk shapes, else by key.
func (tb *table) where(r row) string {
	if tb.shape == "uk1" || tb.shape == "uk2" {
		return fmt.Sprintf("id = %d", r.rid)
	}
	var w []string
	for i, k := range tb.keyCols() {
		w = append(w, fmt.Sprintf("`%s` = %s", k, tb.keyValues(r.kid)[i]))
	}
	return strings.Join(w, " AND ")
}

// insertRows returns a multi-row INSERT of n new rows (and adds them to the
// model).
func (tb *table) insertRows(db string, rnd *rand.Rand, n int) string {
	names := append([]string(nil), tb.keyCols()...)
	if tb.shape == "uk1" || tb.shape == "uk2" || tb.shape == "nullu" {
		names = append([]string{"id"}, names...)
		if tb.shape == "nullu" {
			names = []string{"id", "email"}
		}
	}
	for _, c := range append(append([]col(nil), tb.cols...), tb.extCols...) {
		names = append(names, c.name)
	}
	var vals []string
	for i := 0; i < n; i++ {
		r := row{rid: tb.next, kid: tb.next}
		tb.next++
		var v []string
		switch tb.shape {
		case "uk1", "uk2":
			v = append([]string{fmt.Sprint(r.rid)}, tb.keyValues(r.kid)...)
		case "nullu":
			email := "NULL"
			if rnd.IntN(3) > 0 {
				email = lit(fmt.Sprintf("u%d@example.com", r.rid))
			}
			v = []string{fmt.Sprint(r.kid), email}
		default:
			v = tb.keyValues(r.kid)
		}
		for _, c := range tb.cols {
			v = append(v, c.fam.gen(rnd))
		}
		for _, c := range tb.extCols {
			v = append(v, c.fam.gen(tb.ext))
		}
		vals = append(vals, "("+strings.Join(v, ", ")+")")
		tb.live = append(tb.live, r)
	}
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = "`" + n + "`"
	}
	return fmt.Sprintf("INSERT INTO `%s`.`%s` (%s) VALUES %s", db, tb.name, strings.Join(q, ", "), strings.Join(vals, ", "))
}

// update changes the value columns of a live row (or only updated_at).
func (tb *table) update(db string, rnd *rand.Rand, r row) string {
	var set []string
	for _, c := range tb.cols {
		if rnd.IntN(2) == 0 {
			set = append(set, fmt.Sprintf("`%s` = %s", c.name, c.fam.gen(rnd)))
		}
	}
	for _, c := range tb.extCols {
		if tb.ext.IntN(2) == 0 {
			set = append(set, fmt.Sprintf("`%s` = %s", c.name, c.fam.gen(tb.ext)))
		}
	}
	if tb.shape == "nullu" && rnd.IntN(4) == 0 {
		email := "NULL"
		if rnd.IntN(2) == 0 {
			email = lit(fmt.Sprintf("u%d-%d@example.com", r.rid, rnd.IntN(1000)))
		}
		set = append(set, "email = "+email)
	}
	if len(set) == 0 {
		set = []string{"updated_at = CURRENT_TIMESTAMP(6)"}
	}
	return fmt.Sprintf("UPDATE `%s`.`%s` SET %s WHERE %s", db, tb.name, strings.Join(set, ", "), tb.where(r))
}

// rekey changes the key of live row i (the business key of the uk shapes,
// the primary key of the others).
func (tb *table) rekey(db string, i int) string {
	old := tb.live[i]
	nw := row{rid: old.rid, kid: tb.next}
	tb.next++
	var set []string
	for j, k := range tb.keyCols() {
		set = append(set, fmt.Sprintf("`%s` = %s", k, tb.keyValues(nw.kid)[j]))
	}
	tb.live[i] = nw
	return fmt.Sprintf("UPDATE `%s`.`%s` SET %s WHERE %s", db, tb.name, strings.Join(set, ", "), tb.where(old))
}

func (tb *table) remove(db string, i int) string {
	r := tb.live[i]
	tb.live[i] = tb.live[len(tb.live)-1]
	tb.live = tb.live[:len(tb.live)-1]
	return fmt.Sprintf("DELETE FROM `%s`.`%s` WHERE %s", db, tb.name, tb.where(r))
}
