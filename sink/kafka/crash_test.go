package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"tidemark"
)

var errCrash = errors.New("simulated crash")

// crash arms a sink to die while applying its crashAt-th batch.
type crash struct {
	name string
	arm  func(t *testing.T, c *kfake.Cluster, s *Sink, crashAt int, applies *atomic.Int32)
}

var crashes = []crash{
	{"records written, not committed", func(t *testing.T, _ *kfake.Cluster, s *Sink, crashAt int, applies *atomic.Int32) {
		s.hookBeforeCommit = func() error {
			if int(applies.Load()) == crashAt {
				return errCrash
			}
			return nil
		}
	}},
	{"committed, not acknowledged", func(t *testing.T, _ *kfake.Cluster, s *Sink, crashAt int, applies *atomic.Int32) {
		s.hookAfterCommit = func() error {
			if int(applies.Load()) == crashAt {
				return errCrash
			}
			return nil
		}
	}},
	{"killed while producing", func(t *testing.T, c *kfake.Cluster, s *Sink, crashAt int, applies *atomic.Int32) {
		var produced atomic.Int32
		c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			if int(applies.Load()) == crashAt && produced.Add(1) == 1 {
				// The process dies: its connections close, nothing
				// more is sent, the transaction stays open.
				go s.cl.Close()
				return nil, errCrash, true
			}
			return nil, nil, false
		})
	}},
}

// runUntilCrash applies the stream's batches until the armed crash stops
// one; it fails the test if no crash happened.
func runUntilCrash(t *testing.T, s *Sink, st *stream, crashAt int, applies *atomic.Int32) {
	t.Helper()
	for _, b := range st.batches(tidemark.Position{}, 5) {
		applies.Add(1)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := s.Apply(ctx, b)
		cancel()
		if err != nil {
			t.Logf("crashed at batch %d (checkpoint %s): %v", applies.Load(), b.Checkpoint, err)
			return
		}
	}
	t.Fatalf("no crash: the test does not test a restart")
}

// resume opens a new instance with the same config (and transactional id),
// reads its checkpoint and applies the rest of the stream, in batches cut
// differently from the first run's.
func resume(t *testing.T, cfg Config, st *stream) {
	t.Helper()
	s := restartSink(t, cfg)
	pos, _ := checkpointOf(t, s, st.source)
	t.Logf("restarted from %q", pos)
	for _, b := range st.batches(pos, 7) {
		apply(t, s, b)
	}
}

// checkDelivery matches the consumed change records against the stream:
// every change must be there, with its content; it returns how many
// changes were delivered more than once.
func checkDelivery(t *testing.T, st *stream, recs []*kgo.Record) (duplicates int) {
	t.Helper()
	want := map[string]tidemark.Change{}
	for _, ch := range st.changes() {
		want[changeID(ch.Table.ID.Name, ch.Version)] = ch
	}
	seen := map[string]int{}
	for _, r := range recs {
		if r.Value == nil {
			continue
		}
		e := decodeEnvelope(t, r.Value)
		id := changeID(e.Source.Table, tidemark.Version{Seq: e.Source.Seq, Index: e.Source.Index})
		ch, ok := want[id]
		if !ok {
			t.Fatalf("consumed a change %s the stream does not have", id)
		}
		seen[id]++
		if seen[id] > 1 {
			duplicates++
			continue
		}
		wantOp := opCode(ch.Op)
		before, after := ch.Before, ch.After
		if ch.Op == tidemark.OpDelete {
			after = nil
		}
		if e.Op != wantOp || !reflect.DeepEqual(e.Before, expectedRow(ch.Table, before)) || !reflect.DeepEqual(e.After, expectedRow(ch.Table, after)) {
			t.Fatalf("change %s: got op %s before %v after %v; want op %s before %v after %v", id, e.Op, e.Before, e.After, wantOp, expectedRow(ch.Table, before), expectedRow(ch.Table, after))
		}
		if want := expectedKey(ch.Table, ch.Row()); string(r.Key) != want {
			t.Fatalf("change %s: key %s, want %s", id, r.Key, want)
		}
	}
	var missing []string
	for id := range want {
		if seen[id] == 0 {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("%d of %d changes missing, e.g. %v", len(missing), len(want), missing[:min(5, len(missing))])
	}
	return duplicates
}

// expectedKey is the record key of a row of ordersTable or itemsTable.
func expectedKey(t *tidemark.Table, row []any) string {
	out := "{"
	for i, k := range t.Key {
		if i > 0 {
			out += ","
		}
		name, _ := json.Marshal(t.Columns[k].Name)
		v, _ := json.Marshal(row[k])
		out += string(name) + ":" + string(v)
	}
	return out + "}"
}

func topicsOf(cfg Config, db string) []string {
	return []string{cfg.TopicPrefix + "." + db + ".orders", cfg.TopicPrefix + "." + db + ".items"}
}

// TestKillAndRestartExactlyOnce kills an instance mid-stream in several
// ways, restarts from the checkpoint topic and checks that a read_committed
// consumer sees every change exactly once, with its content.
func TestKillAndRestartExactlyOnce(t *testing.T) {
	for _, cr := range crashes {
		t.Run(cr.name, func(t *testing.T) {
			c := newCluster(t)
			cfg := testConfig(t, c, true)
			s := openSink(t, cfg)
			cfg = s.cfg
			st := newStream("src", "shop", 200)
			var applies atomic.Int32
			cr.arm(t, c, s, 17, &applies)
			runUntilCrash(t, s, st, 17, &applies)
			s.Close()
			resume(t, cfg, st)

			recs := consume(t, c, topicsOf(cfg, "shop")...)
			if dups := checkDelivery(t, st, recs); dups != 0 {
				t.Fatalf("exactly-once: %d changes delivered twice", dups)
			}
		})
	}
}

// TestKillAndRestartAtLeastOnce is the same without transactions: nothing
// is lost, and the duplicates are counted and reported.
func TestKillAndRestartAtLeastOnce(t *testing.T) {
	for _, cr := range crashes {
		t.Run(cr.name, func(t *testing.T) {
			c := newCluster(t)
			cfg := testConfig(t, c, false)
			s := openSink(t, cfg)
			cfg = s.cfg
			st := newStream("src", "shop", 200)
			var applies atomic.Int32
			cr.arm(t, c, s, 17, &applies)
			runUntilCrash(t, s, st, 17, &applies)
			s.Close()
			resume(t, cfg, st)

			recs := consume(t, c, topicsOf(cfg, "shop")...)
			dups := checkDelivery(t, st, recs)
			t.Logf("at-least-once, crash %q: %d of %d changes delivered twice", cr.name, dups, len(st.changes()))
			if cr.name == "records written, not committed" && dups == 0 {
				t.Errorf("expected duplicates: the crashed batch's records were acknowledged before its checkpoint")
			}
		})
	}
}

// TestFencing starts a second instance with the same transactional id: an
// instance that only opens and reads the checkpoint (an admin command, a
// standby waiting for the source's lock) leaves the first alone; one that
// activates fences the first with a clear error, carries on, and nothing is
// lost or doubled.
func TestFencing(t *testing.T) {
	c := newCluster(t)
	cfg := testConfig(t, c, true)
	a := openSink(t, cfg)
	cfg = a.cfg
	st := newStream("src", "shop", 60)
	bs := st.batches(tidemark.Position{}, 5)
	apply(t, a, bs[0])
	apply(t, a, bs[1])

	r := openSink(t, cfg) // reads only
	if pos, _ := checkpointOf(t, r, "src"); pos != bs[1].Checkpoint {
		t.Fatalf("reading instance sees checkpoint %s, want %s", pos, bs[1].Checkpoint)
	}
	if _, err := a.Apply(context.Background(), bs[2]); err != nil {
		t.Fatalf("first instance after another one opened and read the checkpoint: %v", err)
	}
	bs = bs[1:]

	b := openSink(t, cfg)
	if err := b.Activate(context.Background()); err != nil { // fences a
		t.Fatal(err)
	}
	_, err := a.Apply(context.Background(), bs[2])
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("first instance after the second started: err = %v, want ErrFenced", err)
	}
	want := fmt.Sprintf("sink/kafka: fenced by another instance with transactional id %s", cfg.TransactionalID)
	if got := err.Error(); len(got) < len(want) || got[:len(want)] != want {
		t.Errorf("error %q, want it to start with %q", got, want)
	}
	if _, err := a.Apply(context.Background(), bs[2]); !errors.Is(err, ErrFenced) {
		t.Errorf("fenced instance accepted another batch: %v", err)
	}

	pos, _ := checkpointOf(t, b, "src")
	if pos != bs[1].Checkpoint {
		t.Fatalf("second instance resumes from %s, want %s", pos, bs[1].Checkpoint)
	}
	for _, bb := range st.batches(pos, 5) {
		apply(t, b, bb)
	}
	if dups := checkDelivery(t, st, consume(t, c, topicsOf(cfg, "shop")...)); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
}

// TestFencedMidTransaction fences an instance while its transaction is
// open: the records it wrote are aborted, never seen by read_committed.
func TestFencedMidTransaction(t *testing.T) {
	c := newCluster(t)
	cfg := testConfig(t, c, true)
	a := openSink(t, cfg)
	cfg = a.cfg
	st := newStream("src", "shop", 60)
	bs := st.batches(tidemark.Position{}, 5)
	apply(t, a, bs[0])
	var b *Sink
	a.hookBeforeCommit = func() error {
		if b == nil {
			b = openSink(t, cfg) // starts while a's transaction is open
			if err := b.Activate(context.Background()); err != nil {
				return err
			}
		}
		return nil
	}
	_, err := a.Apply(context.Background(), bs[1])
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("commit after being fenced: err = %v, want ErrFenced", err)
	}
	if n := strings.Count(err.Error(), "fenced by another instance with transactional id "+cfg.TransactionalID); n != 1 {
		t.Errorf("error %q names the fencing %d times", err, n)
	}
	pos, _ := checkpointOf(t, b, "src")
	if pos != bs[0].Checkpoint {
		t.Fatalf("checkpoint %s, want %s", pos, bs[0].Checkpoint)
	}
	for _, bb := range st.batches(pos, 5) {
		apply(t, b, bb)
	}
	if dups := checkDelivery(t, st, consume(t, c, topicsOf(cfg, "shop")...)); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
}
