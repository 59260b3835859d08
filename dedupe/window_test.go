package dedupe

import (
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"tidemark"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestFilter(t *testing.T) {
	const delay = 10 * time.Minute
	eps := time.Second
	edge := func(d time.Duration) time.Time { return t0.Add(d) }
	colA := map[tidemark.TableID]string{tabA.ID: "updated_at"}
	withTS := func(c tidemark.Change, ts any) tidemark.Change {
		r := append([]any(nil), c.Row()...)
		r[2] = ts
		if c.Op == tidemark.OpDelete {
			c.Before = r
		} else {
			c.After = r
		}
		return c
	}

	tests := []struct {
		name    string
		cfg     Config
		now     time.Time // zero: t0 + 1h
		batches [][]tidemark.Change
		want    [][]int // indexes of the passed changes, per batch
		stats   Stats   // expected counters (Seen, Passed and Keys are checked too)
	}{
		{
			name:    "replay of the same version is a duplicate",
			batches: [][]tidemark.Change{{ins(1, "A", ver(1, 1), sec(0))}, {ins(1, "A", ver(1, 1), sec(0))}},
			want:    [][]int{{0}, nil},
			stats:   Stats{DroppedDuplicate: 1, Keys: 1},
		},
		{
			name:    "duplicate inside one batch",
			batches: [][]tidemark.Change{{ins(1, "A", ver(1, 1), sec(0)), ins(1, "A", ver(1, 1), sec(0))}},
			want:    [][]int{{0}},
			stats:   Stats{DroppedDuplicate: 1, Keys: 1},
		},
		{
			name:    "older version is a regression",
			batches: [][]tidemark.Change{{upd(1, "A", "B", ver(2, 1), sec(1)), upd(1, "X", "A", ver(1, 3), sec(0))}},
			want:    [][]int{{0}},
			stats:   Stats{DroppedRegression: 1, Keys: 1},
		},
		{
			name:    "newer versions pass",
			batches: [][]tidemark.Change{{ins(1, "A", ver(1, 1), sec(0)), upd(1, "A", "B", ver(1, 2), sec(0)), del(1, "B", ver(2, 1), sec(1))}},
			want:    [][]int{{0, 1, 2}},
			stats:   Stats{Keys: 1},
		},
		{
			name: "A→B→A passes in full and its replay is dropped",
			batches: [][]tidemark.Change{
				{ins(1, "A", ver(1, 1), sec(0)), upd(1, "A", "B", ver(2, 1), sec(1)), upd(1, "B", "A", ver(3, 1), sec(2))},
				{ins(1, "A", ver(1, 1), sec(0)), upd(1, "A", "B", ver(2, 1), sec(1)), upd(1, "B", "A", ver(3, 1), sec(2))},
			},
			want:  [][]int{{0, 1, 2}, nil},
			stats: Stats{DroppedDuplicate: 1, DroppedRegression: 2, Keys: 1},
		},
		{
			name: "same key in two tables is two keys",
			batches: [][]tidemark.Change{{
				ins(1, "A", ver(5, 1), sec(0)),
				on(tabB, ins(1, "A", ver(3, 1), sec(0))),
				on(tabB, ins(1, "A", ver(3, 1), sec(0))),
			}},
			want:  [][]int{{0, 1}},
			stats: Stats{DroppedDuplicate: 1, Keys: 2},
		},
		{
			name:    "binlog change (S,1) is newer than a snapshot read (S,0)",
			batches: [][]tidemark.Change{{read(1, "A", ver(7, 0), sec(0)), upd(1, "A", "B", ver(7, 1), sec(0)), read(1, "A", ver(7, 0), sec(0))}},
			want:    [][]int{{0, 1}},
			stats:   Stats{DroppedRegression: 1, Keys: 1},
		},
		{
			name:    "read replayed at the same position is a duplicate",
			batches: [][]tidemark.Change{{read(1, "A", ver(7, 0), sec(0)), read(1, "A", ver(7, 0), sec(0)), read(1, "A", ver(8, 0), sec(1))}},
			want:    [][]int{{0, 2}},
			stats:   Stats{DroppedDuplicate: 1, Keys: 1},
		},
		{
			name: "key change is recorded under the old and the new key",
			batches: [][]tidemark.Change{
				{move(1, 2, "A", ver(3, 1), sec(0))},
				{ins(1, "A", ver(2, 1), sec(0)), upd(2, "Z", "A", ver(1, 1), sec(0)), move(1, 2, "A", ver(3, 1), sec(0))},
			},
			want:  [][]int{{0}, nil},
			stats: Stats{DroppedDuplicate: 1, DroppedRegression: 2, Keys: 2},
		},
		{
			name: "key change is a regression when both keys hold it or newer",
			batches: [][]tidemark.Change{
				{move(1, 2, "A", ver(3, 1), sec(0)), upd(2, "A", "B", ver(4, 1), sec(0))},
				{move(1, 2, "A", ver(3, 1), sec(0))},
			},
			want:  [][]int{{0, 1}, nil},
			stats: Stats{DroppedRegression: 1, Keys: 2},
		},
		{
			name: "key change passes when one key holds an older version, and lowers the other",
			batches: [][]tidemark.Change{
				{ins(1, "A", ver(2, 1), sec(0)), ins(2, "B", ver(5, 1), sec(0))},
				{move(1, 2, "A", ver(3, 1), sec(0))},
				// Key 2's state is now 3.1, the last version passed: the
				// replay of 5.1 must reach the target again.
				{ins(2, "B", ver(5, 1), sec(0))},
			},
			want:  [][]int{{0, 1}, {0}, {0}},
			stats: Stats{Keys: 2},
		},
		{
			name: "late change forgets the state of its key",
			batches: [][]tidemark.Change{
				{ins(1, "A", ver(1, 1), edge(0)), del(1, "A", ver(2, 1), edge(15*time.Minute))},
				// A replay: the insert is late, the delete is not.
				{ins(1, "A", ver(1, 1), edge(0)), del(1, "A", ver(2, 1), edge(15*time.Minute))},
			},
			want:  [][]int{{0, 1}, {0, 1}},
			stats: Stats{PassedLate: 1, Keys: 1},
		},
		{
			name: "key change passes when the old key has no state",
			cfg:  Config{MaxKeys: 2},
			batches: [][]tidemark.Change{
				// Key 1 is evicted by capacity when key 3 arrives.
				{move(1, 2, "A", ver(3, 1), sec(0)), ins(3, "C", ver(4, 1), sec(0))},
				{move(1, 2, "A", ver(3, 1), sec(0))},
			},
			want: [][]int{{0, 1}, {0}},
			// Replaying the move records keys 1 and 2 again, evicting 2 and 3.
			stats: Stats{EvictedCapacity: 3, Keys: 2},
		},
		{
			name: "window edge: a duplicate delay−ε after the original is dropped",
			batches: [][]tidemark.Change{
				{ins(1, "A", ver(1, 1), edge(0))},
				{ins(2, "B", ver(9, 1), edge(delay-eps))},
				{ins(1, "A", ver(1, 1), edge(0))},
			},
			want:  [][]int{{0}, {0}, nil},
			stats: Stats{DroppedDuplicate: 1, Keys: 2},
		},
		{
			name: "window edge: a duplicate delay+ε after the original passes late",
			batches: [][]tidemark.Change{
				{ins(1, "A", ver(1, 1), edge(0))},
				{ins(2, "B", ver(9, 1), edge(delay+eps))},
				{ins(1, "A", ver(1, 1), edge(0))},
			},
			want:  [][]int{{0}, {0}, {0}},
			stats: Stats{PassedLate: 1, Keys: 1}, // the late change forgets key 1
		},
		{
			name: "window edge: a duplicate exactly at the watermark is checked",
			batches: [][]tidemark.Change{
				{ins(1, "A", ver(1, 1), edge(0)), ins(2, "B", ver(9, 1), edge(delay)), ins(1, "A", ver(1, 1), edge(0))},
			},
			want:  [][]int{{0, 1}},
			stats: Stats{DroppedDuplicate: 1, Keys: 2},
		},
		{
			name: "late change below the watermark passes, even a regression",
			batches: [][]tidemark.Change{
				{upd(1, "A", "B", ver(5, 1), edge(20*time.Minute)), ins(2, "B", ver(9, 1), edge(30*time.Minute))},
				{upd(1, "X", "A", ver(1, 1), edge(0)), ins(3, "C", ver(2, 1), edge(time.Minute))},
			},
			want:  [][]int{{0, 1}, {0, 1}},
			stats: Stats{PassedLate: 2, Keys: 1}, // the late change forgets key 1
		},
		{
			name: "state kept until the watermark passes event time + delay",
			batches: [][]tidemark.Change{
				{ins(1, "A", ver(1, 1), edge(0))},
				{ins(2, "B", ver(9, 1), edge(2*delay-eps))},
				// Same version, a later event time (inside the window): still
				// in state.
				{ins(1, "A", ver(1, 1), edge(delay))},
			},
			want:  [][]int{{0}, {0}, nil},
			stats: Stats{DroppedDuplicate: 1, Keys: 2},
		},
		{
			name: "state evicted once the watermark passes event time + delay",
			batches: [][]tidemark.Change{
				{ins(1, "A", ver(1, 1), edge(0))},
				{ins(2, "B", ver(9, 1), edge(2*delay+eps))},
				{ins(1, "A", ver(1, 1), edge(delay+2*eps))},
			},
			want:  [][]int{{0}, {0}, {0}},
			stats: Stats{EvictedWatermark: 1, Keys: 2},
		},
		{
			name: "far-future event time is clamped and does not empty the window",
			cfg:  Config{Tolerance: time.Minute},
			now:  sec(3600),
			batches: [][]tidemark.Change{
				{ins(1, "A", ver(1, 1), sec(3600))},
				{ins(2, "B", ver(2, 1), time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC))},
				{ins(1, "A", ver(1, 1), sec(3600)), ins(3, "C", ver(3, 1), sec(3590))},
			},
			want:  [][]int{{0}, {0}, {1}},
			stats: Stats{ClampedFuture: 1, DroppedDuplicate: 1, Keys: 3},
		},
		{
			name: "event time within the tolerance is not clamped",
			cfg:  Config{Tolerance: time.Minute},
			now:  sec(3600),
			batches: [][]tidemark.Change{
				{ins(1, "A", ver(1, 1), sec(3600+59))},
			},
			want:  [][]int{{0}},
			stats: Stats{Keys: 1},
		},
		{
			name: "capacity eviction loses only deduplication",
			cfg:  Config{MaxKeys: 2},
			batches: [][]tidemark.Change{
				{ins(1, "A", ver(1, 1), sec(0)), ins(2, "B", ver(2, 1), sec(0)), ins(3, "C", ver(3, 1), sec(0))},
				{ins(1, "A", ver(1, 1), sec(0)), ins(3, "C", ver(3, 1), sec(0))},
			},
			want:  [][]int{{0, 1, 2}, {0}},
			stats: Stats{EvictedCapacity: 2, DroppedDuplicate: 1, Keys: 2},
		},
		{
			name: "event-time column decides lateness",
			cfg:  Config{EventTimeColumns: colA},
			batches: [][]tidemark.Change{
				{withTS(ins(1, "A", ver(1, 1), sec(0)), sec(3600))},
				{withTS(ins(2, "B", ver(2, 1), sec(3600)), sec(3600))},
				// Commit time an hour before the watermark, column inside it.
				{withTS(ins(1, "A", ver(1, 1), sec(0)), sec(3600))},
			},
			want:  [][]int{{0}, {0}, nil},
			stats: Stats{DroppedDuplicate: 1, Keys: 2},
		},
		{
			name: "NULL event-time column falls back to the commit time",
			cfg:  Config{EventTimeColumns: colA},
			batches: [][]tidemark.Change{
				{withTS(ins(2, "B", ver(2, 1), sec(0)), sec(3600))},
				// NULL column: commit time 0 is below the watermark.
				{ins(1, "A", ver(1, 1), sec(0)), on(tabB, ins(1, "A", ver(1, 1), sec(0)))},
			},
			want:  [][]int{{0}, {0, 1}},
			stats: Stats{EventTimeFallback: 1, PassedLate: 2, Keys: 1},
		},
		{
			name: "change without a table passes",
			batches: [][]tidemark.Change{
				{{Op: tidemark.OpInsert, Version: ver(1, 1)}, {Op: tidemark.OpInsert, Version: ver(1, 1)}},
			},
			want:  [][]int{{0, 1}},
			stats: Stats{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := tt.now
			if now.IsZero() {
				now = sec(3600)
			}
			cfg := tt.cfg
			if cfg.Delay == 0 {
				cfg.Delay = delay
			}
			cfg.Now = func() time.Time { return now }
			cfg.Logger = quietLogger()
			w, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			var seen int
			for bi, batch := range tt.batches {
				var want []tidemark.Change
				for _, i := range tt.want[bi] {
					want = append(want, batch[i])
				}
				in := append([]tidemark.Change(nil), batch...)
				seen += len(in)
				got := w.Filter(in)
				if !reflect.DeepEqual(describeAll(got), describeAll(want)) {
					t.Fatalf("batch %d: passed\n  %s\nwant\n  %s", bi,
						strings.Join(describeAll(got), "\n  "), strings.Join(describeAll(want), "\n  "))
				}
				for i := len(got); i < len(in); i++ {
					if in[i].Table != nil || in[i].After != nil {
						t.Errorf("batch %d: element %d after the result not cleared", bi, i)
					}
				}
			}
			st := w.Stats()
			want := tt.stats
			want.Seen = uint64(seen)
			want.Passed = want.Seen - want.DroppedDuplicate - want.DroppedRegression
			if st != want {
				t.Errorf("stats\n got %+v\nwant %+v", st, want)
			}
		})
	}
}

func TestFilterAThenBThenAEndsAsA(t *testing.T) {
	w, err := New(Config{Delay: time.Minute, Now: func() time.Time { return sec(0) }})
	if err != nil {
		t.Fatal(err)
	}
	stream := []tidemark.Change{
		ins(1, "A", ver(1, 1), sec(0)), upd(1, "A", "B", ver(2, 1), sec(1)), upd(1, "B", "A", ver(3, 1), sec(2)),
	}
	// A reconnect replays the B change after A came back.
	dirty := append(append([]tidemark.Change(nil), stream...), upd(1, "A", "B", ver(2, 1), sec(1)))
	target := newModel(false)
	target.apply(w.Filter(dirty)...)
	first := stream[0]
	r := target.rows[modelKey{tabA.ID, first.Key()}]
	if r.img[1] != "A" || r.version != ver(3, 1) {
		t.Fatalf("row = %s, want A@3.1", fmtRow(r))
	}
}

// TestFilterLateReplayHardDelete: a replay whose insert is late (passed)
// and whose delete is not must not leave the row in a hard-delete target.
func TestFilterLateReplayHardDelete(t *testing.T) {
	w, err := New(Config{Delay: 10 * time.Minute, Now: func() time.Time { return sec(3600) }})
	if err != nil {
		t.Fatal(err)
	}
	stream := []tidemark.Change{ins(1, "A", ver(1, 1), sec(0)), del(1, "A", ver(2, 1), sec(900))}
	target := newModel(false)
	for range 2 { // the second time is a replay
		target.apply(w.Filter(append([]tidemark.Change(nil), stream...))...)
	}
	if len(target.rows) != 0 {
		for _, r := range target.rows {
			t.Fatalf("deleted row came back: %s", fmtRow(r))
		}
	}
}

// TestFilterKeyChangeLowersState: a replayed key change passes because its
// old key was forgotten (late), although its new key holds a newer version
// (a delete). The state of the new key must become the key change's version,
// so that the replayed delete passes again and removes the row the key change
// brought back in a hard-delete target.
func TestFilterKeyChangeLowersState(t *testing.T) {
	w, err := New(Config{Delay: 10 * time.Minute, Now: func() time.Time { return sec(3600) }})
	if err != nil {
		t.Fatal(err)
	}
	stream := []tidemark.Change{
		ins(1, "A", ver(1, 1), sec(0)),
		move(1, 2, "A", ver(3, 1), sec(900)),
		del(2, "A", ver(4, 1), sec(900)),
	}
	target := newModel(false)
	for range 2 { // the second time is a replay; its insert is late
		target.apply(w.Filter(append([]tidemark.Change(nil), stream...))...)
	}
	for _, r := range target.rows {
		t.Errorf("row left in the target: %s", fmtRow(r))
	}
	if st := w.Stats(); st.PassedLate != 1 || st.Passed != 6 {
		t.Errorf("stats = %+v, want 1 late and all 6 passed", st)
	}
}

func TestWatermarkClampedToTolerance(t *testing.T) {
	now := sec(1000)
	w, err := New(Config{Delay: time.Minute, Tolerance: 10 * time.Second, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	w.Filter([]tidemark.Change{ins(1, "A", ver(1, 1), time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC))})
	got, _ := w.Watermark()
	if want := now.Add(10*time.Second - time.Minute); !got.Equal(want) {
		t.Fatalf("watermark = %s, want %s", got, want)
	}
}

func TestStatsConcurrent(t *testing.T) {
	w, err := New(Config{Now: func() time.Time { return sec(0) }})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			st := w.Stats()
			if st.Seen != st.Passed+st.DroppedDuplicate+st.DroppedRegression {
				t.Errorf("inconsistent snapshot %+v", st)
				return
			}
		}
	}()
	for i := range 200 {
		batch := []tidemark.Change{ins(int64(i%7), "A", ver(uint64(i/3), 1), sec(0)), ins(int64(i%7), "A", ver(uint64(i/3), 1), sec(0))}
		w.Filter(batch)
	}
	close(stop)
	wg.Wait()
}

func TestStatsEach(t *testing.T) {
	s := Stats{Seen: 1, Passed: 2, DroppedDuplicate: 3, DroppedRegression: 4, PassedLate: 5, ClampedFuture: 6,
		EvictedCapacity: 7, EvictedWatermark: 8, EventTimeFallback: 9, Keys: 10}
	var names []string
	var sum uint64
	s.Each(func(name string, v uint64) {
		names = append(names, name)
		sum += v
	})
	want := "seen passed dropped_duplicate dropped_regression passed_late clamped_future evicted_capacity evicted_watermark event_time_fallback keys"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("names = %s\nwant %s", got, want)
	}
	if sum != 55 {
		t.Errorf("sum of values = %d, want 66 (a field is reported twice or not at all)", sum)
	}
}

func TestNewConfig(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		field string // "" means valid
		is    error
	}{
		{name: "zero config takes defaults", cfg: Config{}},
		{name: "negative delay", cfg: Config{Delay: -time.Second}, field: "dedupe config: delay: must be > 0"},
		{name: "negative tolerance", cfg: Config{Tolerance: -1}, field: "dedupe config: tolerance: must be >= 0"},
		{name: "negative max keys", cfg: Config{MaxKeys: -1}, field: "dedupe config: max_keys: must be > 0"},
		{
			name:  "invalid event-time column",
			cfg:   Config{EventTimeColumns: map[tidemark.TableID]string{tabA.ID: `x"; drop table t`}},
			field: "dedupe config: event_time_columns: table shop.orders",
			is:    tidemark.ErrInvalidIdentifier,
		},
		{
			name:  "empty event-time column",
			cfg:   Config{EventTimeColumns: map[tidemark.TableID]string{tabA.ID: ""}},
			field: "dedupe config: event_time_columns: table shop.orders",
			is:    tidemark.ErrInvalidIdentifier,
		},
		{
			name:  "invalid event-time table",
			cfg:   Config{EventTimeColumns: map[tidemark.TableID]string{{Database: "shop", Name: "a\x00b"}: "ts"}},
			field: "dedupe config: event_time_columns: table",
			is:    tidemark.ErrInvalidIdentifier,
		},
		{name: "valid event-time column", cfg: Config{EventTimeColumns: map[tidemark.TableID]string{tabA.ID: "updated_at"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := New(tt.cfg)
			if tt.field == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				if w.cfg.Delay <= 0 || w.cfg.MaxKeys <= 0 || w.cfg.Now == nil || w.cfg.Logger == nil {
					t.Fatalf("defaults not applied: %+v", w.cfg)
				}
				return
			}
			if err == nil {
				t.Fatal("New accepted an invalid config")
			}
			if !strings.HasPrefix(err.Error(), tt.field) {
				t.Errorf("error %q does not start with %q", err, tt.field)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %q is not %v", err, tt.is)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	w, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if w.cfg.Delay != DefaultDelay || w.cfg.MaxKeys != DefaultMaxKeys || w.cfg.Tolerance != 0 {
		t.Fatalf("defaults = delay %s, max keys %d, tolerance %s", w.cfg.Delay, w.cfg.MaxKeys, w.cfg.Tolerance)
	}
}

func TestEventTimeColumnMissingFromSchema(t *testing.T) {
	other := &tidemark.Table{ID: tabA.ID, Columns: tabA.Columns[:2], Key: []int{0}}
	w, err := New(Config{
		Delay:            time.Minute,
		EventTimeColumns: map[tidemark.TableID]string{tabA.ID: "updated_at"},
		Now:              func() time.Time { return sec(0) },
		Logger:           quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	c := on(other, ins(1, "A", ver(1, 1), sec(0)))
	c.After = c.After[:2]
	w.Filter([]tidemark.Change{c, c})
	if st := w.Stats(); st.EventTimeFallback != 2 || st.DroppedDuplicate != 1 {
		t.Fatalf("stats = %+v, want 2 fallbacks and 1 duplicate", st)
	}
}

// TestSlotCollisionsNeverDrop: when every key shares one LRU slot, a key
// whose state another key overwrote has no state, so its duplicate passes
// (the sink's version guard is the backstop) — nothing is ever dropped
// that was not passed before with the same or a newer version.
func TestSlotCollisionsNeverDrop(t *testing.T) {
	saved := slotOf
	slotOf = func(maphash.Seed, stateKey) uint64 { return 42 }
	t.Cleanup(func() { slotOf = saved })
	w, err := New(Config{Delay: time.Hour, Now: func() time.Time { return sec(10) }})
	if err != nil {
		t.Fatal(err)
	}
	in := []tidemark.Change{
		ins(1, "a", ver(1, 1), sec(1)),
		ins(2, "b", ver(1, 2), sec(1)), // takes key 1's slot
		ins(1, "a", ver(1, 1), sec(1)), // duplicate of key 1: no state left, passes
		ins(1, "a", ver(1, 1), sec(1)), // key 1 holds the slot again: dropped
		ins(2, "b", ver(1, 2), sec(1)), // key 2 lost the slot: passes
	}
	out := w.Filter(slices.Clone(in))
	var got []string
	for _, c := range out {
		got = append(got, fmt.Sprint(c.After[0]))
	}
	if strings.Join(got, ",") != "1,2,1,2" {
		t.Fatalf("passed keys %v, want 1,2,1,2", got)
	}
	if st := w.Stats(); st.DroppedDuplicate != 1 {
		t.Fatalf("dropped %d duplicates, want 1", st.DroppedDuplicate)
	}
}
