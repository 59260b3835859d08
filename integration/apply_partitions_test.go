package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"tidemark/integration/harness"
)

// TestTailerStopsOnPartitionCountChange: partitions are added to a change
// topic of the scale-out topology while the tailer runs
// (kafka-topics --alter --partitions). Rows would then go to partitions no
// schema record was announced on, and a row's changes to two partitions:
// the tailer must stop before it publishes one, naming the topic and both
// counts (review finding 14), and nothing reaches the new partitions.
func TestTailerStopsOnPartitionCountChange(t *testing.T) {
	f := newFixture(t)
	r, _ := f.newApplyRun(t, "it_applyparts_", 107, 2, 50)
	// Metadata refreshes within a second, so the change is seen soon.
	ps := &procSet{f: f, t: t}
	defer ps.killAll()
	tailer := ps.start("run", "--config", r.cfg)
	ps.start("apply", "--config", r.cfg)
	if err := r.w.Run(30); err != nil {
		t.Fatal(err)
	}
	ps.converge(harness.TableSpec{Database: r.db, Table: "orders", SourceZone: "UTC"}, "before the partitions are added")
	topic := r.prefix + "." + r.db + ".orders"
	adm := kadmClient(t, r.brokers)
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	if _, err := adm.CreatePartitions(ctx, 2, topic); err != nil {
		t.Fatal(err)
	}
	// Write until the tailer's client has seen the new count (its
	// metadata refresh) and stopped, or for 60 s.
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) && !strings.Contains(tailer.stderr.String(), "partition count") {
		if err := r.w.Run(5); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
	}
	line := grepLines(tailer.stderr.String(), "partition count")
	if line == "" || !strings.Contains(line, topic) || !strings.Contains(line, "2") || !strings.Contains(line, "4") {
		ends, _ := adm.ListEndOffsets(ctx, topic)
		var onNew []string
		for p := int32(2); p < 4; p++ {
			if o, ok := ends.Lookup(topic, p); ok && o.Offset > 0 {
				onNew = append(onNew, o.Topic)
			}
		}
		t.Fatalf("60 s after the topic went from 2 to 4 partitions the tailer did not stop naming them (%d new partitions hold records):\ntailer:\n%s\napplier:\n%s",
			len(onNew), tail(withoutLines(tailer.stderr.String(), "apply status"), 6), tail(withoutLines(ps.procs[1].stderr.String(), "apply status"), 6))
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	for p := int32(2); p < 4; p++ {
		if o, _ := ends.Lookup(topic, p); o.Offset != 0 {
			// Aborted records leave markers, not readable records.
			starts, _ := adm.ListStartOffsets(ctx, topic)
			s, _ := starts.Lookup(topic, p)
			t.Logf("new partition %d: end offset %d, start %d (aborted transactions leave markers)", p, o.Offset, s.Offset)
		}
	}
	t.Logf("tailer: %s", line)
}
