package dedupe

import "tidemark"

// Coalesce replaces the changes of each key in one batch by their net change
// and returns the result with the number of changes merged away
// (len(changes) − len(result), what tidemark.ApplyStats.Coalesced counts).
// It reuses the input slice: the elements after the returned ones are zeroed.
//
// Order: the net change of a key takes the place of the key's first change
// in the batch (order of first appearance), so the changes of one key stay
// in input order relative to each other and to every change touching the
// same key.
//
// A group is a run of changes to one table and business key. Within a group,
// a change whose version is not newer than the newest one already in the
// group is merged away (a version-guarded sink would skip it), and the net
// change carries the newest version, its commit time and its images:
//
//   - ... → delete: a delete with the last Before image. This includes
//     insert + delete, in both delete modes; see below.
//   - insert → ... → insert/update/read: an insert with the final image.
//   - ... → delete → insert → ...: an insert (the sinks upsert it) with the
//     final image, so the row ends present.
//   - update → ... → update: an update with the first Before and the last
//     After. A read followed by updates is the same, with the read's image as
//     Before; reads only are the last read.
//
// Insert + delete nets to the delete, not to nothing, also with hard
// deletes. A batch is not all the target has seen: after a restart from an
// older checkpoint or a binlog replay, the target may already hold the
// insert (committed by an earlier batch that ended between the insert and the
// delete) while the replayed batch holds both. Emitting nothing would leave
// that row in the target for good; the delete removes it, and a delete of an
// absent row, or of a row with a newer version, is a no-op for the sink.
// softDelete, the sink's delete mode, therefore does not change the result
// today; it is part of the signature so that the call site states the mode.
//
// Barriers: an update that changes the business key is emitted as is and
// ends the groups of both its old and new key, and a change whose *Table
// differs from its group's (a schema change inside the batch) starts a new
// group. A change without a Table is passed through unchanged.
//
// Size of a net change: the Size of its newest change, plus the Size of the
// first change when the net update keeps that change's Before image — an
// upper bound on the memory it references.
func Coalesce(changes []tidemark.Change, softDelete bool) ([]tidemark.Change, int) {
	var co coalescer
	return co.coalesce(changes, softDelete)
}

// groupKey identifies the business key of one table within a batch.
type groupKey struct {
	table tidemark.TableID
	key   tidemark.Key
}

// group is the changes of one key within a batch, merged so far.
type group struct {
	slot      int             // index of the net change in the output
	first     tidemark.Change // first change of the group
	last      tidemark.Change // newest-version change of the group
	advanced  bool            // last is not first
	recreated bool            // an insert or delete came after first
	allReads  bool            // every merged change is a read
}

// coalescer holds scratch space that Window.Coalesce reuses between batches.
type coalescer struct {
	open   map[groupKey]int // groups still accepting changes, index in groups
	groups []group
}

func (co *coalescer) coalesce(changes []tidemark.Change, _ bool) ([]tidemark.Change, int) {
	if len(changes) < 2 {
		return changes, 0
	}
	if co.open == nil {
		co.open = make(map[groupKey]int, len(changes))
	}
	out := changes[:0]
	for i := range changes {
		c := changes[i]
		if c.Table == nil {
			out = append(out, c)
			continue
		}
		key := c.Key()
		gk := groupKey{c.Table.ID, key}
		if old, changed := movedFrom(&c, key); changed {
			delete(co.open, groupKey{c.Table.ID, old})
			delete(co.open, gk)
			out = append(out, c)
			continue
		}
		gi, ok := co.open[gk]
		if ok && co.groups[gi].first.Table != c.Table {
			ok = false
		}
		if !ok {
			co.open[gk] = len(co.groups)
			co.groups = append(co.groups, group{slot: len(out), first: c, last: c, allReads: c.Op == tidemark.OpRead})
			out = append(out, c)
			continue
		}
		g := &co.groups[gi]
		if c.Version.Compare(g.last.Version) <= 0 {
			continue // stale inside the batch: a guarded sink would skip it
		}
		g.last = c
		g.advanced = true
		switch c.Op {
		case tidemark.OpInsert, tidemark.OpDelete:
			g.recreated = true
			g.allReads = false
		case tidemark.OpUpdate:
			g.allReads = false
		}
	}
	for i := range co.groups {
		if g := &co.groups[i]; g.advanced {
			out[g.slot] = g.net()
		}
	}
	clear(changes[len(out):])
	clear(co.open)
	clear(co.groups) // drop references to the batch's images
	co.groups = co.groups[:0]
	return out, len(changes) - len(out)
}

// net returns the net change of an advanced group (see Coalesce).
func (g *group) net() tidemark.Change {
	n := g.last
	switch {
	case n.Op == tidemark.OpDelete:
		n.After = nil
	case g.first.Op == tidemark.OpInsert || g.first.Op == tidemark.OpDelete || g.recreated:
		n.Op = tidemark.OpInsert
		n.Before = nil
	case g.allReads:
		// The last read.
	default:
		n.Op = tidemark.OpUpdate
		if g.first.Op == tidemark.OpUpdate {
			n.Before = g.first.Before
		} else {
			n.Before = g.first.After
		}
		n.Size += g.first.Size
	}
	return n
}
