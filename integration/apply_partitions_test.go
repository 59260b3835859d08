package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
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

// TestTailerRestartAfterPartitionsAdded: partitions are added to a change
// topic while the tailer is stopped and the apply group has not applied
// everything the tailer published (review finding 14, across a restart).
// Publishing by the new count would put a key's next changes on another
// partition, whose member may apply them before the old partition's
// member applies the key's earlier ones. The tailer must not publish by
// it until the group has applied every record of the old partitions: with
// the group down it stops after apply.partition_change_wait, naming the
// topic and both counts, and nothing reaches the new partitions; once the
// group caught up it publishes by the new count and the target converges.
func TestTailerRestartAfterPartitionsAdded(t *testing.T) {
	f := newFixture(t)
	r, group := f.newApplyRun(t, "it_applyparts2_", 108, 2, 50)
	setYAML(t, r.cfg, "  max_records: 50\n", "  max_records: 50\n  partition_change_wait: 5s\n")
	spec := harness.TableSpec{Database: r.db, Table: "orders", SourceZone: "UTC"}
	topic := r.prefix + "." + r.db + ".orders"
	adm := kadmClient(t, r.brokers)
	ps := &procSet{f: f, t: t}
	defer ps.killAll()
	tailer := ps.start("run", "--config", r.cfg)
	applier := ps.start("apply", "--config", r.cfg)
	if err := r.w.Run(30); err != nil {
		t.Fatal(err)
	}
	ps.converge(spec, "before the applier stops")
	// The group stops; the tailer publishes more to partitions 0 and 1,
	// then stops too.
	if code := applier.stop(t); code != 0 {
		t.Fatalf("applier exit %d:\n%s", code, tail(applier.stderr.String(), 10))
	}
	if err := r.w.Run(40); err != nil {
		t.Fatal(err)
	}
	g := &gapTopology{f: f, r: r, group: group, adm: adm, topic: topic}
	old := g.settledEnds(t)
	if code := tailer.stop(t); code != 0 {
		t.Fatalf("tailer exit %d:\n%s", code, tail(tailer.stderr.String(), 10))
	}
	ps.procs = nil
	stored := g.stored(t)
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	if _, err := adm.CreatePartitions(ctx, 2, topic); err != nil {
		t.Fatal(err)
	}
	// Changes of existing keys (updates, deletes) and new ones while the
	// tailer is down.
	if err := r.w.Run(40); err != nil {
		t.Fatal(err)
	}
	onNew := func() string {
		ends, err := adm.ListEndOffsets(f.ctx, topic)
		if err != nil {
			return ""
		}
		var out []string
		for p := int32(2); p < 4; p++ {
			if o, ok := ends.Lookup(topic, p); ok && o.Offset > 0 {
				out = append(out, fmt.Sprintf("partition %d: end %d", p, o.Offset))
			}
		}
		return strings.Join(out, ", ")
	}
	restarted := ps.start("run", "--config", r.cfg)
	testenv.WaitFor(90*time.Second, func() bool { return restarted.exited() || onNew() != "" })
	if s := onNew(); s != "" {
		t.Fatalf("the restarted tailer published by the new count (%s) while the apply group had not applied partitions 0 and 1 (stored %v, ends %v):\n%s",
			s, stored, old, tail(restarted.stderr.String(), 8))
	}
	if !restarted.exited() {
		t.Fatalf("the restarted tailer neither stopped nor published:\n%s", tail(restarted.stderr.String(), 8))
	}
	line := grepLines(restarted.stderr.String(), "partition count of change topic")
	for _, want := range []string{topic, "is 4", "was 2", "tidemark apply", "partition 0"} {
		if !strings.Contains(line, want) {
			t.Errorf("the tailer's error does not say %q:\n%s", want, tail(restarted.stderr.String(), 8))
		}
	}
	// Recovery: the group applies the old partitions, then the tailer
	// publishes by the new count.
	ps.procs = nil
	ps.start("apply", "--config", r.cfg)
	resumed := ps.start("run", "--config", r.cfg)
	ps.converge(spec, "after the group caught up and the tailer resumed")
	if err := r.w.Run(40); err != nil {
		t.Fatal(err)
	}
	ps.converge(spec, "writes after the resume")
	if !strings.Contains(resumed.stderr.String(), "publishing by the new count") || onNew() == "" {
		t.Fatalf("the resumed tailer did not publish by the new count (new partitions: %q):\n%s", onNew(), tail(resumed.stderr.String(), 8))
	}
	t.Logf("stopped: %s", line)
}
