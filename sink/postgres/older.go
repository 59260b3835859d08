package postgres

import (
	"context"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"tidemark"
)

// Older layouts. A sink can be asked to write rows of a layout older than
// the one the target table was evolved to:
//
//   - a scale-out applier: the partitions of a table reach a schema change
//     at different times, and a partition may move to a member that never
//     applied its layout;
//   - tidemark run, when the stream replays history the target already
//     holds: the checkpoint deleted to start over, or a start_position
//     behind it (docs/FAILOVER.md), replays the table's rows from before
//     its ALTERs into the table as it is now (nemesis seed 219).
//
// Evolving the table back to it (the older layout lacks the newer columns,
// which it would mark as dropped, and a later ensure of the newer layout or
// the replayed ADD/RENAME COLUMN would then drop and re-add them, or refuse
// a widened type as a narrowing) wipes values or quarantines the table. So
// a layout whose version is older than the one recorded in the table's
// alignment never changes the table's columns or its alignment: its rows
// are written into the newer table (under the version guard, which skips
// the replayed changes the table already holds), each column the target
// holds (with a type that can hold the layout's) written, the others left
// out (the newer layout dropped them, or the table was dropped and created
// anew: the partition's own DROP record removes those rows later). A NOT
// NULL column the older layout does not write is made nullable, like a
// column the source dropped.
//
// The version of a layout is Table.Since when the source knows it (the
// scale-out tailer's schema records), else the version of a change written
// with it (layoutVersion): the alignment records the version of the first
// change the table was created or evolved for, and every change of another
// layout below it is from before that layout, in one ordered stream.

// projection is how rows of an older layout are written: its columns keep
// (indexes into the layout's columns) as the table def pdef (key pkey), or
// not at all (skip).
type projection struct {
	def  *tableDef
	key  defKey
	keep []int
	// skip: the layout's rows are not written at all (its key does not
	// fit a target table created anew after it), counted as skipped.
	skip bool
}

// project returns row's values of the kept columns.
func (p *projection) project(row []any) []any {
	if row == nil {
		return nil
	}
	out := make([]any, len(p.keep))
	for i, j := range p.keep {
		out[i] = row[j]
	}
	return out
}

// layoutVersion is the version of d's layout: d.table.Since when known,
// else at (the version of a change written with it, or zero).
func layoutVersion(d *tableDef, at tidemark.Version) tidemark.Version {
	if d.table.Since != (tidemark.Version{}) {
		return d.table.Since
	}
	return at
}

// olderLayout reports whether a layout of version at is older than the one
// target t was last evolved to.
func olderLayout(at tidemark.Version, t *targetTable) bool {
	if at == (tidemark.Version{}) || t.align == nil {
		return false
	}
	return t.align.since().Compare(at) > 0
}

// fitOlder prepares the rows of d's older layout (version at) for target t
// (in ensureTx's transaction): it returns the projection, nil when every
// column fits.
func (s *Sink) fitOlder(ctx context.Context, tx pgx.Tx, d *tableDef, at tidemark.Version, t *targetTable) (*projection, error) {
	var keep []int
	var omitted []string
	for i, c := range d.table.Columns {
		have, ok := t.types[c.Name]
		if want := canonType(d.types[i]); ok && (have == want || pgFits(want, have)) {
			keep = append(keep, i)
			continue
		}
		if d.keySet[i] {
			// A newer layout never changes or narrows the key of the
			// table (evolve refuses it), so the target was created
			// anew after these rows: a DROP + CREATE with another key,
			// or a snapshot of the new table. Their stream's own DROP
			// record (or the snapshot's end) removes every row of the
			// older table: they are skipped, not written (nemesis seeds
			// 577059053311, 907892200853).
			s.log.Info("rows of an older layout whose key the target table, created anew since, does not have: skipped (the partition's DROP record removes the older table's rows)",
				"table", d.display, "key_column", c.Name, "layout_version", at.String(), "table_version", t.align.since().String())
			return &projection{skip: true}, nil
		}
		omitted = append(omitted, c.Name)
	}
	written := map[string]bool{}
	for _, i := range keep {
		written[d.table.Columns[i].Name] = true
	}
	var relaxed []string
	for name, nn := range t.notNull {
		if nn && !written[name] && !strings.HasPrefix(name, reservedPrefix) && !slices.Contains(t.key, name) {
			relaxed = append(relaxed, name)
		}
	}
	slices.Sort(relaxed)
	for _, name := range relaxed {
		stmt := "ALTER TABLE " + d.qname + " ALTER COLUMN " + tidemark.QuotePostgres(name) + " DROP NOT NULL"
		s.log.Info("rows of an older layout lack a NOT NULL column of the target table; making it nullable", "table", d.display, "column", name, "layout_version", at.String())
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return nil, d.wrap("alter table", err)
		}
	}
	s.log.Info("rows of an older layout of the table (a replay of its history, or a partition behind a schema change): written into the newer target table, which keeps its layout",
		"table", d.display, "layout_version", at.String(), "table_version", t.align.since().String(), "columns_left_out", strings.Join(omitted, ","))
	if len(omitted) == 0 {
		return nil, nil
	}
	pt := &tidemark.Table{ID: d.table.ID, Since: d.table.Since}
	for _, i := range keep {
		pt.Columns = append(pt.Columns, d.table.Columns[i])
	}
	for _, k := range d.table.Key {
		pt.Key = append(pt.Key, slices.Index(keep, k))
	}
	pd, pk, err := s.def(pt)
	if err != nil {
		return nil, err
	}
	return &projection{def: pd, key: pk, keep: keep}, nil
}

// projectionOf returns the projection of a layout's rows (nil: none).
func (s *Sink) projectionOf(k defKey) *projection {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.projections[k]
}

// setProjection records (p not nil) or forgets a layout's projection; the
// projected def counts as ensured with it.
func (s *Sink) setProjection(k defKey, p *projection) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p == nil {
		delete(s.projections, k)
		return
	}
	s.projections[k] = p
	s.ensured[p.key] = true
}
