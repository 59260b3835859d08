package kafka

import (
	"context"
	"errors"
	"sync"
	"testing"

	"tidemark"
)

// guardedSink is a PostgreSQL-like sink in memory, made of function fields:
// a version guard per key (replays are Skipped) and a checkpoint.
type guardedSink struct {
	apply      func(ctx context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error)
	checkpoint func(ctx context.Context, source string) (tidemark.Position, bool, error)
}

func (g *guardedSink) Apply(ctx context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error) {
	return g.apply(ctx, b)
}

func (g *guardedSink) Checkpoint(ctx context.Context, source string) (tidemark.Position, bool, error) {
	return g.checkpoint(ctx, source)
}

func (g *guardedSink) Close() error { return nil }

func newGuardedSink(fail func() error) *guardedSink {
	var (
		mu     sync.Mutex
		stored tidemark.Position
		rows   = map[tidemark.Key]tidemark.Version{}
	)
	return &guardedSink{
		apply: func(_ context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error) {
			mu.Lock()
			defer mu.Unlock()
			if err := fail(); err != nil {
				return tidemark.ApplyStats{}, err
			}
			var st tidemark.ApplyStats
			for _, ch := range b.Changes {
				if k := ch.Key(); ch.Version.Compare(rows[k]) > 0 {
					rows[k] = ch.Version
					st.Inserted++
				} else {
					st.Skipped++
				}
			}
			if !b.Checkpoint.IsZero() {
				stored = b.Checkpoint
			}
			return st, nil
		},
		checkpoint: func(context.Context, string) (tidemark.Position, bool, error) {
			mu.Lock()
			defer mu.Unlock()
			return stored, !stored.IsZero(), nil
		},
	}
}

// TestFanoutExactlyOnceOnKafka crashes a PostgreSQL+Kafka fan-out between
// the two sinks' commits, restarts from tidemark.Fanout's checkpoint (the
// older one) and checks that a read_committed consumer sees every change
// once: with Kafka last because Kafka resumes from its own checkpoint; with
// Kafka first because the Kafka sink drops the replayed batch it already
// committed.
func TestFanoutExactlyOnceOnKafka(t *testing.T) {
	for _, kafkaFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "postgres then kafka", true: "kafka then postgres"}[kafkaFirst], func(t *testing.T) {
			c := newCluster(t)
			cfg := testConfig(t, c, true)
			st := newStream("src", "shop", 100)
			const crashAt = 8
			applies := 0
			crashHere := func() error {
				if applies == crashAt {
					return errCrash
				}
				return nil
			}
			k := openSink(t, cfg)
			cfg = k.cfg
			pg := newGuardedSink(func() error {
				if kafkaFirst {
					return crashHere()
				}
				return nil
			})
			if !kafkaFirst {
				k.hookBeforeCommit = crashHere
			}
			fanout := func(k *Sink) *tidemark.Fanout {
				targets := []tidemark.FanoutTarget{{Name: "postgres", Sink: pg}, {Name: "kafka", Sink: k}}
				if kafkaFirst {
					targets[0], targets[1] = targets[1], targets[0]
				}
				f, err := tidemark.NewFanout(targets...)
				if err != nil {
					t.Fatal(err)
				}
				return f
			}
			f := fanout(k)
			var crashed *tidemark.Batch
			for _, b := range st.batches(tidemark.Position{}, 5) {
				applies++
				if _, err := f.Apply(context.Background(), b); err != nil {
					if !errors.Is(err, errCrash) {
						t.Fatal(err)
					}
					crashed = b
					break
				}
			}
			if crashed == nil {
				t.Fatal("no crash")
			}
			k.Close()
			applies = -1 << 20 // no more crashes

			k2 := restartSink(t, cfg)
			f = fanout(k2)
			pos, ok, err := f.Checkpoint(context.Background(), "src")
			if err != nil || !ok {
				t.Fatalf("fanout checkpoint: %s, %v, %v", pos, ok, err)
			}
			kpos, _ := checkpointOf(t, k2, "src")
			if kafkaFirst && kpos != crashed.Checkpoint || !kafkaFirst && kpos == crashed.Checkpoint {
				t.Fatalf("kafka checkpoint %s after the crash in batch %s: the crash is not between the commits", kpos, crashed.Checkpoint)
			}
			skipped := 0
			for i, b := range st.batches(pos, 5) {
				s, err := f.Apply(context.Background(), b)
				if err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					skipped = s.Skipped // the first sink's: kafka's when it is first
				}
			}
			if kafkaFirst && skipped != len(crashed.Changes) {
				t.Errorf("kafka skipped %d changes of the replayed batch, want %d", skipped, len(crashed.Changes))
			}
			if dups := checkDelivery(t, st, consume(t, c, topicsOf(cfg, "shop")...)); dups != 0 {
				t.Fatalf("%d duplicates on kafka", dups)
			}
		})
	}
}
