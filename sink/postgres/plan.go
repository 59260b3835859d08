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
	// skipped counts the changes of an older layout that are not written
	// (older.go: a target table created anew after them).
	skipped int
	// tombNext is the tombstone pruning state after the last attempt's
	// transaction (tombstones.go), remembered once it commits.
	tombNext *tombSource
	// heldBuilt are the tables whose held unique constraints the last
	// attempt's transaction built (heldunique.go).
	heldBuilt []tidemark.TableID
	// heldDue are the tables whose held unique constraints the batch's
	// checkpoint is past: its transaction builds them.
	heldDue []tidemark.TableID
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
	// nLoad counts the operations of a snapshot or catch-up: rows it read
	// (OpRead) and deletes of its key diff (KeyOnly). A group of only
	// those is a load (ensure defers SET NOT NULL).
	nLoad int
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
//
// Three phases: each change becomes one or two operations (add), every
// operation that lost to a newer one of its key is dropped and the rest
// get their code (settle), and the survivors are encoded per target table
// (group).
func (s *Sink) plan(b *tidemark.Batch) (*batchPlan, error) {
	pl := &planner{
		s:         s,
		ops:       make([]plannedOp, 0, len(b.Changes)),
		latest:    make(map[planSlot]int, len(b.Changes)),
		perChange: make([][2]int, len(b.Changes)),
		byTable:   map[*tidemark.Table]planTable{},
	}
	for i := range b.Changes {
		if err := pl.change(i, &b.Changes[i]); err != nil {
			return nil, err
		}
	}
	p := &batchPlan{coalesced: pl.settle(b), skipped: pl.skipped}
	if err := pl.group(b, p); err != nil {
		return nil, err
	}
	return p, nil
}

// skippedOp marks, in planner.perChange, a change whose rows are not
// written (projection.skip).
const skippedOp = -2

// planner is the state of one plan.
type planner struct {
	s   *Sink
	ops []plannedOp
	// latest is the newest operation of each target row.
	latest map[planSlot]int
	// perChange holds, per change, the index of its upsert and of its
	// delete operation, or -1.
	perChange [][2]int
	// byTable: Table values are shared between changes, so each is looked
	// up (and its fingerprint computed) once per batch.
	byTable map[*tidemark.Table]planTable
	// skipped counts the changes of a layout whose rows are not written
	// (projection.skip).
	skipped int
}

// planSlot is one target row: the quoted target table and the business key.
type planSlot struct {
	target string
	key    tidemark.Key
}

// planTable is how a source table's rows are written: as def (and its
// key), projected by proj when the target is an older layout (older.go).
type planTable struct {
	def  *tableDef
	key  defKey
	proj *projection
}

// tableOf returns how c's rows are written.
func (pl *planner) tableOf(i int, c *tidemark.Change) (planTable, error) {
	if c.Table == nil {
		return planTable{}, fmt.Errorf("change %d: no table", i)
	}
	if td, ok := pl.byTable[c.Table]; ok {
		return td, nil
	}
	d, dk, err := pl.s.def(c.Table)
	if err != nil {
		return planTable{}, err
	}
	td := planTable{d, dk, pl.s.projectionOf(dk)}
	if td.proj != nil && !td.proj.skip {
		td.def, td.key = td.proj.def, td.proj.key
	}
	pl.byTable[c.Table] = td
	return td, nil
}

// change plans change i: an upsert of its after image, a delete of its
// before image, or both for an update that changed the key (the old key
// goes, the new key is upserted, both at the change's version).
func (pl *planner) change(i int, c *tidemark.Change) error {
	pl.perChange[i] = [2]int{-1, -1}
	td, err := pl.tableOf(i, c)
	if err != nil {
		return err
	}
	if td.proj != nil && td.proj.skip {
		pl.perChange[i] = [2]int{skippedOp, skippedOp}
		pl.skipped++ // older than a table created anew (older.go)
		return nil
	}
	switch c.Op {
	case tidemark.OpInsert, tidemark.OpRead:
		if err := checkImage(i, c, "after", c.After); err != nil {
			return err
		}
		pl.perChange[i][0] = pl.add(i, td, c.After, false, c)
	case tidemark.OpUpdate:
		if err := checkImage(i, c, "after", c.After); err != nil {
			return err
		}
		if c.Before != nil {
			if err := checkImage(i, c, "before", c.Before); err != nil {
				return err
			}
			if c.Table.KeyOf(c.Before) != c.Table.KeyOf(c.After) {
				pl.perChange[i][1] = pl.add(i, td, c.Before, true, c)
			}
		}
		pl.perChange[i][0] = pl.add(i, td, c.After, false, c)
	case tidemark.OpDelete:
		if err := checkImage(i, c, "before", c.Before); err != nil {
			return err
		}
		pl.perChange[i][1] = pl.add(i, td, c.Before, true, c)
	default:
		return fmt.Errorf("change %d of %s: unknown op %s", i, c.Table.ID, c.Op)
	}
	return nil
}

// checkImage checks that change i has a row image name of its table's
// width.
func checkImage(i int, c *tidemark.Change, name string, row []any) error {
	if row == nil {
		return fmt.Errorf("change %d (%s of %s, version %s): no %s image", i, c.Op, c.Table.ID, c.Version, name)
	}
	if len(row) != len(c.Table.Columns) {
		return fmt.Errorf("change %d (%s of %s, version %s): %s image has %d values for %d columns",
			i, c.Op, c.Table.ID, c.Version, name, len(row), len(c.Table.Columns))
	}
	return nil
}

// add plans a row of c (in c.Table's layout) as td; td.proj, when not
// nil, writes it without the columns an older layout's target lacks. Of
// two operations on one target row the older version loses (the later one
// in batch order on a tie). It returns the operation's index.
func (pl *planner) add(i int, td planTable, row []any, del bool, c *tidemark.Change) int {
	idx := len(pl.ops)
	k := planSlot{td.def.qname, c.Table.KeyOf(row)}
	if td.proj != nil {
		row = td.proj.project(row)
	}
	pl.ops = append(pl.ops, plannedOp{change: i, def: td.def, key: td.key, row: row, del: del,
		version: c.Version, commit: c.CommitTime, alive: true})
	if j, ok := pl.latest[k]; ok {
		if pl.ops[j].version.Compare(c.Version) > 0 {
			pl.ops[idx].alive = false // an older change after a newer one
			return idx
		}
		pl.ops[j].alive = false
	}
	pl.latest[k] = idx
	return idx
}

// settle gives each change's surviving operations their code and returns
// the number of changes that left none (coalesced into a newer one).
func (pl *planner) settle(b *tidemark.Batch) int {
	ops, coalesced := pl.ops, 0
	for i := range b.Changes {
		u, dl := pl.perChange[i][0], pl.perChange[i][1]
		switch {
		case u >= 0 && ops[u].alive:
			ops[u].code = opUpsert
			if dl >= 0 && ops[dl].alive {
				ops[dl].code = opKeyGone
			}
		case u == skippedOp:
			// counted in pl.skipped
		case dl >= 0 && ops[dl].alive:
			ops[dl].code = opDelete
			if ops[dl].def.soft && b.Changes[i].KeyOnly {
				ops[dl].code = opMarkDeleted
			}
		default:
			coalesced++
		}
	}
	return coalesced
}

// group encodes the surviving operations into one groupPlan per target
// table, in order of first appearance.
func (pl *planner) group(b *tidemark.Batch, p *batchPlan) error {
	// Each table's encoded rows take about what the tailer estimated for
	// its changes: size the buffers once.
	sizes := map[*tableDef][2]int{}
	for i := range pl.ops {
		if o := &pl.ops[i]; o.alive {
			sz := sizes[o.def]
			sizes[o.def] = [2]int{sz[0] + b.Changes[o.change].Size, sz[1] + 1}
		}
	}
	groups := map[*tableDef]*groupPlan{}
	for i := range pl.ops {
		o := &pl.ops[i]
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
		c := &b.Changes[o.change]
		if err := g.add(o, c.Op); err != nil {
			return err
		}
		if c.Op == tidemark.OpRead || (c.Op == tidemark.OpDelete && c.KeyOnly) {
			g.nLoad++
		}
	}
	return nil
}

// add encodes o (of a change with op) into g and counts it.
func (g *groupPlan) add(o *plannedOp, op tidemark.Op) error {
	if err := encodeRow(&g.rows, o); err != nil {
		var ve *tidemark.ValueError
		if errors.As(err, &ve) {
			// A value the target cannot hold (a NUL byte in text or
			// in a JSON string, a NULL key…) is its table's problem
			// only: the table is quarantined, on every path (stream,
			// snapshot, catch-up), naming the column.
			return &tidemark.TableError{Table: o.def.id, Err: err}
		}
		return err
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
		if op == tidemark.OpInsert || op == tidemark.OpRead {
			g.nInserts++
		}
	case opDelete:
		g.nDelete++
	case opKeyGone:
		g.nKeyGone++
	case opMarkDeleted:
		g.nMark++
	}
	return nil
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
