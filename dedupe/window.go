// Package dedupe drops duplicate changes inside an event-time watermark
// window, with bounded memory, and never loses a late change. It sits between
// the source and the sink: the pipeline runs every chunk through
// Window.Filter (tidemark.Filter) before it is batched for Sink.Apply. It does
// not merge the changes of one key inside a batch: that is the PostgreSQL
// sink's job (sink/postgres, plan), counted in tidemark.ApplyStats.Coalesced.
//
// It is Spark's dropDuplicatesWithinWatermark made safe for CDC:
//
//   - The event time of a change is the value of a configured event-time
//     column (a UTC time.Time) or, by default, the source commit time. The
//     watermark is the largest event time seen minus Config.Delay; event
//     times further ahead of the wall clock than Config.Tolerance are clamped
//     first, so a far-future row cannot push the watermark forward and empty
//     the window.
//   - A change is dropped only when applying it would be a no-op or a
//     regression: the last change passed for the same table and business key
//     carries the same version (DroppedDuplicate) or a newer one
//     (DroppedRegression), compared with tidemark.Version.Compare. Equal row
//     images never make a duplicate: A→B→A on one key ends as A.
//   - A change is never dropped for being late: a change whose event time is
//     below the watermark is passed on without a duplicate check
//     (PassedLate) and forgets the state of its keys, and a key without
//     state (never seen, forgotten, or evicted by the watermark or by the
//     MaxKeys bound) never has its changes dropped. The sink's "only if
//     newer" version guard is the backstop for everything that passes.
//
// The state remembers what was passed, not what was committed, so a Window
// must not see a replay of changes it passed that never reached the target:
// they would be dropped as duplicates. A Window lives as long as one
// tidemark.Pipeline, which never streams such a replay: its apply loop
// applies every change it read before it returns, and a failed apply ends
// the process (the daemon builds a new Window at the next start).
package dedupe

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"tidemark"
)

var _ tidemark.Filter = (*Window)(nil)

// noTime is the largest event time before any change is seen. It is far
// below any real event time (year 1 is about -6.2e16 µs) and far enough above
// math.MinInt64 that subtracting a Delay cannot overflow.
const noTime = math.MinInt64 / 4

// stateKey identifies a business key of one table in the state. Tables are
// numbered by the window so that the key stays small and cheap to hash.
type stateKey struct {
	table uint32
	key   tidemark.Key
}

// entry is the state of a key: the newest version passed for it and that
// change's event time in Unix microseconds (clamped).
type entry struct {
	id      stateKey // whose state it is (the LRU is keyed by its hash)
	version tidemark.Version
	et      int64
}

// slotOf is the LRU key of a state key: a 64-bit hash, so that the LRU's
// map hashes and compares a machine word instead of a struct with a string
// (a third of the filter's time on a backlog of distinct keys). Two keys
// sharing a hash share a slot: the entry names its key, a lookup of the
// other finds no state, and a key without state is never dropped — a
// collision can only cost a duplicate that then reaches the sink's version
// guard. A variable so that a test can force collisions.
var slotOf = func(seed maphash.Seed, k stateKey) uint64 {
	return maphash.String(seed, string(k.key)) ^ (uint64(k.table)+1)*0x9E3779B97F4A7C15
}

// tableInfo is what the window knows about a table ID: its number in state
// keys and where its event-time column is in the schema last seen.
type tableInfo struct {
	id     uint32
	col    string          // configured event-time column, "" when none
	schema *tidemark.Table // the schema etCol was resolved against
	etCol  int             // index of col in schema.Columns, -1 when unusable
	warned bool            // the unusable column has been logged
}

// Window drops duplicate and regressing changes whose event time is inside
// the watermark window, keeping per-key state bounded by Config.MaxKeys and
// by the watermark. Filter and Watermark must be called from one goroutine at
// a time; Stats may be called concurrently with them.
type Window struct {
	cfg   Config
	delay int64 // Config.Delay in µs
	tol   int64 // Config.Tolerance in µs
	state *simplelru.LRU[uint64, entry]
	seed  maphash.Seed
	maxET int64 // largest (clamped) event time seen, µs; noTime when none

	tables    map[tidemark.TableID]*tableInfo
	lastTable *tidemark.Table // one-entry cache in front of tables
	lastInfo  *tableInfo

	mu    sync.Mutex
	stats Stats
}

// New returns a Window for cfg, applying the defaults documented on Config.
// An invalid Config is an error naming the field.
func New(cfg Config) (*Window, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	state, err := simplelru.NewLRU[uint64, entry](cfg.MaxKeys, nil)
	if err != nil {
		return nil, fmt.Errorf("create dedupe state: %w", err)
	}
	return &Window{
		cfg:    cfg,
		delay:  cfg.Delay.Microseconds(),
		tol:    cfg.Tolerance.Microseconds(),
		state:  state,
		seed:   maphash.MakeSeed(),
		maxET:  noTime,
		tables: make(map[tidemark.TableID]*tableInfo),
	}, nil
}

// Filter implements tidemark.Filter. It returns the changes to pass on, in
// their input order, reusing the input slice (the elements after the
// returned ones are zeroed), and records every passed change in the state.
//
// For each change, in order: its event time is computed and clamped to
// Now + Tolerance, the watermark advances to max event time − Delay, and
//   - a change whose event time is below the watermark passes (PassedLate);
//   - otherwise, when the key has state with the same version the change is
//     dropped (DroppedDuplicate), with a newer version it is dropped
//     (DroppedRegression), else it passes and becomes the key's state.
//
// An update that changes the business key is a delete of the old key and an
// upsert of the new one: it is dropped only when both keys hold its version
// (DroppedDuplicate) or both hold it or a newer one (DroppedRegression), so
// that each half on its own would be a no-op; it is recorded under both keys.
//
// The state of a key is the last version passed for it, not the newest: a
// passed change replaces the state even when it is older (a key change
// passing because only one of its keys held a newer version), and a late
// change forgets the state of its keys. Otherwise Filter could drop the
// replay of a newer change after an older one overwrote it in a target that
// cannot guard deleted rows (hard deletes keep no version).
func (w *Window) Filter(changes []tidemark.Change) []tidemark.Change {
	if len(changes) == 0 {
		return changes
	}
	var d Stats
	limit := w.cfg.Now().UnixMicro() + w.tol
	out := changes[:0]
	for i := range changes {
		c := &changes[i]
		d.Seen++
		if c.Table == nil {
			// Not a change the pipeline can produce; never drop what we
			// cannot key.
			out = append(out, *c)
			continue
		}
		ti := w.tableOf(c.Table)
		et := w.eventTime(ti, c, &d)
		if et > limit {
			et = limit
			d.ClampedFuture++
		}
		if et > w.maxET {
			w.maxET = et
		}
		wm := w.maxET - w.delay
		key := c.Key()
		kNew := stateKey{ti.id, key}
		old, moved := movedFrom(c, key)
		kOld := stateKey{ti.id, old}
		if et < wm {
			// Late: pass it, and forget its keys. The state must stay
			// the last version passed: if it kept a newer one, a replay
			// of that newer change would be dropped although this older
			// change may have overwritten it in a target that cannot
			// guard deleted rows.
			d.PassedLate++
			w.forget(kNew)
			if moved {
				w.forget(kOld)
			}
			out = append(out, *c)
			continue
		}
		if moved {
			eOld, okOld := w.lookup(kOld, wm, &d)
			eNew, okNew := w.lookup(kNew, wm, &d)
			if okOld && okNew {
				co, cn := c.Version.Compare(eOld.version), c.Version.Compare(eNew.version)
				switch {
				case co == 0 && cn == 0:
					d.DroppedDuplicate++
					continue
				case co <= 0 && cn <= 0:
					d.DroppedRegression++
					continue
				}
			}
			w.record(kOld, c.Version, et, &d)
			w.record(kNew, c.Version, et, &d)
			out = append(out, *c)
			continue
		}
		if e, ok := w.lookup(kNew, wm, &d); ok {
			switch c.Version.Compare(e.version) {
			case 0:
				d.DroppedDuplicate++
				continue
			case -1:
				d.DroppedRegression++
				continue
			}
		}
		w.record(kNew, c.Version, et, &d)
		out = append(out, *c)
	}
	clear(changes[len(out):])
	w.sweep(w.maxET-w.delay, &d)
	d.Passed = uint64(len(out))
	d.Keys = uint64(w.state.Len())
	w.mu.Lock()
	w.stats.add(&d)
	w.mu.Unlock()
	return out
}

// Stats returns a snapshot of the counters. It is safe to call from any
// goroutine.
func (w *Window) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}

// Watermark returns the current watermark (largest clamped event time seen
// minus Delay) and whether any change has been seen since New.
func (w *Window) Watermark() (time.Time, bool) {
	if w.maxET == noTime {
		return time.Time{}, false
	}
	return time.UnixMicro(w.maxET - w.delay).UTC(), true
}

// lookup returns the state of k, evicting it when the watermark wm has passed
// its event time + Delay.
func (w *Window) lookup(k stateKey, wm int64, d *Stats) (entry, bool) {
	slot := slotOf(w.seed, k)
	e, ok := w.state.Peek(slot)
	if !ok || e.id != k {
		return entry{}, false
	}
	if e.et+w.delay < wm {
		w.state.Remove(slot)
		d.EvictedWatermark++
		return entry{}, false
	}
	return e, true
}

// forget drops the state of k (not of another key sharing its slot).
func (w *Window) forget(k stateKey) {
	slot := slotOf(w.seed, k)
	if e, ok := w.state.Peek(slot); ok && e.id == k {
		w.state.Remove(slot)
	}
}

// record makes v, the version just passed for k, its state: the last
// version passed, even when it is older than the state it replaces (a key
// change passed although one of its keys held a newer version). Keeping the
// newer one would let Filter drop a replay of that newer change after the
// older one reached the target.
func (w *Window) record(k stateKey, v tidemark.Version, et int64, d *Stats) {
	if w.state.Add(slotOf(w.seed, k), entry{id: k, version: v, et: et}) {
		d.EvictedCapacity++
	}
}

// sweep evicts the least recently passed keys while the watermark wm has
// passed their event time + Delay. Keys are passed roughly in event-time
// order, so this removes most expired keys at the cost of the expired ones;
// an expired key stuck behind a younger one is evicted when looked up or by
// the MaxKeys bound.
func (w *Window) sweep(wm int64, d *Stats) {
	for {
		_, e, ok := w.state.GetOldest()
		if !ok || e.et+w.delay >= wm {
			return
		}
		w.state.RemoveOldest()
		d.EvictedWatermark++
	}
}

// tableOf returns the window's information on t's table, resolving the
// event-time column against t when the schema changed.
func (w *Window) tableOf(t *tidemark.Table) *tableInfo {
	if t == w.lastTable {
		return w.lastInfo
	}
	ti := w.tables[t.ID]
	if ti == nil {
		ti = &tableInfo{id: uint32(len(w.tables)), col: w.cfg.EventTimeColumns[t.ID], etCol: -1}
		w.tables[t.ID] = ti
	}
	if ti.schema != t {
		ti.schema = t
		ti.etCol = -1
		if ti.col != "" {
			ti.etCol = t.ColumnIndex(ti.col)
			switch {
			case ti.etCol < 0:
				w.warnColumn(ti, t, "event-time column not in table; using commit time")
			case !isTimeKind(t.Columns[ti.etCol].Kind):
				w.warnColumn(ti, t, "event-time column is not a date or time column; using commit time")
				ti.etCol = -1
			default:
				ti.warned = false
			}
		}
	}
	w.lastTable, w.lastInfo = t, ti
	return ti
}

func (w *Window) warnColumn(ti *tableInfo, t *tidemark.Table, msg string) {
	if ti.warned {
		return
	}
	ti.warned = true
	w.cfg.Logger.Warn(msg, "table", t.ID.String(), "column", ti.col)
}

func isTimeKind(k tidemark.Kind) bool {
	return k == tidemark.KindDate || k == tidemark.KindDateTime || k == tidemark.KindTimestamp
}

// eventTime returns the event time of c in Unix microseconds: the value of
// the table's event-time column when it holds a time, else the commit time.
func (w *Window) eventTime(ti *tableInfo, c *tidemark.Change, d *Stats) int64 {
	if ti.col != "" {
		row := c.Row()
		if ti.etCol >= 0 && ti.etCol < len(row) {
			if t, ok := row[ti.etCol].(time.Time); ok {
				return t.UnixMicro()
			}
		}
		d.EventTimeFallback++
	}
	return c.CommitTime.UnixMicro()
}

// movedFrom returns the business key of c's Before image when c is an update
// that changes the business key (key is c.Key()).
func movedFrom(c *tidemark.Change, key tidemark.Key) (tidemark.Key, bool) {
	if c.Op != tidemark.OpUpdate || c.Before == nil || c.After == nil {
		return "", false
	}
	if sameKeyValues(c.Table, c.Before, c.After) {
		return "", false
	}
	old := c.KeyBefore()
	return old, old != key
}

// sameKeyValues reports whether the business-key values of a and b certainly
// encode to the same Key, without encoding them. False means "maybe not":
// the caller then compares the encodings.
func sameKeyValues(t *tidemark.Table, a, b []any) bool {
	for _, ci := range t.Key {
		if ci >= len(a) || ci >= len(b) {
			return false
		}
		if !sameValue(a[ci], b[ci]) {
			return false
		}
	}
	return true
}

func sameValue(a, b any) bool {
	switch x := a.(type) {
	case nil:
		return b == nil
	case int64:
		y, ok := b.(int64)
		return ok && x == y
	case uint64:
		y, ok := b.(uint64)
		return ok && x == y
	case string:
		y, ok := b.(string)
		return ok && x == y
	case tidemark.Decimal:
		y, ok := b.(tidemark.Decimal)
		return ok && x == y
	case []byte:
		y, ok := b.([]byte)
		return ok && bytes.Equal(x, y)
	case time.Time:
		y, ok := b.(time.Time)
		return ok && x.UnixMicro() == y.UnixMicro()
	}
	return false
}
