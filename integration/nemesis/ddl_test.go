package nemesis

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// ddl draws one schema change of a table and makes it while the daemon
// streams; a burst of the workload follows it.
func (c *campaign) ddl() {
	tb := c.tables[c.rng.IntN(len(c.tables))]
	c.draw("table", tb.name)
	kind := c.weighted("ddl", map[string]int{"add_column": 4, "add_column_default": 2, "drop_column": 3, "rename_column": 2, "modify_column": 2,
		"add_index": 2, "drop_index": 1, "add_unique": 1, "truncate": 2, "cutover": 2, "drop_create": 1, "resync": 2})
	c.phase += " " + kind + " " + tb.name
	c.res.faults["ddl:"+kind]++
	q := "`" + c.db + "`.`" + tb.name + "`"
	alter := func(sqls ...string) {
		for _, s := range sqls {
			c.source(s)
			c.res.ddl++
		}
	}
	switch kind {
	case "add_column", "add_column_default":
		f := families[c.rng.IntN(len(families))]
		c.draw("family", f.name)
		typ := f.sqlType
		if kind == "add_column_default" {
			// Existing rows get a value no row event carries: a backfill.
			f = backfill(f)
			typ = f.sqlType
		}
		name := fmt.Sprintf("c%d_%s", tb.colSeq, f.name)
		tb.colSeq++
		alter(fmt.Sprintf("ALTER TABLE %s ADD COLUMN `%s` %s", q, name, typ))
		tb.cols = append(tb.cols, col{name: name, fam: f})
	case "drop_column":
		if len(tb.cols) < 2 {
			return
		}
		i := c.rng.IntN(len(tb.cols))
		alter(fmt.Sprintf("ALTER TABLE %s DROP COLUMN `%s`", q, tb.cols[i].name))
		tb.cols = append(tb.cols[:i], tb.cols[i+1:]...)
	case "rename_column":
		if len(tb.cols) == 0 {
			return
		}
		i := c.rng.IntN(len(tb.cols))
		name := fmt.Sprintf("c%d_%s", tb.colSeq, tb.cols[i].fam.name)
		tb.colSeq++
		alter(fmt.Sprintf("ALTER TABLE %s RENAME COLUMN `%s` TO `%s`", q, tb.cols[i].name, name))
		tb.cols[i].name = name
	case "modify_column":
		for i, cl := range tb.cols {
			if cl.fam.widen != "" {
				alter(fmt.Sprintf("ALTER TABLE %s MODIFY COLUMN `%s` %s", q, cl.name, cl.fam.widen))
				tb.cols[i].fam.sqlType, tb.cols[i].fam.widen = cl.fam.widen, ""
				break
			}
		}
	case "add_index", "add_unique":
		if len(tb.cols) == 0 {
			return
		}
		cl := tb.cols[c.rng.IntN(len(tb.cols))]
		if strings.Contains("text json blob", cl.fam.name) {
			return
		}
		name := fmt.Sprintf("ix%d", tb.colSeq)
		tb.colSeq++
		if kind == "add_unique" {
			if tb.shape == "nokey" {
				return
			}
			// Unique because it contains the key.
			keys := append([]string{}, tb.keyCols()...)
			if tb.shape == "nullu" {
				keys = []string{"id"}
			}
			alter(fmt.Sprintf("ALTER TABLE %s ADD UNIQUE INDEX `%s` (`%s`, `%s`)", q, name, strings.Join(keys, "`, `"), cl.name))
		} else {
			alter(fmt.Sprintf("ALTER TABLE %s ADD INDEX `%s` (`%s`)", q, name, cl.name))
		}
		tb.indexes = append(tb.indexes, name)
	case "drop_index":
		if len(tb.indexes) == 0 {
			return
		}
		alter(fmt.Sprintf("ALTER TABLE %s DROP INDEX `%s`", q, tb.indexes[0]))
		tb.indexes = tb.indexes[1:]
	case "truncate":
		alter("TRUNCATE TABLE " + q)
		tb.live = nil
	case "cutover":
		if tb.shape == "nokey" {
			return // the copy's REPLACE needs a key
		}
		c.cutover(tb, alter)
	case "drop_create":
		if tb.bk != nil {
			return // the config's business key names the old layout's columns
		}
		alter("DROP TABLE " + q)
		if c.s.dropTable == "refuse" {
			tb.mayQuarantine = "DROP TABLE under ddl.drop_table: refuse (documented refusal)"
		}
		old := tb.shape
		for tb.shape == old {
			tb.shape = c.weighted("new_shape", map[string]int{"pk": 1, "uk1": 1, "uk2": 1, "cpk": 1, "nullu": 1})
		}
		tb.live, tb.indexes, tb.cols, tb.extCols = nil, nil, nil, nil
		for j := c.intn("columns", 1, 4); j > 0; j-- {
			f := families[c.rng.IntN(len(families))]
			c.draw("family", f.name)
			tb.cols = append(tb.cols, col{name: fmt.Sprintf("c%d_%s", tb.colSeq, f.name), fam: f})
			tb.colSeq++
		}
		alter(tb.createSQL(c.db, tb.name))
	case "resync":
		// tidemark resync of a busy table: the workload goes on while the
		// daemon re-snapshots it.
		done := make(chan string, 1)
		if c.dry {
			done <- ""
		}
		go func() {
			if c.dry {
				return
			}
			from := time.Now()
			code, out := c.runCmd(3*time.Minute, "resync", "--config", c.cfg, "--table", c.db+"."+tb.name, "--wait", "150s")
			if strings.Contains(out, "resynced in this process") || strings.Contains(out, resyncFailedHere) {
				// The lock was free (a lock_session_kill or a
				// PostgreSQL restart had just ended the daemon's
				// session): the command took it and resynced itself
				// (or failed to), fencing the daemon while it held it
				// (judge: restartLockTakeovers). Read after done.
				c.resyncedHere = append(c.resyncedHere, window{from, time.Now()})
			}
			if code != 0 {
				done <- fmt.Sprintf("exit %d: %s", code, tail(out, 10))
				return
			}
			done <- ""
		}()
		c.res.ddl++
		c.burst(c.intn("txns", 10, 60), true)
		msg := <-done
		switch {
		case msg == "":
		case tb.mayQuarantine != "" && (strings.Contains(msg, "quarantined again") || strings.Contains(msg, resyncFailedHere)):
			// The documented refusal the draws made (a NUL byte written
			// into the table, say) is still in the source: the resync
			// refuses the table again, loudly (soak seed 349404923391),
			// the daemon's ("quarantined again") or, when the command
			// found the lock free and resynced itself, its own (soak
			// seed 744407804367: a keyless t0, "resync failed"). The
			// judge checks the quarantine.
			c.t.Logf("tidemark resync --table %s.%s refused it again, as the draws allow (%s): %s", c.db, tb.name, tb.mayQuarantine, msg)
		default:
			c.t.Errorf("tidemark resync --table %s.%s failed: %s", c.db, tb.name, msg)
		}
		return
	}
	c.burst(c.intn("txns", 2, 20), true)
}

// resyncFailedHere is what `tidemark resync` logs when it found the
// source's lock free, resynced the table itself and failed
// (cmd/tidemark/resync.go resyncHere).
const resyncFailedHere = "resync failed; the table stays out of streaming"

// backfill is family f as a column added with NOT NULL DEFAULT (existing
// rows get a value no row event carries): its type without its own
// nullability and default, NOT NULL DEFAULT 0 for the numeric families,
// 'x' for the short strings, and a utf8mb4 VARCHAR for the others; its
// generator never writes NULL.
func backfill(f family) family {
	base := f.sqlType
	if i := strings.Index(base, " NOT NULL"); i >= 0 {
		base = base[:i]
	} else {
		base = strings.TrimSuffix(base, " NULL")
	}
	def := ""
	switch f.name {
	case "int", "ubig", "dec", "dbl", "bit", "year", "bool":
		def = "0"
	case "utf8", "latin1", "char":
		def = "'x'"
	default:
		f, base, def = familyByName("utf8"), "VARCHAR(64)", "'backfilled'"
	}
	gen := f.gen
	f.gen = func(r *rand.Rand) string {
		if v := gen(r); v != "NULL" {
			return v
		}
		return def
	}
	f.sqlType, f.widen = base+" NOT NULL DEFAULT "+def, ""
	return f
}

// cutover is gh-ost's / pt-online-schema-change's: a ghost table created
// like the original (with a column added), filled by copying, then swapped in
// by one atomic RENAME TABLE, and the old table dropped.
func (c *campaign) cutover(tb *table, alter func(...string)) {
	q := func(n string) string { return "`" + c.db + "`.`" + n + "`" }
	base := tb.name
	if len(base) > 59 {
		base = base[:59] // MariaDB's names are 64 characters at most
	}
	gho, del := "_"+base+"_gho", "_"+base+"_del"
	alter("CREATE TABLE " + q(gho) + " LIKE " + q(tb.name))
	added := c.chance("cutover.add_column", 0.5)
	name := ""
	if added {
		name = fmt.Sprintf("c%d_utf8", tb.colSeq)
		tb.colSeq++
		alter(fmt.Sprintf("ALTER TABLE %s ADD COLUMN `%s` VARCHAR(64) NULL", q(gho), name))
	}
	var cols []string
	for _, n := range append(tb.allCols(), "updated_at") {
		cols = append(cols, "`"+n+"`")
	}
	list := strings.Join(cols, ", ")
	c.source("INSERT INTO " + q(gho) + " (" + list + ") SELECT " + list + " FROM " + q(tb.name))
	c.burst(c.intn("txns", 0, 10), true) // written to the original only: gh-ost would replay them; here they are copied again below
	c.source("REPLACE INTO " + q(gho) + " (" + list + ") SELECT " + list + " FROM " + q(tb.name))
	c.source("DELETE g FROM " + q(gho) + " g LEFT JOIN " + q(tb.name) + " o ON " + tb.joinOn("g", "o") + " WHERE o.updated_at IS NULL")
	alter("RENAME TABLE "+q(tb.name)+" TO "+q(del)+", "+q(gho)+" TO "+q(tb.name), "DROP TABLE "+q(del))
	if c.s.dropTable == "refuse" {
		tb.mayQuarantine = "the cut-over renames the table away under ddl.drop_table: refuse (documented: treated as dropped)"
	}
	if added {
		tb.cols = append(tb.cols, col{name: name, fam: familyByName("utf8")})
	}
}

// allCols is every source column but updated_at.
func (tb *table) allCols() []string {
	var out []string
	switch tb.shape {
	case "uk1", "uk2":
		out = append([]string{"id"}, tb.keyCols()...)
	case "nullu":
		out = []string{"id", "email"}
	default:
		out = tb.keyCols()
	}
	for _, cl := range append(append([]col(nil), tb.cols...), tb.extCols...) {
		out = append(out, cl.name)
	}
	return out
}

func (tb *table) joinOn(a, b string) string {
	keys := tb.keyCols()
	if tb.shape == "uk1" || tb.shape == "uk2" || tb.shape == "nullu" {
		keys = []string{"id"}
	}
	var on []string
	for _, k := range keys {
		on = append(on, fmt.Sprintf("%s.`%s` = %s.`%s`", a, k, b, k))
	}
	return strings.Join(on, " AND ")
}
