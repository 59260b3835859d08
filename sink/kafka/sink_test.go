package kafka

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"tidemark"
	"tidemark/internal/testenv"
)

func TestConfigValidate(t *testing.T) {
	ok := Config{Brokers: []string{"127.0.0.1:9092"}}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"ok", func(*Config) {}, ""},
		{"no brokers", func(c *Config) { c.Brokers = nil }, "brokers: required"},
		{"empty broker", func(c *Config) { c.Brokers = []string{" "} }, "brokers[0]: empty"},
		{"unknown placeholder", func(c *Config) { c.TopicTemplate = "{prefix}.{schema}" }, "topic_template: unknown placeholder"},
		{"bad checkpoint topic", func(c *Config) { c.CheckpointTopic = "a b" }, "checkpoint_topic"},
		{"eos without id", func(c *Config) { c.ExactlyOnce = true }, "transactional_id: required"},
		{"short txn timeout", func(c *Config) { c.TransactionTimeout = time.Millisecond }, "transaction_timeout"},
		{"tiny buffer", func(c *Config) { c.MaxBufferedBytes = 10 }, "max_buffered_bytes"},
		{"record over buffer", func(c *Config) { c.MaxRecordBytes = 128 << 20 }, "max_record_bytes"},
		{"partitions", func(c *Config) { c.Partitions = -3 }, "partitions"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mutate(&c)
			err := c.withDefaults().validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestTopicName(t *testing.T) {
	tests := []struct {
		template, source string
		id               tidemark.TableID
		want             string
	}{
		{DefaultTopicTemplate, "src", tidemark.TableID{Database: "shop", Name: "orders"}, "tm.shop.orders"},
		// A replaced character adds a hash of the name as written, so
		// that names differing only there get their own topics.
		{"{source}-{table}", "main db", tidemark.TableID{Database: "shop", Name: "order$ 2"}, "main_db-order__2-e0e1eb43"},
		{"{prefix}.{database}.{table}", "s", tidemark.TableID{Database: "cafés", Name: "t"}, "tm.caf__s.t-6e2e8f29"},
		{DefaultTopicTemplate, "s", tidemark.TableID{Database: "shop", Name: "жж"}, "tm.shop.____-856a4aba"},
		{DefaultTopicTemplate, "s", tidemark.TableID{Database: "shop", Name: "ёё"}, "tm.shop.____-78a67b26"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			c := Config{TopicPrefix: "tm", TopicTemplate: tt.template}
			got, err := c.topicName(tt.source, tt.id)
			if err != nil || got != tt.want {
				t.Errorf("topicName = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestTopicCollisionIsAnError(t *testing.T) {
	c := newCluster(t)
	cfg := testConfig(t, c, false)
	cfg.TopicTemplate = "{prefix}.{table}"
	s := openSink(t, cfg)
	a := &tidemark.Table{ID: tidemark.TableID{Database: "a", Name: "t_1"}, Columns: []tidemark.Column{{Name: "id", Kind: tidemark.KindInt}}, Key: []int{0}}
	b := &tidemark.Table{ID: tidemark.TableID{Database: "b", Name: "t_1"}, Columns: a.Columns, Key: []int{0}}
	batch := &tidemark.Batch{Source: "src", Changes: []tidemark.Change{
		{Op: tidemark.OpInsert, Table: a, After: []any{int64(1)}},
		{Op: tidemark.OpInsert, Table: b, After: []any{int64(1)}},
	}}
	_, err := s.Apply(context.Background(), batch)
	if err == nil || !strings.Contains(err.Error(), "is also the topic of a.t_1") {
		t.Fatalf("err = %v, want a topic collision naming both tables", err)
	}
	// The second table only: it is quarantined, the first goes on.
	if te, ok := errors.AsType[*tidemark.TableError](err); !ok || te.Table != b.ID {
		t.Fatalf("err = %v, want a *tidemark.TableError of b.t_1", err)
	}
}

// TestOrderPerKeyAndTombstones publishes a stream with many changes per key
// and checks, in both delivery modes, that each key's records are on one
// partition in source order, every delete is followed by a tombstone,
// headers are set and the stats count every change.
func TestOrderPerKeyAndTombstones(t *testing.T) {
	for _, eos := range []bool{false, true} {
		t.Run(map[bool]string{false: "at-least-once", true: "exactly-once"}[eos], func(t *testing.T) {
			c := newCluster(t)
			cfg := testConfig(t, c, eos)
			s := openSink(t, cfg)
			st := newStream("src", "shop", 300)
			var total tidemark.ApplyStats
			for _, b := range st.batches(tidemark.Position{}, 7) {
				total.Add(apply(t, s, b))
			}
			all := st.changes()
			var inserts, updates, deletes int
			for _, ch := range all {
				switch ch.Op {
				case tidemark.OpInsert:
					inserts++
				case tidemark.OpUpdate:
					updates++
				case tidemark.OpDelete:
					deletes++
				}
			}
			if total != (tidemark.ApplyStats{Inserted: inserts, Updated: updates, Deleted: deletes}) {
				t.Errorf("stats %+v, want %d inserted, %d updated, %d deleted", total, inserts, updates, deletes)
			}

			changes, tombstones, keys := checkOrder(t, consume(t, c, topicsOf(cfg, "shop")...))
			if changes != len(all) || tombstones != deletes {
				t.Errorf("consumed %d changes and %d tombstones, want %d and %d", changes, tombstones, len(all), deletes)
			}
			if keys < 10 {
				t.Errorf("only %d keys: the test does not exercise ordering", keys)
			}
		})
	}
}

// checkOrder checks that each key's records are on one partition with
// growing versions, that each delete is followed by a tombstone, and the
// headers. It counts change records, tombstones and keys.
func checkOrder(t *testing.T, recs []*kgo.Record) (changes, tombstones, nkeys int) {
	t.Helper()
	type keyState struct {
		partition int32
		last      tidemark.Version
		deleted   bool // the last record was a delete: a tombstone must follow
	}
	keys := map[string]*keyState{}
	for _, r := range recs {
		k := r.Topic + "/" + string(r.Key)
		ks, seen := keys[k]
		if !seen {
			ks = &keyState{partition: r.Partition}
			keys[k] = ks
		}
		if ks.partition != r.Partition {
			t.Fatalf("key %s on partitions %d and %d", k, ks.partition, r.Partition)
		}
		if r.Value == nil {
			if !ks.deleted {
				t.Fatalf("tombstone for %s at offset %d without a delete before it", k, r.Offset)
			}
			if len(r.Headers) != 0 {
				t.Errorf("tombstone has headers %v", r.Headers)
			}
			ks.deleted = false
			tombstones++
			continue
		}
		if ks.deleted {
			t.Fatalf("key %s: delete at %s not followed by a tombstone", k, ks.last)
		}
		e := decodeEnvelope(t, r.Value)
		v := tidemark.Version{Seq: e.Source.Seq, Index: e.Source.Index}
		if seen && v.Compare(ks.last) <= 0 {
			t.Fatalf("key %s: version %s after %s (a gap filled late, or a duplicate)", k, v, ks.last)
		}
		ks.last, ks.deleted = v, e.Op == "d"
		if op, _ := header(r, "op"); op != e.Op {
			t.Errorf("op header %q, envelope op %q", op, e.Op)
		}
		if sv, _ := header(r, "schema_version"); sv != EnvelopeVersion {
			t.Errorf("schema_version header %q", sv)
		}
		if ts, ok := header(r, "table_schema"); !ok || len(ts) != 16 {
			t.Errorf("table_schema header %q", ts)
		}
		changes++
	}
	return changes, tombstones, len(keys)
}

func TestCheckpointRoundTrip(t *testing.T) {
	for _, eos := range []bool{false, true} {
		t.Run(map[bool]string{false: "at-least-once", true: "exactly-once"}[eos], func(t *testing.T) {
			c := newCluster(t)
			cfg := testConfig(t, c, eos)
			s := openSink(t, cfg)
			if pos, ok := checkpointOf(t, s, "src"); ok {
				t.Fatalf("fresh topic has checkpoint %s", pos)
			}
			st := newStream("src", "shop", 20)
			bs := st.batches(tidemark.Position{}, 5)
			apply(t, s, bs[0])
			// A part of a split transaction keeps the checkpoint where
			// it was.
			part := &tidemark.Batch{Source: "src", Changes: bs[1].Changes[:1]}
			apply(t, s, part)
			// Another source in the same topic does not interfere.
			apply(t, s, &tidemark.Batch{Source: "other", Checkpoint: gtid(999)})

			s2 := openSink(t, cfg)
			if pos, ok := checkpointOf(t, s2, "src"); !ok || pos != bs[0].Checkpoint {
				t.Errorf("checkpoint = %s, %v; want %s", pos, ok, bs[0].Checkpoint)
			}
			if pos, ok := checkpointOf(t, s2, "other"); !ok || pos != gtid(999) {
				t.Errorf("checkpoint of other = %s, %v", pos, ok)
			}
			// Many batches: the newest is found beyond the first window.
			for _, b := range bs[1:] {
				apply(t, s2, b)
			}
			for i := uint64(1); i <= 200; i++ {
				apply(t, s2, &tidemark.Batch{Source: "other", Checkpoint: gtid(1000 + i)})
			}
			s3 := openSink(t, cfg)
			if pos, _ := checkpointOf(t, s3, "src"); pos != bs[len(bs)-1].Checkpoint {
				t.Errorf("checkpoint after %d batches of another source = %s, want %s", 200, pos, bs[len(bs)-1].Checkpoint)
			}
		})
	}
}

// TestCheckpointIgnoresAbortedAndOpen writes checkpoint records in an
// aborted and in a still-open transaction: neither counts.
func TestCheckpointIgnoresAbortedAndOpen(t *testing.T) {
	c := newCluster(t)
	s := openSink(t, testConfig(t, c, true))
	cfg := s.cfg
	apply(t, s, &tidemark.Batch{Source: "src", Checkpoint: gtid(1)})

	raw, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID(testenv.Name("other-")),
		kgo.RecordPartitioner(newPartitioner(cfg.CheckpointTopic, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	ctx := context.Background()
	write := func(pos string, commit kgo.TransactionEndTry, end bool) {
		if err := raw.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		v, err := checkpoint{Position: pos, Batch: "x"}.append(nil)
		if err != nil {
			t.Fatal(err)
		}
		rec := &kgo.Record{Topic: cfg.CheckpointTopic, Key: []byte("src"), Value: v}
		if err := raw.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if end {
			if err := raw.EndTransaction(ctx, commit); err != nil {
				t.Fatal(err)
			}
		}
	}
	write("gtid=0-1-50", kgo.TryAbort, true)
	if pos, _ := checkpointOf(t, s, "src"); pos != gtid(1) {
		t.Fatalf("after an aborted checkpoint: %s, want %s", pos, gtid(1))
	}
	write("gtid=0-1-60", kgo.TryCommit, true)
	if pos, _ := checkpointOf(t, s, "src"); pos != gtid(60) {
		t.Fatalf("after a committed checkpoint: %s, want 0-1-60", pos)
	}
	write("gtid=0-1-70", kgo.TryCommit, false) // left open
	if pos, _ := checkpointOf(t, s, "src"); pos != gtid(60) {
		t.Fatalf("with an open transaction: %s, want 0-1-60", pos)
	}
}

// TestBackpressure stalls the broker and checks that Apply blocks with at
// most MaxBufferedRecords buffered, then completes.
func TestBackpressure(t *testing.T) {
	c := newCluster(t)
	cfg := testConfig(t, c, false)
	cfg.MaxBufferedRecords = 50
	s := openSink(t, cfg)
	st := newStream("src", "shop", 400)
	bs := st.batches(tidemark.Position{}, 400)
	apply(t, s, &tidemark.Batch{Source: "src", Changes: bs[0].Changes[:1]}) // create the topics

	release := make(chan struct{})
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		c.SleepControl(func() { <-release })
		return nil, nil, false
	})
	done := make(chan error, 1)
	go func() {
		_, err := s.Apply(context.Background(), &tidemark.Batch{Source: "src", Changes: bs[0].Changes[1:], Checkpoint: bs[0].Checkpoint})
		done <- err
	}()
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		// The limit, plus the one record whose Produce is blocked.
		if n := s.cl.BufferedProduceRecords(); n > int64(cfg.MaxBufferedRecords)+1 {
			t.Fatalf("%d records buffered, limit %d", n, cfg.MaxBufferedRecords)
		}
		select {
		case err := <-done:
			t.Fatalf("Apply returned (%v) while the broker was stalled", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if n := s.cl.BufferedProduceRecords(); n == 0 {
		t.Fatalf("nothing buffered while stalled")
	}
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("apply: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Apply did not finish after the broker resumed")
	}
}

func TestApplyErrors(t *testing.T) {
	c := newCluster(t)
	s := openSink(t, testConfig(t, c, true))
	ctx := context.Background()
	if _, err := s.Apply(ctx, &tidemark.Batch{Changes: []tidemark.Change{{}}}); err == nil || !strings.Contains(err.Error(), "source: required") {
		t.Errorf("no source: %v", err)
	}
	tbl := ordersTable("shop")
	bad := &tidemark.Batch{Source: "src", Checkpoint: gtid(1), Changes: []tidemark.Change{
		{Op: tidemark.OpInsert, Table: tbl, After: []any{int64(1), "t", "not a Decimal", nil, time.Now()}},
	}}
	bad.Changes[0].After[2] = 1.5
	_, err := s.Apply(ctx, bad)
	var ve *tidemark.ValueError
	if !errors.As(err, &ve) || ve.Column != "amount" {
		t.Errorf("bad value: %v", err)
	}
	if pos, ok := checkpointOf(t, s, "src"); ok {
		t.Errorf("checkpoint %s stored for a failed batch", pos)
	}
}

// TestWatermarks stores catch-up watermarks with the checkpoint and reads
// them back from a new instance: per table, never backwards, and (with
// exactly-once) only when the batch committed.
func TestWatermarks(t *testing.T) {
	for _, eos := range []bool{false, true} {
		t.Run(map[bool]string{false: "at-least-once", true: "exactly-once"}[eos], func(t *testing.T) {
			c := newCluster(t)
			cfg := testConfig(t, c, eos)
			s := openSink(t, cfg)
			cfg = s.cfg
			orders := tidemark.TableID{Database: "shop", Name: "orders"}
			items := tidemark.TableID{Database: "shop", Name: "items"}
			t1 := time.Date(2026, 11, 29, 10, 0, 0, 123456789, time.UTC)
			st := newStream("src", "shop", 10)
			bs := st.batches(tidemark.Position{}, 5)
			bs[0].Watermarks = []tidemark.Watermark{{Table: orders, Value: t1}}
			apply(t, s, bs[0])
			// A catch-up chunk with no changes and no position moves only
			// a watermark; an older one never moves it back.
			apply(t, s, &tidemark.Batch{Source: "src", Watermarks: []tidemark.Watermark{
				{Table: items, Value: t1.Add(time.Hour)}, {Table: orders, Value: t1.Add(-time.Hour)}}})
			if eos {
				s.hookBeforeCommit = func() error { return errCrash }
				b := *bs[1]
				b.Watermarks = []tidemark.Watermark{{Table: orders, Value: t1.Add(48 * time.Hour)}}
				if _, err := s.Apply(context.Background(), &b); !errors.Is(err, errCrash) {
					t.Fatalf("crash: %v", err)
				}
			}
			s.Close()

			s2 := restartSink(t, cfg)
			for _, tt := range []struct {
				id   tidemark.TableID
				want time.Time
				ok   bool
			}{
				{orders, t1, true},
				{items, t1.Add(time.Hour), true},
				{tidemark.TableID{Database: "shop", Name: "other"}, time.Time{}, false},
			} {
				got, ok, err := s2.Watermark(context.Background(), "src", tt.id)
				if err != nil || ok != tt.ok || !got.Equal(tt.want) {
					t.Errorf("Watermark(%s) = %s, %v, %v; want %s, %v", tt.id, got, ok, err, tt.want, tt.ok)
				}
			}
			if pos, _ := checkpointOf(t, s2, "src"); pos != bs[0].Checkpoint {
				t.Errorf("checkpoint %s, want %s (a watermark-only batch keeps it)", pos, bs[0].Checkpoint)
			}
		})
	}
}

// TestBatchAfterFailoverIsPublished is finding 2 of issue 13: after a
// MariaDB failover the new primary's binlog files are numbered from 1 while
// its GTIDs go on. Ordered by file, every batch looked "already published"
// and was dropped; ordered by GTID (and epoch) it is published.
func TestBatchAfterFailoverIsPublished(t *testing.T) {
	c := newCluster(t)
	s := openSink(t, testConfig(t, c, true))
	st := newStream("src", "shop", 4)
	bs := st.batches(tidemark.Position{}, 2)
	bs[0].Checkpoint = tidemark.Position{GTID: "0-1-2", File: "mysql-bin.000009", Offset: 5000}
	apply(t, s, bs[0])
	bs[1].Checkpoint = tidemark.Position{GTID: "0-2-4", File: "mysql-bin.000001", Offset: 900}
	if got := apply(t, s, bs[1]); got.Skipped != 0 {
		t.Fatalf("batch of the new primary skipped as already published: %+v", got)
	}
	if pos, _ := checkpointOf(t, s, "src"); pos != bs[1].Checkpoint {
		t.Fatalf("checkpoint = %s, want %s", pos, bs[1].Checkpoint)
	}
	// A replay of the first batch is still recognised.
	if got := apply(t, s, bs[0]); got.Skipped != len(bs[0].Changes) {
		t.Fatalf("replayed batch not skipped: %+v", got)
	}
	// Two identities in one epoch cannot be ordered: an error, not a guess.
	id := func(server string) tidemark.SourceIdentity {
		return tidemark.SourceIdentity{Flavor: "mariadb", Server: server, Domain: "0", Scheme: "gtid", Basename: "mysql-bin"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := &tidemark.Batch{Source: "x", Checkpoint: tidemark.Position{GTID: "0-1-5", Source: id("1")}}
	if _, err := s.Apply(ctx, b); err != nil {
		t.Fatal(err)
	}
	b = &tidemark.Batch{Source: "x", Checkpoint: tidemark.Position{GTID: "0-2-3", Source: id("2")}, Changes: bs[1].Changes}
	if _, err := s.Apply(ctx, b); !errors.Is(err, tidemark.ErrIncomparable) {
		t.Fatalf("incomparable checkpoint: err = %v, want ErrIncomparable", err)
	}
}
