package dedupe

import (
	"fmt"
	"time"

	"tidemark"
)

// t0 is the base of every event time in the tests.
var t0 = time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)

// newTable returns a table (id BIGINT key, val TEXT, updated_at DATETIME).
func newTable(db, name string) *tidemark.Table {
	return &tidemark.Table{
		ID: tidemark.TableID{Database: db, Name: name},
		Columns: []tidemark.Column{
			{Name: "id", Kind: tidemark.KindInt, Bits: 64},
			{Name: "val", Kind: tidemark.KindText, Nullable: true},
			{Name: "updated_at", Kind: tidemark.KindDateTime, Nullable: true},
		},
		Key: []int{0},
	}
}

var (
	tabA = newTable("shop", "orders")
	tabB = newTable("shop", "refunds")
)

func ver(seq uint64, idx uint32) tidemark.Version { return tidemark.Version{Seq: seq, Index: idx} }

// sec returns t0 + s seconds.
func sec(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// img is a row image of the test tables; ts is the updated_at value (nil or
// a time.Time).
func img(id int64, val string, ts any) []any { return []any{id, val, ts} }

func mk(op tidemark.Op, t *tidemark.Table, before, after []any, v tidemark.Version, commit time.Time) tidemark.Change {
	return tidemark.Change{Op: op, Table: t, Before: before, After: after, Version: v, CommitTime: commit, Size: 100}
}

func ins(id int64, val string, v tidemark.Version, commit time.Time) tidemark.Change {
	return mk(tidemark.OpInsert, tabA, nil, img(id, val, nil), v, commit)
}

func upd(id int64, from, to string, v tidemark.Version, commit time.Time) tidemark.Change {
	return mk(tidemark.OpUpdate, tabA, img(id, from, nil), img(id, to, nil), v, commit)
}

func move(from, to int64, val string, v tidemark.Version, commit time.Time) tidemark.Change {
	return mk(tidemark.OpUpdate, tabA, img(from, val, nil), img(to, val, nil), v, commit)
}

func del(id int64, val string, v tidemark.Version, commit time.Time) tidemark.Change {
	return mk(tidemark.OpDelete, tabA, img(id, val, nil), nil, v, commit)
}

func read(id int64, val string, v tidemark.Version, commit time.Time) tidemark.Change {
	return mk(tidemark.OpRead, tabA, nil, img(id, val, nil), v, commit)
}

func on(t *tidemark.Table, c tidemark.Change) tidemark.Change { c.Table = t; return c }

// describe formats a change for test failures.
func describe(c tidemark.Change) string {
	if c.Table == nil {
		return fmt.Sprintf("%s <nil table> %s", c.Op, c.Version)
	}
	s := fmt.Sprintf("%s %s %s", c.Op, c.Table.ID.Name, c.Version)
	if c.Before != nil {
		s += fmt.Sprintf(" before=%v", c.Before[:2])
	}
	if c.After != nil {
		s += fmt.Sprintf(" after=%v", c.After[:2])
	}
	return s
}

func describeAll(cs []tidemark.Change) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = describe(c)
	}
	return out
}

// row is a target row of the model.
type row struct {
	img     []any
	version tidemark.Version
	deleted bool // a tombstone (soft-delete model)
}

type modelKey struct {
	table tidemark.TableID
	key   tidemark.Key
}

// model is an in-memory target that applies a change only if its version is
// newer than the row's, like the sinks. With tombstones a deleted row keeps
// its version (soft delete); without, it is removed and forgotten (hard
// delete). An update that changes the business key deletes the old key and
// upserts the new one, each guarded.
type model struct {
	tombstones bool
	rows       map[modelKey]row
}

func newModel(tombstones bool) *model {
	return &model{tombstones: tombstones, rows: make(map[modelKey]row)}
}

func (m *model) apply(cs ...tidemark.Change) {
	for _, c := range cs {
		k := modelKey{c.Table.ID, c.Key()}
		if c.Op == tidemark.OpUpdate && c.Before != nil {
			if old := c.KeyBefore(); old != k.key {
				m.delete(modelKey{c.Table.ID, old}, c.Version)
			}
		}
		if c.Op == tidemark.OpDelete {
			m.delete(k, c.Version)
		} else {
			m.upsert(k, c.After, c.Version)
		}
	}
}

func (m *model) upsert(k modelKey, image []any, v tidemark.Version) {
	if r, ok := m.rows[k]; ok && r.version.Compare(v) >= 0 {
		return
	}
	m.rows[k] = row{img: image, version: v}
}

func (m *model) delete(k modelKey, v tidemark.Version) {
	r, ok := m.rows[k]
	if ok && r.version.Compare(v) >= 0 {
		return
	}
	if m.tombstones {
		m.rows[k] = row{version: v, deleted: true}
		return
	}
	delete(m.rows, k)
}

// diff returns the differences between m and o, empty when equal.
func (m *model) diff(o *model) []string {
	var out []string
	for k, r := range m.rows {
		q, ok := o.rows[k]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s %q: want %s, got absent", k.table.Name, k.key, fmtRow(r)))
		case fmtRow(r) != fmtRow(q):
			out = append(out, fmt.Sprintf("%s %q: want %s, got %s", k.table.Name, k.key, fmtRow(r), fmtRow(q)))
		}
	}
	for k, q := range o.rows {
		if _, ok := m.rows[k]; !ok {
			out = append(out, fmt.Sprintf("%s %q: want absent, got %s", k.table.Name, k.key, fmtRow(q)))
		}
	}
	return out
}

func fmtRow(r row) string {
	if r.deleted {
		return "deleted@" + r.version.String()
	}
	return fmt.Sprintf("%v@%s", r.img, r.version)
}
