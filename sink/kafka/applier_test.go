package kafka

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark"
	"tidemark/internal/testenv"
)

// fakeTarget is a tidemark.StreamTarget in memory for the applier's unit
// tests: a version-guarded row store per table with the semantics of the
// PostgreSQL sink's TruncateBefore and DropBefore, and stream offsets with
// their compare-and-set. Its function fields, when set, see each call
// first.
type fakeTarget struct {
	mu      sync.Mutex
	tables  map[tidemark.TableID]*fakeTable
	offsets map[string]tidemark.StreamOffset // group/topic/partition
	calls   []string                         // "ensure db.t", "drop db.t", "truncate db.t", "apply n"

	onApply func(b *tidemark.Batch) error
}

type fakeTable struct {
	exists bool
	rows   map[string]tidemark.Version // by key
}

func newFakeTarget() *fakeTarget {
	return &fakeTarget{tables: map[tidemark.TableID]*fakeTable{}, offsets: map[string]tidemark.StreamOffset{}}
}

func offsetKey(group, topic string, p int32) string { return fmt.Sprintf("%s/%s/%d", group, topic, p) }

func (f *fakeTarget) table(id tidemark.TableID) *fakeTable {
	t := f.tables[id]
	if t == nil {
		t = &fakeTable{rows: map[string]tidemark.Version{}}
		f.tables[id] = t
	}
	return t
}

func rowKey(t *tidemark.Table, row []any) string {
	var b strings.Builder
	for _, k := range t.Key {
		fmt.Fprintf(&b, "%v|", row[k])
	}
	return b.String()
}

func (f *fakeTarget) Apply(_ context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.onApply != nil {
		if err := f.onApply(b); err != nil {
			return tidemark.ApplyStats{}, err
		}
	}
	for _, o := range b.Offsets {
		cur, ok := f.offsets[offsetKey(o.Group, o.Topic, o.Partition)]
		if (!ok && o.Prev != -1) || (ok && cur.Next != o.Prev) {
			return tidemark.ApplyStats{}, fmt.Errorf("save offset of %s partition %d: %w", o.Topic, o.Partition, tidemark.ErrOffsetMoved)
		}
	}
	var st tidemark.ApplyStats
	for i := range b.Changes {
		ch := &b.Changes[i]
		if ch.Op == tidemark.OpRead && !b.Refresh {
			// The PostgreSQL sink would keep an unchanged row's older
			// version, and a snapshot's end would remove it.
			return tidemark.ApplyStats{}, fmt.Errorf("a snapshot row of %s in a batch without Refresh", ch.Table.ID)
		}
		t := f.table(ch.Table.ID)
		t.exists = true // like the PostgreSQL sink, Apply creates a missing table
		row := ch.After
		if ch.Op == tidemark.OpDelete {
			row = ch.Before
		}
		k := rowKey(ch.Table, row)
		// Batch.Refresh: a snapshot row also replaces its own
		// transaction's rows.
		refresh := ch.Op == tidemark.OpRead && ch.Version.Index == 0
		if have, ok := t.rows[k]; ok && have.Compare(ch.Version) >= 0 && !(refresh && have.Seq <= ch.Version.Seq) {
			st.Skipped++
			continue
		}
		switch ch.Op {
		case tidemark.OpDelete:
			delete(t.rows, k)
			st.Deleted++
		default:
			t.rows[k] = ch.Version
			st.Inserted++
		}
	}
	for _, o := range b.Offsets {
		o.Prev = o.Next
		f.offsets[offsetKey(o.Group, o.Topic, o.Partition)] = o
	}
	f.calls = append(f.calls, fmt.Sprintf("apply %d", len(b.Changes)))
	return st, nil
}

func (f *fakeTarget) Offsets(_ context.Context, group, topic string) ([]tidemark.StreamOffset, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []tidemark.StreamOffset
	for _, o := range f.offsets {
		if o.Group == group && o.Topic == topic {
			out = append(out, o)
		}
	}
	return out, nil
}

func (f *fakeTarget) EnsureTable(_ context.Context, t *tidemark.Table) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.table(t.ID).exists = true
	call := "ensure " + t.ID.String()
	if t.AfterDrop != (tidemark.Version{}) {
		call += " after drop " + t.AfterDrop.String()
	}
	f.calls = append(f.calls, call)
	return nil
}

func (f *fakeTarget) TruncateBefore(_ context.Context, id tidemark.TableID, v tidemark.Version, _ time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.table(id)
	t.removeBefore(tidemark.Version{Seq: v.Seq, Index: v.Index + 1}) // at v or older
	f.calls = append(f.calls, "truncate "+id.String())
	return nil
}

func (f *fakeTarget) DropBefore(_ context.Context, id tidemark.TableID, v tidemark.Version) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.table(id)
	t.removeBefore(tidemark.Version{Seq: v.Seq, Index: v.Index + 1}) // at v or older
	if len(t.rows) == 0 {
		t.exists = false
	}
	f.calls = append(f.calls, "drop "+id.String())
	return nil
}

func (f *fakeTarget) RemoveBefore(_ context.Context, id tidemark.TableID, v tidemark.Version) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.table(id)
	n := len(t.rows)
	t.removeBefore(v)
	f.calls = append(f.calls, "remove "+id.String())
	return int64(n - len(t.rows)), nil
}

func (f *fakeTarget) Checkpoint(context.Context, string) (tidemark.Position, bool, error) {
	return tidemark.Position{}, false, nil
}

func (f *fakeTarget) Close() error { return nil }

var _ tidemark.StreamTarget = (*fakeTarget)(nil)

// removeBefore removes the rows older than v.
func (t *fakeTable) removeBefore(v tidemark.Version) {
	for k, have := range t.rows {
		if have.Compare(v) < 0 {
			delete(t.rows, k)
		}
	}
}

// count returns how many calls start with prefix.
func (f *fakeTarget) count(prefix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

// keys returns the table's keys with their versions, sorted.
func (f *fakeTarget) keys(id tidemark.TableID) (exists bool, rows []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.table(id)
	for k, v := range t.rows {
		rows = append(rows, k+v.String())
	}
	sort.Strings(rows)
	return t.exists, rows
}

// runApplier runs one applier of the sink's topics against target until
// the test ends; its error, if any, fails the test.
func runApplier(t *testing.T, s *Sink, target tidemark.StreamTarget) {
	t.Helper()
	a, err := NewApplier(ApplierConfig{
		Brokers: s.cfg.Brokers, Group: testenv.Name("grp"), MaxRecords: 7, Logger: s.cfg.Logger,
		TopicPrefix: s.cfg.TopicPrefix, TopicTemplate: s.cfg.TopicTemplate,
		Topics: "^" + regexp.QuoteMeta(s.cfg.TopicPrefix) + `\.`, Exclude: "^" + regexp.QuoteMeta(s.cfg.CheckpointTopic) + "$",
		MetadataMaxAge: 100 * time.Millisecond,
		kgoOpts:        []kgo.Opt{kgo.MetadataMinAge(10 * time.Millisecond)},
	}, target)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("applier: %v", err)
		}
	})
}

// waitUntil polls cond for up to 30 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func insertsOf(tbl *tidemark.Table, first, n int, seq uint64) []tidemark.Change {
	var out []tidemark.Change
	for i := first; i < first+n; i++ {
		out = append(out, tidemark.Change{Op: tidemark.OpInsert, Table: tbl, Version: tidemark.Version{Seq: seq, Index: uint32(i - first + 1)},
			After: []any{int64(i), fmt.Sprintf("t%d", i%3), tidemark.Decimal("1.00"), nil, epoch}, CommitTime: epoch, Size: 100})
	}
	return out
}

// TestApplierFollowsDropTable publishes rows of a table, its DROP TABLE
// and rows of a table created again under the same name (same schema), and
// applies the topic with an applier: every partition's applier runs the
// DROP once after the rows before it, the rows after it are written only
// once the partition has announced the table's schema again (EnsureTable
// per partition before and after the drop), and the target holds exactly
// the new table's rows.
func TestApplierFollowsDropTable(t *testing.T) {
	s, orders := publishOrders(t)
	ctx := context.Background()
	drop := tidemark.DDLEvent{Op: tidemark.DDLDropTable, Table: orders.ID, Version: tidemark.Version{Seq: 20}}
	if err := s.PublishDDL(ctx, "src", []tidemark.DDLEvent{drop}, tidemark.Position{GTID: "0-1-20"}); err != nil {
		t.Fatal(err)
	}
	apply(t, s, &tidemark.Batch{Source: "src", Changes: insertsOf(orders, 1, 10, 30), Checkpoint: tidemark.Position{GTID: "0-1-30"}})

	target := newFakeTarget()
	runApplier(t, s, target)
	var want []string
	for _, ch := range insertsOf(orders, 1, 10, 30) {
		want = append(want, rowKey(orders, ch.After)+ch.Version.String())
	}
	sort.Strings(want)
	waitUntil(t, "the appliers to apply the new table's rows", func() bool {
		_, rows := target.keys(orders.ID)
		return target.count("drop ") == 4 && strings.Join(rows, ",") == strings.Join(want, ",")
	})
	if exists, _ := target.keys(orders.ID); !exists {
		t.Error("the table created again is missing")
	}
	if n := target.count("ensure "); n != 8 {
		t.Errorf("EnsureTable ran %d times, want 8 (each of 4 partitions before and after the DROP)", n)
	}
	// The schema announced after the drop says it follows the drop
	// (tidemark.Table.AfterDrop): an applier replaces a target of the
	// older layout that a lagging partition made again.
	if n := target.count("ensure " + orders.ID.String() + " after drop 20.0"); n != 4 {
		t.Errorf("EnsureTable ran %d times with the layout after the drop at 20.0, want 4 (each partition after the DROP)", n)
	}
}

// TestApplierDropRecordShape: a drop record decodes with its version and
// reason; a record of another kind or an invalid table name does not.
func TestApplierDropRecordShape(t *testing.T) {
	if _, err := parseTableControl("drop", []byte(`{"control":"truncate","source":"s","database":"db","table":"t","seq":1,"index":0}`)); err == nil {
		t.Error("a truncate record parsed as a drop")
	}
	if _, err := parseTableControl("drop", []byte(`{"control":"drop","source":"s","database":"db","table":"t;x","seq":1,"index":0}`)); err == nil {
		t.Error("a drop of an invalid table name parsed")
	}
	got, err := parseTableControl("drop", []byte(`{"control":"drop","source":"s","database":"db","table":"t","seq":7,"index":0,"reason":"renamed to db.u"}`))
	if err != nil || got.Seq != 7 || got.Reason != "renamed to db.u" {
		t.Errorf("drop record: %+v, %v", got, err)
	}
}

// TestApplierFollowsSnapshotBoundaries publishes rows of a table, then a
// resync's snapshot of it between its boundaries (the source lost rows
// that the stream never showed), then a change after it: every
// partition's applier removes, at the end boundary, the target rows the
// snapshot did not carry, once, after the snapshot rows before it; the
// change after the boundary stays. The target then holds exactly the
// source's rows.
func TestApplierFollowsSnapshotBoundaries(t *testing.T) {
	s, orders := publishOrders(t)
	ctx := context.Background()
	// Transaction 50 inserts id 41; then the source loses ids 31-41
	// without a binlog event: the snapshot read after transaction 50 has
	// ids 1-30, stamped with its version (above transaction 50:
	// tidemark.Snapshot).
	apply(t, s, &tidemark.Batch{Source: "src", Changes: insertsOf(orders, 41, 1, 50), Checkpoint: tidemark.Position{GTID: "0-1-50"}})
	snapAt := tidemark.Version{Seq: 51}
	if err := s.BeginSnapshot(ctx, "src", orders.ID, "resync requested"); err != nil {
		t.Fatal(err)
	}
	snap := insertsOf(orders, 1, 30, 0)
	for i := range snap {
		snap[i].Op, snap[i].Version = tidemark.OpRead, snapAt
	}
	apply(t, s, &tidemark.Batch{Source: "src", Changes: snap[:17]})
	apply(t, s, &tidemark.Batch{Source: "src", Changes: snap[17:]})
	if err := s.EndSnapshot(ctx, "src", orders.ID, snapAt); err != nil {
		t.Fatal(err)
	}
	later := insertsOf(orders, 5, 1, 60)
	later[0].Op, later[0].Before = tidemark.OpUpdate, later[0].After
	apply(t, s, &tidemark.Batch{Source: "src", Changes: later, Checkpoint: tidemark.Position{GTID: "0-1-60"}})

	target := newFakeTarget()
	runApplier(t, s, target)
	var want []string
	for _, ch := range snap {
		if ch.After[0] != later[0].After[0] {
			want = append(want, rowKey(orders, ch.After)+ch.Version.String())
		}
	}
	want = append(want, rowKey(orders, later[0].After)+later[0].Version.String())
	sort.Strings(want)
	var rows []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, rows = target.keys(orders.ID)
		if target.count("remove ") == 4 && strings.Join(rows, ",") == strings.Join(want, ",") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s: %d snapshot ends applied (want 4), target rows\n got %v\nwant %v", target.count("remove "), rows, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// publishOrders opens an exactly-once sink with control records on a new
// cluster and publishes inserts of orders 1-40 (GTID sequence 10).
func publishOrders(t *testing.T) (*Sink, *tidemark.Table) {
	t.Helper()
	cfg := testConfig(t, newCluster(t), true)
	cfg.ControlRecords = true
	s := openSink(t, cfg)
	orders := ordersTable("shop")
	apply(t, s, &tidemark.Batch{Source: "src", Changes: insertsOf(orders, 1, 40, 10), Checkpoint: tidemark.Position{GTID: "0-1-10"}})
	return s, orders
}

// TestCheckScope: a control record acts only on its topic's table, of the
// group's source, at this envelope version; anything else is refused
// naming the mismatch (the real-broker test is
// integration/TestApplyRefusesForeignControlRecord).
func TestCheckScope(t *testing.T) {
	a, err := NewApplier(ApplierConfig{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: `^shop\.`, Source: "shop", TopicPrefix: "shop"}, newFakeTarget())
	if err != nil {
		t.Fatal(err)
	}
	defer a.cl.Close()
	orders := tidemark.TableID{Database: "shop", Name: "orders"}
	items := tidemark.TableID{Database: "shop", Name: "items"}
	rec := func(topic, version string) *kgo.Record {
		return &kgo.Record{Topic: topic, Headers: []kgo.RecordHeader{{Key: controlHeader, Value: controlTruncate}, {Key: "schema_version", Value: []byte(version)}}}
	}
	announced := &partState{schema: &announcedSchema{table: ordersTable("shop")}}
	for _, tt := range []struct {
		name   string
		r      *kgo.Record
		st     *partState
		source string
		id     tidemark.TableID
		want   string
	}{
		{"ok", rec("shop.shop.orders", EnvelopeVersion), announced, "shop", orders, ""},
		{"another table's topic", rec("shop.shop.orders", EnvelopeVersion), &partState{}, "shop", items, "the topic of shop.items is shop.shop.items"},
		{"another source", rec("shop.shop.orders", EnvelopeVersion), &partState{}, "other", orders, `of source "other": the group applies source "shop"`},
		{"another envelope version", rec("shop.shop.orders", "9"), &partState{}, "shop", orders, `envelope version "9"`},
		{"not the partition's table", rec("shop.shop.items", EnvelopeVersion), announced, "shop", items, "the partition carries table shop.orders"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := a.checkScope(tt.r, tt.st, "truncate", tt.source, tt.id)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("checkScope = %v, want %q", err, tt.want)
			}
		})
	}
}
