package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"tidemark"
)

// JSON-unknown columns (tidemark.Column.JSONUnknown). MariaDB's JSON is a
// LONGTEXT with a json_valid check that only information_schema shows, and
// a tailer started after the source renamed or dropped a JSON column (or
// dropped the table and created it anew), at a checkpoint before that,
// decodes rows of the older layout without knowing that the column was
// JSON: it announces it as text marked JSONUnknown (nemesis seed
// 574095280397). The target knows: the sink resolves each such column once
// per layout and process, at its entry (Apply, EnsureTable), before the
// layout's definition is built:
//
//   - the target table's alignment lists the column as json, or does not
//     list it (a kept column, a table without an alignment) and the
//     column's type is json or jsonb: the column is JSON for that layout,
//     and its string values become tidemark.JSON (one that is not valid
//     JSON is the encoder's error naming table and column, as for any JSON
//     value);
//   - anything else (listed as text, no such column, no target table yet):
//     text.
//
// The resolved layout is the one a tailer that knew the column would have
// announced (same Fingerprint), so a resolution causes no layout change of
// its own. The flag never reaches the alignment.

// resolveKey names one announced layout with its JSON-unknown columns.
type resolveKey struct {
	id          tidemark.TableID
	fingerprint string
	unknown     string // the JSON-unknown columns, comma-separated
}

// resolution is how a layout with JSON-unknown columns is written: as table
// (no column JSONUnknown), its values in the columns json converted from
// string to tidemark.JSON.
type resolution struct {
	table *tidemark.Table
	json  []int
}

// convert returns row with the JSON columns' strings as tidemark.JSON (a
// copy when anything changes; nil stays nil).
func (r *resolution) convert(row []any) []any {
	if row == nil || len(r.json) == 0 {
		return row
	}
	out := slices.Clone(row)
	for _, i := range r.json {
		if i < len(out) {
			if v, ok := out[i].(string); ok {
				out[i] = tidemark.JSON(v)
			}
		}
	}
	return out
}

// resolveBatch returns b with the tables of its JSON-unknown columns
// resolved (b itself when it has none; a copy otherwise: the batch may be
// another sink's too, a fan-out's).
func (s *Sink) resolveBatch(ctx context.Context, b *tidemark.Batch) (*tidemark.Batch, error) {
	var out *tidemark.Batch
	var byTable map[*tidemark.Table]*resolution
	var last *tidemark.Table // changes of one table come in runs
	lastUnknown := false
	for i := range b.Changes {
		c := &b.Changes[i]
		if c.Table != last {
			last, lastUnknown = c.Table, c.Table != nil && c.Table.HasJSONUnknown()
		}
		if !lastUnknown {
			continue
		}
		r, ok := byTable[c.Table]
		if !ok {
			var err error
			if r, err = s.resolve(ctx, c.Table); err != nil {
				return nil, err
			}
			if byTable == nil {
				byTable = map[*tidemark.Table]*resolution{}
			}
			byTable[c.Table] = r
		}
		if out == nil {
			nb := *b
			nb.Changes = slices.Clone(b.Changes)
			out = &nb
		}
		oc := &out.Changes[i]
		oc.Table, oc.Before, oc.After = r.table, r.convert(c.Before), r.convert(c.After)
	}
	if out == nil {
		return b, nil
	}
	return out, nil
}

// resolveTable returns t with its JSON-unknown columns resolved (t itself
// when it has none).
func (s *Sink) resolveTable(ctx context.Context, t *tidemark.Table) (*tidemark.Table, error) {
	if !t.HasJSONUnknown() {
		return t, nil
	}
	r, err := s.resolve(ctx, t)
	if err != nil {
		return nil, err
	}
	return r.table, nil
}

// resolve resolves the JSON-unknown columns of t from its target table,
// once per layout and process.
func (s *Sink) resolve(ctx context.Context, t *tidemark.Table) (*resolution, error) {
	var unknown []string
	for _, c := range t.Columns {
		if c.JSONUnknown {
			unknown = append(unknown, c.Name)
		}
	}
	k := resolveKey{id: t.ID, fingerprint: t.Fingerprint(), unknown: strings.Join(unknown, ",")}
	s.mu.Lock()
	r, ok := s.resolved[k]
	s.mu.Unlock()
	if ok {
		return r, nil
	}
	_, _, qname, err := s.targetOf(t.ID)
	if err != nil {
		return nil, err
	}
	var target *targetTable
	err = s.retry(ctx, "read the target schema of "+qname, func(ctx context.Context) error {
		return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			var err error
			target, err = readTarget(ctx, tx, qname)
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("resolve the columns of %s the source could not tell from JSON: %w", t.ID, redact(err, s.secret))
	}
	rt := *t
	rt.Columns = slices.Clone(t.Columns)
	r = &resolution{table: &rt}
	var asJSON, asText []string
	for i := range rt.Columns {
		c := &rt.Columns[i]
		if !c.JSONUnknown {
			continue
		}
		c.JSONUnknown = false
		if target.knowsJSON(c.Name) {
			c.Kind = tidemark.KindJSON
			r.json = append(r.json, i)
			asJSON = append(asJSON, c.Name)
		} else {
			asText = append(asText, c.Name)
		}
	}
	s.log.Info("columns the source could not tell from JSON (a layout older than the source's catalog): resolved from the target table",
		"table", qname, "source_table", t.ID.String(), "json", strings.Join(asJSON, ","), "text", strings.Join(asText, ","))
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev, ok := s.resolved[k]; ok {
		return prev, nil // a concurrent resolution won: one *Table per layout
	}
	s.resolved[k] = r
	return r, nil
}

// knowsJSON reports whether the target table has the column as JSON: its
// alignment says json, or, when the alignment does not list the column (a
// kept column, a table without an alignment), its type is json or jsonb.
func (t *targetTable) knowsJSON(name string) bool {
	if !t.exists {
		return false
	}
	if t.align != nil {
		if c, ok := t.align.column(name); ok {
			return c.Kind == tidemark.KindJSON
		}
	}
	typ := t.types[name]
	return typ == "jsonb" || typ == "json"
}
