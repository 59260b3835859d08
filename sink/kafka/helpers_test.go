package kafka

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark"
	"tidemark/internal/testenv"
)

// newCluster starts an in-process Kafka cluster for one test.
func newCluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// testLogger discards the sink's log lines; TIDEMARK_TEST_LOG=1 shows
// them (franz-go's at debug level).
func testLogger(t testing.TB) *slog.Logger {
	if testenv.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testConfig is a sink config on c with random topic names.
func testConfig(t testing.TB, c *kfake.Cluster, exactlyOnce bool) Config {
	cfg := Config{
		Brokers:      c.ListenAddrs(),
		TopicPrefix:  testenv.Name("tm"),
		CreateTopics: true,
		Partitions:   4,
		Tombstones:   true,
		ExactlyOnce:  exactlyOnce,
		Logger:       testLogger(t),
		Retry:        tidemark.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond},
		kgoOpts: []kgo.Opt{
			kgo.MetadataMinAge(10 * time.Millisecond),
			kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond }),
		},
	}
	if exactlyOnce {
		cfg.TransactionalID = testenv.Name("txn-")
	}
	return cfg
}

func openSink(t testing.TB, cfg Config) *Sink {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, cfg)
	if err != nil {
		t.Fatalf("open sink: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// restartSink opens a sink as a restarted daemon does: it takes over the
// transactional id (Activate, which makes the broker finish a transaction
// the crashed instance left open) before it reads a checkpoint. A sink that
// only reads (a one-shot tool) waits instead for an open transaction.
func restartSink(t testing.TB, cfg Config) *Sink {
	t.Helper()
	s := openSink(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Activate(ctx); err != nil {
		t.Fatalf("activate sink: %v", err)
	}
	return s
}

// ordersTable has a composite business key (tenant, id) that is not the
// column order.
func ordersTable(db string) *tidemark.Table {
	return &tidemark.Table{
		ID: tidemark.TableID{Database: db, Name: "orders"},
		Columns: []tidemark.Column{
			{Name: "id", Kind: tidemark.KindInt, Bits: 64},
			{Name: "tenant", Kind: tidemark.KindText},
			{Name: "amount", Kind: tidemark.KindDecimal, Precision: 10, Scale: 2},
			{Name: "note", Kind: tidemark.KindText, Nullable: true},
			{Name: "updated_at", Kind: tidemark.KindDateTime, Scale: 6},
		},
		Key: []int{1, 0},
	}
}

func itemsTable(db string) *tidemark.Table {
	return &tidemark.Table{
		ID: tidemark.TableID{Database: db, Name: "items"},
		Columns: []tidemark.Column{
			{Name: "sku", Kind: tidemark.KindText},
			{Name: "qty", Kind: tidemark.KindInt, Bits: 32},
		},
		Key: []int{0},
	}
}

// stream is a deterministic source: transactions with sequence numbers
// 1..n, each with one to three changes on a small key space, so keys are
// inserted, updated many times, deleted and inserted again.
type stream struct {
	source string
	txns   [][]tidemark.Change // txns[i] has GTID sequence i+1
}

var epoch = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

func newStream(source, db string, n int) *stream {
	orders, items := ordersTable(db), itemsTable(db)
	live := map[string][]any{}
	st := &stream{source: source}
	rnd := uint64(42)
	next := func(k uint64) uint64 { // xorshift: deterministic
		rnd ^= rnd << 13
		rnd ^= rnd >> 7
		rnd ^= rnd << 17
		return rnd % k
	}
	for seq := uint64(1); seq <= uint64(n); seq++ {
		var txn []tidemark.Change
		commit := epoch.Add(time.Duration(seq) * time.Second)
		for idx := uint32(1); idx <= uint32(1+next(3)); idx++ {
			var t *tidemark.Table
			var row []any
			var name string
			if next(4) == 0 {
				t = items
				sku := "sku-" + strconv.FormatUint(next(5), 10)
				name = "items/" + sku
				row = []any{sku, int64(seq)}
			} else {
				t = orders
				id, tenant := int64(next(6)), "t"+strconv.FormatUint(next(2), 10)
				name = fmt.Sprintf("orders/%s/%d", tenant, id)
				var note any
				if seq%3 != 0 {
					note = fmt.Sprintf("note \"%d\"\n", seq)
				}
				row = []any{id, tenant, tidemark.Decimal(fmt.Sprintf("%d.%02d", seq, idx)), note, commit.Add(time.Duration(idx) * time.Microsecond)}
			}
			ch := tidemark.Change{Table: t, Version: tidemark.Version{Seq: seq, Index: idx}, CommitTime: commit, Size: 100}
			old, exists := live[name]
			switch {
			case !exists:
				ch.Op, ch.After = tidemark.OpInsert, row
				live[name] = row
			case next(4) == 0:
				ch.Op, ch.Before = tidemark.OpDelete, old
				delete(live, name)
			default:
				ch.Op, ch.Before, ch.After = tidemark.OpUpdate, old, row
				live[name] = row
			}
			txn = append(txn, ch)
		}
		st.txns = append(st.txns, txn)
	}
	return st
}

func gtid(seq uint64) tidemark.Position {
	return tidemark.Position{GTID: "0-1-" + strconv.FormatUint(seq, 10)}
}

// batches returns the transactions after from, txnsPerBatch per batch, each
// batch checkpointed after its last transaction.
func (s *stream) batches(from tidemark.Position, txnsPerBatch int) []*tidemark.Batch {
	start := 0
	if !from.IsZero() {
		set, err := tidemark.ParseMariaDBGTIDSet(from.GTID)
		if err != nil {
			panic(err)
		}
		start = int(set[0].Seq)
	}
	var out []*tidemark.Batch
	for i := start; i < len(s.txns); i += txnsPerBatch {
		end := min(i+txnsPerBatch, len(s.txns))
		b := &tidemark.Batch{Source: s.source, Checkpoint: gtid(uint64(end))}
		for _, txn := range s.txns[i:end] {
			b.Changes = append(b.Changes, txn...)
		}
		out = append(out, b)
	}
	return out
}

// changes returns every change of the stream in order.
func (s *stream) changes() []tidemark.Change {
	var out []tidemark.Change
	for _, txn := range s.txns {
		out = append(out, txn...)
	}
	return out
}

func apply(t testing.TB, s *Sink, b *tidemark.Batch) tidemark.ApplyStats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := s.Apply(ctx, b)
	if err != nil {
		t.Fatalf("apply batch (checkpoint %s): %v", b.Checkpoint, err)
	}
	if st.Total() != len(b.Changes) {
		t.Fatalf("apply batch: stats %+v for %d changes", st, len(b.Changes))
	}
	return st
}

func checkpointOf(t testing.TB, s *Sink, source string) (tidemark.Position, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pos, ok, err := s.Checkpoint(ctx, source)
	if err != nil {
		t.Fatalf("read checkpoint: %v", err)
	}
	return pos, ok
}

// consume reads every committed record of the topics (read_committed), up
// to their current ends, in partition order.
func consume(t testing.TB, c *kfake.Cluster, topics ...string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admCl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err != nil {
		t.Fatalf("list start offsets: %v", err)
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		t.Fatalf("list end offsets: %v", err)
	}
	type tp struct {
		t string
		p int32
	}
	remaining := map[tp]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if s, ok := starts.Lookup(o.Topic, o.Partition); ok && o.Offset > s.Offset {
			remaining[tp{o.Topic, o.Partition}] = o.Offset
		}
	})
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	for len(remaining) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consume %v: timed out with %d partitions short: %v", topics, len(remaining), remaining)
		}
		fs.EachError(func(t2 string, p int32, err error) { t.Fatalf("consume %s/%d: %v", t2, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			k := tp{r.Topic, r.Partition}
			end, ok := remaining[k]
			if !ok || r.Offset >= end {
				return
			}
			if !r.Attrs.IsControl() {
				out = append(out, r)
			}
			if r.Offset >= end-1 {
				delete(remaining, k)
			}
		})
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		if out[i].Partition != out[j].Partition {
			return out[i].Partition < out[j].Partition
		}
		return out[i].Offset < out[j].Offset
	})
	return out
}

// envelope is a decoded change record, numbers kept as text.
type envelope struct {
	Op     string         `json:"op"`
	Before map[string]any `json:"before"`
	After  map[string]any `json:"after"`
	Source struct {
		Name       string  `json:"name"`
		ServerID   *uint32 `json:"server_id"`
		Database   string  `json:"database"`
		Table      string  `json:"table"`
		CommitTime *string `json:"commit_time"`
		Seq        uint64  `json:"seq"`
		Index      uint32  `json:"index"`
		GTID       *string `json:"gtid"`
		File       *string `json:"file"`
		Pos        *uint64 `json:"pos"`
	} `json:"source"`
	TS string `json:"ts"`
}

func decodeEnvelope(t testing.TB, value []byte) envelope {
	t.Helper()
	var e envelope
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("decode envelope %s: %v", value, err)
	}
	return e
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// changeID names a change in assertions: table, seq.index.
func changeID(table string, v tidemark.Version) string {
	return table + "@" + v.String()
}

// expectedRow is how a row of ordersTable or itemsTable reads back.
func expectedRow(t *tidemark.Table, row []any) map[string]any {
	if row == nil {
		return nil
	}
	out := map[string]any{}
	for i, col := range t.Columns {
		switch v := row[i].(type) {
		case nil:
			out[col.Name] = nil
		case int64:
			out[col.Name] = json.Number(strconv.FormatInt(v, 10))
		case tidemark.Decimal:
			out[col.Name] = string(v)
		case string:
			out[col.Name] = v
		case time.Time:
			out[col.Name] = v.UTC().Format("2006-01-02T15:04:05.000000Z")
		default:
			panic(fmt.Sprintf("expectedRow: %T", v))
		}
	}
	return out
}
