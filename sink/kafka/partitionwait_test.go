package kafka

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark"
)

// TestPartitionChangeWaitLeavesTheSinkFree: a tailer started after
// partitions were added waits inside Apply (at most
// apply.partition_change_wait, 60 s) until the apply group has applied
// every record of the old partitions. That wait must not hold the sink's
// lock: the pipeline's lock check reads the checkpoint (Checkpoint) while
// the batch waits, and a lock check blocked for a minute neither proves
// the lock nor notices it lost. Checkpoint returns while Apply still
// waits; Apply goes on once the group has caught up.
func TestPartitionChangeWaitLeavesTheSinkFree(t *testing.T) {
	c := newCluster(t)
	cfg := testConfig(t, c, true)
	cfg.ControlRecords = true
	cfg.Partitions = 1
	cfg.PartitionChangeWait = 20 * time.Second
	var caughtUp atomic.Bool
	asked := make(chan struct{}, 1)
	cfg.AppliedOffsets = func(context.Context, string) (map[int32]int64, error) {
		select {
		case asked <- struct{}{}:
		default:
		}
		if caughtUp.Load() {
			return map[int32]int64{0: 1 << 40}, nil
		}
		return map[int32]int64{}, nil // nothing applied yet
	}
	st := newStream("s", "shop", 6)
	bs := st.batches(tidemark.Position{}, 3)
	first := restartSink(t, cfg)
	apply(t, first, bs[0])
	first.Close()

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	listed, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var topics []string
	for _, name := range listed.Names() {
		if strings.HasPrefix(name, cfg.TopicPrefix+".") && name != cfg.CheckpointTopic {
			topics = append(topics, name)
		}
	}
	if len(topics) == 0 {
		t.Fatal("no change topic was created")
	}
	if _, err := adm.CreatePartitions(ctx, 1, topics...); err != nil {
		t.Fatal(err)
	}

	s := restartSink(t, cfg)
	applied := make(chan error, 1)
	go func() {
		_, err := s.Apply(ctx, bs[1])
		applied <- err
	}()
	<-asked // Apply waits for the group
	read := make(chan error, 1)
	go func() {
		_, _, err := s.Checkpoint(ctx, "s")
		read <- err
	}()
	select {
	case err := <-read:
		if err != nil {
			t.Fatalf("Checkpoint while Apply waits: %v", err)
		}
	case err := <-applied:
		t.Fatalf("Checkpoint waited for Apply's partition-count wait, which ended first: %v", err)
	}
	caughtUp.Store(true)
	if err := <-applied; err != nil {
		t.Fatalf("Apply after the group caught up: %v", err)
	}
	if pos, _ := checkpointOf(t, s, "s"); pos != bs[1].Checkpoint {
		t.Fatalf("checkpoint %v, want %v", pos, bs[1].Checkpoint)
	}
}
