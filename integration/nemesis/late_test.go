package nemesis

import (
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"tidemark/internal/testenv"
)

// The draws added after the extension draws (2026-12-02, issue 23's
// missing draws). They come from a stream of their own (c.late, seeded
// from the seed), consume nothing of c.rng nor of c.ext, and change none of
// what those streams' draws depend on, so that every seed's earlier draws
// stay the same campaign (a seed none of them fires for is the campaign it
// was). They are marked "+" in draws.txt like the extension draws.

func (c *campaign) withLate(f func()) { c.withStream(&c.late, f) }

// largeFloor is the first key of preloadLarge's rows (their rid).
const largeFloor = 10_000_000

// drawKillDeletes draws, for a first-run snapshot killed with a big table
// in it, whether rows the killed snapshot already copied are deleted at
// the source between the kill and the restart (fix 24b7026: the restarted
// first snapshot must remove them from the target, though its full read
// does not carry them and fallback.keydiff may be off).
func (c *campaign) drawKillDeletes() bool {
	if c.large == nil {
		return false
	}
	var v bool
	c.withLate(func() { v = c.chance("kill_deletes", 0.6) })
	return v
}

// largeKey is the key columns of the big table's rows in the target and
// the condition that selects them (their keys are derived from rids from
// largeFloor on: tables_test.go keyValues).
func (tb *table) largeKey() (cols []string, cond string) {
	switch tb.shape {
	case "cpk":
		return []string{"a", "b"}, fmt.Sprintf("a >= %d", largeFloor/5)
	default: // pk, nullu; uk1 and uk2 by their surrogate id
		return []string{"id"}, fmt.Sprintf("id >= %d", largeFloor)
	}
}

// awaitLargeCopied waits (up to 60 s) until the target holds rows of the
// big table: its snapshot has begun copying.
func (c *campaign) awaitLargeCopied() {
	if c.dry {
		return
	}
	_, cond := c.large.largeKey()
	q := fmt.Sprintf("SELECT EXISTS (SELECT 1 FROM %s WHERE %s)", pgx.Identifier{c.db, c.large.name}.Sanitize(), cond)
	began := time.Now()
	if !testenv.WaitFor(60*time.Second, func() bool {
		var has bool
		// An error is the table not created yet (or PostgreSQL away):
		// not copied yet.
		err := c.pg.QueryRow(c.ctx, q).Scan(&has)
		if err != nil && c.pg.IsClosed() {
			c.pg = c.connectPG()
		}
		return err == nil && has
	}) {
		c.t.Logf("kill deletes: no row of %s copied after 60 s; killing anyway", c.large.name)
		return
	}
	c.t.Logf("kill deletes: %s's copy began (%s after the wait began)", c.large.name, time.Since(began).Round(time.Millisecond))
}

// deleteCopied deletes at the source a drawn number of the big table's
// rows that the target already holds (the killed snapshot copied them),
// the lowest keys first.
func (c *campaign) deleteCopied() {
	var n int
	c.withLate(func() { n = c.intn("kill_delete_rows", 20, 400) })
	if c.dry {
		return
	}
	cols, cond := c.large.largeKey()
	sel := make([]string, len(cols))
	for i, k := range cols {
		sel[i] = pgx.Identifier{k}.Sanitize() + "::text"
	}
	rows, err := c.pg.Query(c.ctx, fmt.Sprintf("SELECT %s FROM %s WHERE %s ORDER BY %s LIMIT %d",
		strings.Join(sel, ", "), pgx.Identifier{c.db, c.large.name}.Sanitize(), cond, strings.Join(sel, ", "), n))
	if err != nil {
		c.t.Logf("kill deletes: read the copied rows of %s: %v (none deleted)", c.large.name, err)
		return
	}
	var tuples []string
	for rows.Next() {
		vals := make([]string, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			c.t.Fatalf("kill deletes: scan a copied key of %s: %v", c.large.name, err)
		}
		for i, v := range vals {
			if cols[i] == "b" {
				vals[i] = lit(v)
			}
		}
		tuples = append(tuples, "("+strings.Join(vals, ", ")+")")
	}
	if err := rows.Err(); err != nil {
		c.t.Logf("kill deletes: read the copied rows of %s: %v (none deleted)", c.large.name, err)
		return
	}
	if len(tuples) == 0 {
		c.t.Logf("kill deletes: the target holds no row of %s yet (none deleted)", c.large.name)
		return
	}
	q := make([]string, len(cols))
	for i, k := range cols {
		q[i] = "`" + k + "`"
	}
	c.source(fmt.Sprintf("DELETE FROM `%s`.`%s` WHERE (%s) IN (%s)", c.db, c.large.name, strings.Join(q, ", "), strings.Join(tuples, ", ")))
	c.res.faults["kill_deletes"]++
	c.t.Logf("kill deletes: deleted %d rows of %s the killed snapshot had copied", len(tuples), c.large.name)
}
