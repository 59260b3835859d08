package nemesis

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// The draws added after the first CI seed set (2026-12-02): large tables,
// legacy charsets, long identifiers, NUL bytes, a killed source-lock
// session, a deleted checkpoint. They come from their own stream (c.ext,
// seeded from the seed), and none of them consumes c.rng or changes what
// the workload's draws depend on (a table's live rows, its value columns),
// so that every seed's earlier draws, and so the findings recorded by seed
// (knownFailing), stay the same campaign; a seed none of them fires for is
// the campaign it was.

// legacyFamilies are text columns in non-UTF-8 charsets, as extra columns
// (table.extCols) the schema changes never touch. sjis is one tidemark
// does not decode on purpose (docs/type-mapping.md): its table is
// quarantined, naming the column, a documented refusal.
var legacyFamilies = []family{
	{"cp1251", "VARCHAR(64) CHARACTER SET cp1251 NULL", "", func(r *rand.Rand) string {
		return nullOr(r, lit(word(r, []string{"Привет", "мир", "Ёжик", "щука", "ЯЮЭ", "x", ""})))
	}},
	{"sjis", "VARCHAR(64) CHARACTER SET sjis NULL", "", func(r *rand.Rand) string {
		return nullOr(r, lit(word(r, []string{"日本語", "ｶﾀｶﾅ", "ひらがな", "表示", "x", ""})))
	}},
	{"latin2", "VARCHAR(64) CHARACTER SET latin2 NULL", "", func(r *rand.Rand) string {
		return nullOr(r, lit(word(r, []string{"Łódź", "Příliš", "ĹĄ", "žluťoučký", "x", ""})))
	}},
	{"gbk", "VARCHAR(64) CHARACTER SET gbk NULL", "", func(r *rand.Rand) string {
		return nullOr(r, lit(word(r, []string{"中文", "简体字", "汉字", "x", ""})))
	}},
	{"koi8r", "VARCHAR(64) CHARACTER SET koi8r NULL", "", func(r *rand.Rand) string {
		return nullOr(r, lit(word(r, []string{"Москва", "ёлка", "Щи", "x", ""})))
	}},
	{"latin1enum", "ENUM('Köln','Zürich','Málaga') CHARACTER SET latin1 NULL", "", func(r *rand.Rand) string {
		return nullOr(r, lit([]string{"Köln", "Zürich", "Málaga"}[r.IntN(3)]))
	}},
}

// withExt runs f with c.ext as the campaign's stream (every draw helper
// then draws from it).
func (c *campaign) withExt(f func()) { c.withStream(&c.ext, f) }

// withStream runs f with *s as the campaign's stream; its draws are marked
// with a leading "+".
func (c *campaign) withStream(s **rand.Rand, f func()) {
	c.rng, *s, c.inExt = *s, c.rng, true
	defer func() { c.rng, *s, c.inExt = *s, c.rng, false }()
	f()
}

// drawExtTables draws, per table, a legacy-charset column and, once per
// campaign, a table name of exactly 63 bytes (PostgreSQL's limit: it must
// stream like any other).
func (c *campaign) drawExtTables() {
	c.withExt(func() {
		for i, tb := range c.tables {
			tb.ext = rand.New(rand.NewPCG(c.seed, 0x6e656d65+uint64(i)))
			if c.chance(tb.name+".legacy_charset", 0.25) {
				f := legacyFamilies[c.rng.IntN(len(legacyFamilies))]
				c.draw("legacy_charset", f.name)
				tb.extCols = append(tb.extCols, col{name: "x_" + f.name, fam: f})
				if f.name == "sjis" && tb.mayQuarantine == "" {
					tb.mayQuarantine = "a sjis column (documented refusal: the Japanese character sets are not decoded)"
				}
			}
		}
		if c.chance("long_name", 0.15) {
			tb := c.tables[c.rng.IntN(len(c.tables))]
			c.draw("table", tb.name)
			base := tb.name + "_long_name_"
			tb.name = base + strings.Repeat("x", 63-len(base))
		}
	})
}

// preloadLarge fills one table of a first-run snapshot with 15,000–40,000
// more rows (issue 22 §1b: a kill -9 inside the snapshot of a big table).
// They get keys far above the workload's and stay out of the model's live
// rows, so the workload's draws are those of the campaign without them.
func (c *campaign) preloadLarge() {
	c.withExt(func() {
		if !c.chance("large_table", 0.5) {
			return
		}
		// A table with a key: the workload's statements on a table
		// without one scan it whole.
		var keyed []*table
		for _, tb := range c.tables {
			if tb.shape != "nokey" {
				keyed = append(keyed, tb)
			}
		}
		tb := keyed[c.rng.IntN(len(keyed))]
		c.draw("table", tb.name)
		c.large = tb
		n := c.intn("large_rows", 15000, 40000)
		next, live := tb.next, tb.live
		tb.next = 10_000_000
		for n > 0 {
			k := min(n, 1000)
			c.source(tb.insertRows(c.db, c.rng, k))
			n -= k
		}
		tb.next, tb.live = next, live
	})
}

// extStep may inject one of the extension faults after a step.
func (c *campaign) extStep(i int) {
	c.withExt(func() {
		if !c.chance(fmt.Sprintf("step%d.ext", i), 0.12) {
			return
		}
		w := map[string]int{"lock_session_kill": 3}
		if c.s.topology == "pg" {
			w["checkpoint_delete"] = 2
		}
		if c.s.topology != "apply" {
			w["nul_byte"] = 1
		}
		if c.s.version == "filepos" {
			w["gtid_backwards"] = 2
		}
		kind := c.weighted("ext_fault", w)
		c.res.faults[kind]++
		c.phase = fmt.Sprintf("step %d (ext %s)", i, kind)
		switch kind {
		case "lock_session_kill":
			c.killLockSession()
		case "checkpoint_delete":
			c.deleteCheckpoint()
		case "nul_byte":
			c.nulByte()
		case "gtid_backwards":
			c.gtidBackwards()
		}
	})
}

// killLockSession ends, with pg_terminate_backend, the PostgreSQL session
// that holds the source's lock: the holder must take it again (no other
// process wrote meanwhile) or stop while a standby takes over.
func (c *campaign) killLockSession() {
	if c.dry {
		return
	}
	var n int
	// The lock key is fnv32a(source) (sink/postgres/sourcelock.go): match
	// it on the object id.
	key := fnv32a(c.db)
	if err := c.pg.QueryRow(c.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND classid = 29805 AND objid = $1::bigint::oid AND objsubid = 2`, int64(key)).Scan(&n); err != nil {
		c.t.Fatalf("terminate the source lock's session: %v", err)
	}
	c.draw("lock_sessions_killed", n)
	c.t.Logf("pg_terminate_backend of the source lock's session: %d session(s)", n)
}

func fnv32a(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// deleteCheckpoint stops the tailers, deletes the source's checkpoint row
// (docs/FAILOVER.md: "to start over"; the epoch floor stays) and starts
// them: they restart from the configured start position (a replay of the
// whole campaign so far) or, without one, take a first-run snapshot again.
func (c *campaign) deleteCheckpoint() {
	c.tailer.kill()
	if c.standby != nil {
		c.standby.kill()
	}
	if !c.dry {
		// No checkpoint table yet: no tailer got as far as its first
		// commit (a fresh PostgreSQL), and there is nothing to delete.
		var exists bool
		if err := c.pg.QueryRow(c.ctx, "SELECT to_regclass('tidemark.checkpoints') IS NOT NULL").Scan(&exists); err != nil {
			c.t.Fatalf("look up the checkpoint table: %v", err)
		}
		if exists {
			if _, err := c.pg.Exec(c.ctx, "DELETE FROM tidemark.checkpoints WHERE source = $1", c.db); err != nil {
				c.t.Fatalf("delete the checkpoint: %v", err)
			}
		}
		if c.startOverAt == 0 {
			c.startOverAt = len(c.procs) // the processes started next replay (judge: replayedDrops)
		}
		if c.mon != nil {
			// The next checkpoint may be older: on purpose. (After a
			// pause: a poll that read the deleted one has ended.)
			time.Sleep(200 * time.Millisecond)
			c.mon.Forget()
		}
	}
	c.startTailers()
}

// nulByte writes a NUL character into a text column of a live row:
// PostgreSQL text cannot hold it, and tidemark quarantines the table with
// a reason naming the column and "NUL byte" (docs/type-mapping.md).
func (c *campaign) nulByte() {
	var cands []*table
	for _, tb := range c.tables {
		if len(tb.live) == 0 || tb.mayQuarantine != "" {
			continue
		}
		for _, cl := range tb.cols {
			if cl.fam.name == "utf8" || cl.fam.name == "text" {
				cands = append(cands, tb)
				break
			}
		}
	}
	if len(cands) == 0 {
		c.draw("nul_table", "none")
		return
	}
	tb := cands[c.rng.IntN(len(cands))]
	c.draw("nul_table", tb.name)
	var cl col
	for _, x := range tb.cols {
		if x.fam.name == "utf8" || x.fam.name == "text" {
			cl = x
			break
		}
	}
	r := tb.live[c.rng.IntN(len(tb.live))]
	c.source(fmt.Sprintf("UPDATE `%s`.`%s` SET `%s` = CONCAT('nul', CHAR(0), 'byte') WHERE %s", c.db, tb.name, cl.name, tb.where(r)))
	tb.mayQuarantine = "a NUL byte in " + cl.name + " (documented refusal: PostgreSQL text cannot hold it)"
}

// gtidBackwards commits one update with a GTID sequence number far below
// the domain's (gtid_strict_mode off for it, as a mysqlbinlog replay for a
// point-in-time recovery does; allowed under version: filepos, whose
// positions of one server order by file and offset: review finding 11).
func (c *campaign) gtidBackwards() {
	tb := c.liveTable("table")
	if tb == nil {
		return
	}
	q := tb.update(c.db, c.rng, tb.live[c.rng.IntN(len(tb.live))])
	seq := c.intn("gtid_seq_no", 1, 50)
	c.source("SET GLOBAL gtid_strict_mode = 0", fmt.Sprintf("SET SESSION gtid_seq_no = %d", seq), q, "SET SESSION gtid_seq_no = 0",
		// The next transaction gets the domain's highest sequence number
		// + 1: one outside the campaign's database, so that
		// @@gtid_binlog_pos is ordinary again before strict mode is.
		"CREATE DATABASE IF NOT EXISTS `"+c.db+"_end`", "DROP DATABASE `"+c.db+"_end`", "SET GLOBAL gtid_strict_mode = 1")
}
