package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// gapTopology is a tailer and one applier on topics of 4 partitions whose
// target converged once; then the applier is stopped.
type gapTopology struct {
	f     *fixture
	r     *kafkaRun
	group string
	ps    *procSet
	adm   *kadm.Client
	topic string
	spec  harness.TableSpec
}

func startGapTopology(t *testing.T, tag string, seed uint64) *gapTopology {
	t.Helper()
	f := newFixture(t)
	r, group := f.newApplyRun(t, tag, seed, 4, 50)
	g := &gapTopology{f: f, r: r, group: group, ps: &procSet{f: f, t: t}, adm: kadmClient(t, r.brokers),
		topic: r.prefix + "." + r.db + ".orders", spec: harness.TableSpec{Database: r.db, Table: "orders", SourceZone: "UTC"}}
	t.Cleanup(g.ps.killAll)
	g.ps.start("run", "--config", r.cfg)
	g.ps.start("apply", "--config", r.cfg)
	if err := r.w.Run(40); err != nil {
		t.Fatal(err)
	}
	g.ps.converge(g.spec, "before the applier stops")
	g.ps.procs[1].kill()
	g.ps.procs = g.ps.procs[:1]
	return g
}

// stored returns the group's stored next offset per partition of the topic.
func (g *gapTopology) stored(t *testing.T) map[int32]int64 {
	t.Helper()
	rows, err := g.f.pg.Query(g.f.ctx, "SELECT partition, next_offset FROM tidemark.stream_offsets WHERE consumer_group = $1 AND topic = $2", g.group, g.topic)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int32]int64{}
	for rows.Next() {
		var p int32
		var n int64
		if err := rows.Scan(&p, &n); err != nil {
			t.Fatal(err)
		}
		out[p] = n
	}
	return out
}

// settledEnds waits until the topic's end offsets stop moving (the tailer
// published what the workload wrote) and returns them.
func (g *gapTopology) settledEnds(t *testing.T) map[int32]int64 {
	t.Helper()
	var last map[int32]int64
	same := 0
	deadline := time.Now().Add(60 * time.Second)
	for same < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Second)
		ends, err := g.adm.ListEndOffsets(g.f.ctx, g.topic)
		if err != nil {
			continue
		}
		cur := map[int32]int64{}
		ends.Each(func(o kadm.ListedOffset) { cur[o.Partition] = o.Offset })
		if fmt.Sprint(cur) == fmt.Sprint(last) {
			same++
		} else {
			same = 0
		}
		last = cur
	}
	return last
}

// expectStops starts an applier and waits until it stopped every partition
// naming want (and the partition); it fails when instead the stored offsets
// reach the end of the topic with no such error (the gap applied in
// silence), showing how many source rows the target lacks.
func (g *gapTopology) expectStops(t *testing.T, what string, ends map[int32]int64, want ...string) *daemonProc {
	t.Helper()
	a := g.ps.start("apply", "--config", g.r.cfg)
	stopped := func() int {
		n := 0
		for p := range ends {
			for _, l := range strings.Split(a.stderr.String(), "\n") {
				if strings.Contains(l, "partition stopped") && strings.Contains(l, fmt.Sprintf("topic=%s partition=%d ", g.topic, p)) {
					n++
					break
				}
			}
		}
		return n
	}
	caughtUp := func() bool {
		st := g.stored(t)
		for p, e := range ends {
			if st[p] < e {
				return false
			}
		}
		return true
	}
	if !testenv.WaitFor(90*time.Second, func() bool { return stopped() == len(ends) || caughtUp() || a.exited() }) || stopped() != len(ends) {
		d, _ := harness.Compare(g.f.ctx, g.f.my, g.f.pg, g.spec)
		t.Fatalf("%s: the applier stopped %d of %d partitions (caught up to the end: %v, stored %v, ends %v); the target vs the source: %v\n%s",
			what, stopped(), len(ends), caughtUp(), g.stored(t), ends, d, tail(withoutLines(a.stderr.String(), "apply status"), 12))
	}
	for _, l := range strings.Split(a.stderr.String(), "\n") {
		if !strings.Contains(l, "partition stopped") {
			continue
		}
		for _, w := range want {
			if !strings.Contains(l, w) {
				t.Errorf("%s: the error does not say %q:\n%s", what, w, l)
			}
		}
	}
	if a.exited() {
		t.Fatalf("%s: the applier exited instead of stopping the partitions:\n%s", what, tail(a.stderr.String(), 10))
	}
	return a
}

// TestApplyStopsBelowLogStart: the apply group is stopped while the log's
// start moves past its stored offsets (retention, or an operator's
// kafka-delete-records): records it never applied are gone. A member that
// starts then must not apply from the log start in silence; it stops each
// such partition with one error naming topic, partition, stored offset,
// log start and the resync. The documented recovery (move the offsets to
// the log start, resync the table) brings the target back to the source.
func TestApplyStopsBelowLogStart(t *testing.T) {
	g := startGapTopology(t, "it_applygap_", 103)
	if err := g.r.w.Run(40); err != nil {
		t.Fatal(err)
	}
	ends := g.settledEnds(t)
	stored := g.stored(t)
	del := kadm.Offsets{}
	for p, e := range ends {
		if stored[p] >= e {
			t.Fatalf("partition %d: stored %d, end %d: the workload published nothing there", p, stored[p], e)
		}
		del.Add(kadm.Offset{Topic: g.topic, Partition: p, At: e})
	}
	ctx, cancel := context.WithTimeout(g.f.ctx, 30*time.Second)
	defer cancel()
	if _, err := g.adm.DeleteRecords(ctx, del); err != nil {
		t.Fatal(err)
	}
	a := g.expectStops(t, "below the log start", ends, "stored offset", "log start", "resync")
	a.kill()
	g.ps.procs = g.ps.procs[:1]
	// Recovery (docs/SCALE-OUT.md): move the offsets to the log start,
	// then resync the table.
	for p, e := range ends {
		if _, err := g.f.pg.Exec(g.f.ctx, "UPDATE tidemark.stream_offsets SET next_offset = $4 WHERE consumer_group = $1 AND topic = $2 AND partition = $3",
			g.group, g.topic, p, e); err != nil {
			t.Fatal(err)
		}
	}
	g.ps.start("apply", "--config", g.r.cfg)
	env := []string{"TM_IT_MYSQL_PASSWORD=" + g.f.env.MySQLPassword, "TM_IT_PG_DSN=" + g.f.env.PGDSN}
	if code, out := runBinary(t, 120*time.Second, env, "resync", "--config", g.r.cfg, "--table", g.r.db+".orders", "--wait", "100s"); code != 0 {
		t.Fatalf("resync: exit %d\n%s", code, out)
	}
	g.ps.converge(g.spec, "after the recovery")
}

// TestApplyStopsOnRecreatedTopic: the change topic is deleted and created
// again while the apply group is stopped (to repartition, say), and the
// tailer publishes into the new topic until its log reaches the group's
// stored offsets. A member that starts then must not resume at the stored
// offsets of the old topic in silence (the new log's records before them
// would be skipped): it stops each partition naming the re-created topic.
func TestApplyStopsOnRecreatedTopic(t *testing.T) {
	g := startGapTopology(t, "it_applyrecr_", 104)
	stored := g.stored(t)
	g.ps.procs[0].kill()
	ctx, cancel := context.WithTimeout(g.f.ctx, 60*time.Second)
	defer cancel()
	if _, err := g.adm.DeleteTopics(ctx, g.topic); err != nil {
		t.Fatal(err)
	}
	if !testenv.WaitFor(30*time.Second, func() bool {
		td, err := g.adm.ListTopics(ctx, g.topic)
		return err == nil && !td.Has(g.topic)
	}) {
		t.Fatal("the topic was not deleted")
	}
	g.ps.procs = nil
	g.ps.start("run", "--config", g.r.cfg)
	// Publish until every partition of the new topic reaches the stored
	// offset (the applier would then fetch "in range").
	var ends map[int32]int64
	for i := 0; ; i++ {
		if i == 10 {
			t.Fatalf("the new topic did not reach the stored offsets %v: ends %v", stored, ends)
		}
		if err := g.r.w.Run(60); err != nil {
			t.Fatal(err)
		}
		ends = g.settledEnds(t)
		reached := len(ends) == len(stored)
		for p, n := range stored {
			reached = reached && ends[p] > n
		}
		if reached {
			break
		}
	}
	g.expectStops(t, "a re-created topic", ends, "re-created", "resync")
}
