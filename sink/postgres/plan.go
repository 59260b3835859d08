package postgres

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"tidemark"
)

// batchPlan is a batch coalesced, validated and converted: the staging rows
// of each target table, ready for COPY (and for a retry).
type batchPlan struct {
	groups    []*groupPlan
	coalesced int
	// tombNext is the tombstone pruning state after the last attempt's
	// transaction (tombstones.go), remembered once it commits.
	tombNext *tombSource
}

type groupPlan struct {
	def  *tableDef
	key  defKey
	rows copyRows // encoded for COPY (encode.go)
	// staged operations by code
	nUpsert, nDelete, nKeyGone, nMark int
	// minVersion is the oldest version staged; maxDelete the newest
	// delete's (tombstones.go).
	minVersion, maxDelete tidemark.Version
	// nInserts counts the upserts of inserted or read rows: when every row
	// is one, the direct insert path is worth a try.
	nInserts int
}

type plannedOp struct {
	change  int
	def     *tableDef
	key     defKey
	row     []any
	del     bool
	version tidemark.Version
	commit  time.Time
	alive   bool
	code    string
}

// plan coalesces the batch by (target table, business key), keeping the
// newest version of each key (the last one in batch order on a tie), and
// converts the surviving rows. A staged set never holds a key twice, so the
// upsert cannot fail with SQLSTATE 21000.
func (s *Sink) plan(b *tidemark.Batch) (*batchPlan, error) {
	type slot struct {
		target string
		key    tidemark.Key
	}
	ops := make([]plannedOp, 0, len(b.Changes))
	latest := make(map[slot]int, len(b.Changes))
	// Per change: the index of its upsert and of its delete op, or -1.
	perChange := make([][2]int, len(b.Changes))

	// add plans a row of c (in c.Table's layout) as def d; pr, when not
	// nil, writes it without the columns an older layout's target lacks.
	add := func(i int, d *tableDef, dk defKey, pr *projection, row []any, del bool, c *tidemark.Change) int {
		idx := len(ops)
		k := slot{d.qname, c.Table.KeyOf(row)}
		if pr != nil {
			row = pr.project(row)
		}
		ops = append(ops, plannedOp{change: i, def: d, key: dk, row: row, del: del,
			version: c.Version, commit: c.CommitTime, alive: true})
		if j, ok := latest[k]; ok {
			if ops[j].version.Compare(c.Version) > 0 {
				ops[idx].alive = false // an older change after a newer one
				return idx
			}
			ops[j].alive = false
		}
		latest[k] = idx
		return idx
	}

	type tableAndKey struct {
		def  *tableDef
		key  defKey
		proj *projection
	}
	byTable := map[*tidemark.Table]tableAndKey{}
	for i := range b.Changes {
		c := &b.Changes[i]
		perChange[i] = [2]int{-1, -1}
		if c.Table == nil {
			return nil, fmt.Errorf("change %d: no table", i)
		}
		td, ok := byTable[c.Table]
		if !ok {
			// Table values are shared between changes: look each up (and
			// compute its fingerprint) once per batch.
			d, dk, err := s.def(c.Table)
			if err != nil {
				return nil, err
			}
			td = tableAndKey{d, dk, s.projectionOf(dk)}
			if td.proj != nil {
				td.def, td.key = td.proj.def, td.proj.key
			}
			byTable[c.Table] = td
		}
		d, dk, pr := td.def, td.key, td.proj
		check := func(name string, row []any) error {
			if row == nil {
				return fmt.Errorf("change %d (%s of %s, version %s): no %s image", i, c.Op, c.Table.ID, c.Version, name)
			}
			if len(row) != len(c.Table.Columns) {
				return fmt.Errorf("change %d (%s of %s, version %s): %s image has %d values for %d columns",
					i, c.Op, c.Table.ID, c.Version, name, len(row), len(c.Table.Columns))
			}
			return nil
		}
		switch c.Op {
		case tidemark.OpInsert, tidemark.OpRead:
			if err := check("after", c.After); err != nil {
				return nil, err
			}
			perChange[i][0] = add(i, d, dk, pr, c.After, false, c)
		case tidemark.OpUpdate:
			if err := check("after", c.After); err != nil {
				return nil, err
			}
			if c.Before != nil {
				if err := check("before", c.Before); err != nil {
					return nil, err
				}
				if c.Table.KeyOf(c.Before) != c.Table.KeyOf(c.After) {
					// Key change: the old key goes, the new key is
					// upserted, both at the change's version.
					perChange[i][1] = add(i, d, dk, pr, c.Before, true, c)
				}
			}
			perChange[i][0] = add(i, d, dk, pr, c.After, false, c)
		case tidemark.OpDelete:
			if err := check("before", c.Before); err != nil {
				return nil, err
			}
			perChange[i][1] = add(i, d, dk, pr, c.Before, true, c)
		default:
			return nil, fmt.Errorf("change %d of %s: unknown op %s", i, c.Table.ID, c.Op)
		}
	}

	p := &batchPlan{}
	for i := range b.Changes {
		u, dl := perChange[i][0], perChange[i][1]
		switch {
		case u >= 0 && ops[u].alive:
			ops[u].code = opUpsert
			if dl >= 0 && ops[dl].alive {
				ops[dl].code = opKeyGone
			}
		case dl >= 0 && ops[dl].alive:
			ops[dl].code = opDelete
			if ops[dl].def.soft && b.Changes[i].KeyOnly {
				ops[dl].code = opMarkDeleted
			}
		default:
			p.coalesced++
		}
	}

	// Each table's encoded rows take about what the tailer estimated for
	// its changes: size the buffers once.
	sizes := map[*tableDef][2]int{}
	for i := range ops {
		if o := &ops[i]; o.alive {
			sz := sizes[o.def]
			sizes[o.def] = [2]int{sz[0] + b.Changes[o.change].Size, sz[1] + 1}
		}
	}
	groups := map[*tableDef]*groupPlan{}
	for i := range ops {
		o := &ops[i]
		if !o.alive {
			continue
		}
		g := groups[o.def]
		if g == nil {
			sz := sizes[o.def]
			g = &groupPlan{def: o.def, key: o.key, rows: copyRows{buf: make([]byte, 0, sz[0]), rows: make([]copyRow, 0, sz[1])}}
			groups[o.def] = g
			p.groups = append(p.groups, g)
		}
		if err := encodeRow(&g.rows, o); err != nil {
			var ve *tidemark.ValueError
			if errors.As(err, &ve) {
				// A value the target cannot hold (a NUL byte in text or
				// in a JSON string, a NULL key…) is its table's problem
				// only: the table is quarantined, on every path (stream,
				// snapshot, catch-up), naming the column.
				return nil, &tidemark.TableError{Table: o.def.id, Err: err}
			}
			return nil, err
		}
		if len(g.rows.rows) == 1 || o.version.Compare(g.minVersion) < 0 {
			g.minVersion = o.version
		}
		if o.del && o.version.Compare(g.maxDelete) > 0 {
			g.maxDelete = o.version
		}
		switch o.code {
		case opUpsert:
			g.nUpsert++
			if op := b.Changes[o.change].Op; op == tidemark.OpInsert || op == tidemark.OpRead {
				g.nInserts++
			}
		case opDelete:
			g.nDelete++
		case opKeyGone:
			g.nKeyGone++
		case opMarkDeleted:
			g.nMark++
		}
	}
	return p, nil
}

// encodeRow encodes one operation's fields after _tm_op (see copyRows).
func encodeRow(r *copyRows, o *plannedOp) error {
	d := o.def
	cols := d.table.Columns
	start := len(r.buf)
	for ci := range cols {
		v := o.row[ci]
		if o.del && !d.soft && !d.keySet[ci] {
			r.buf = appendNull(r.buf) // a hard delete needs only the key
			continue
		}
		if v == nil && d.keySet[ci] {
			r.buf = r.buf[:start]
			return &tidemark.ValueError{Table: d.id, Column: cols[ci].Name, Detail: "business key column is NULL"}
		}
		var detail string
		if r.buf, detail = appendValue(r.buf, &cols[ci], v); detail != "" {
			r.buf = r.buf[:start]
			return &tidemark.ValueError{Table: d.id, Column: cols[ci].Name, Detail: detail}
		}
	}
	if o.version.Seq > math.MaxInt64 || o.version.Index > math.MaxInt32 {
		r.buf = r.buf[:start]
		return fmt.Errorf("change of %s: version %s does not fit the %s bigint / %s integer columns", d.id, o.version, colSeq, colIdx)
	}
	r.buf = binary.BigEndian.AppendUint32(r.buf, 8)
	r.buf = binary.BigEndian.AppendUint64(r.buf, o.version.Seq)
	r.buf = binary.BigEndian.AppendUint32(r.buf, 4)
	r.buf = binary.BigEndian.AppendUint32(r.buf, o.version.Index)
	if o.commit.IsZero() {
		r.buf = appendNull(r.buf)
	} else {
		r.buf = appendTimestamptz(r.buf, o.commit)
	}
	r.rows = append(r.rows, copyRow{op: o.code, start: start, end: len(r.buf)})
	return nil
}
