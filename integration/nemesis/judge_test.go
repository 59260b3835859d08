package nemesis

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark/integration/harness"
)

// watchI5 puts the I5 version-regression trigger (harness.I5WatchSQL, the
// reliability suite's) on every table the daemon (or an applier) creates
// in the campaign's schema, keyed by its primary key.
func watchI5(c *campaign) {
	if _, err := c.pg.Exec(c.ctx, harness.I5SetupSQL(c.db)+harness.I5WatchSQL(c.db, "nm_i5_"+c.db)); err != nil {
		c.t.Fatalf("set up I5 in %s: %v", c.db, err)
	}
}

// quarantineLine finds tidemark's quarantine error for a table in the logs
// of every process of the campaign.
func (c *campaign) quarantineLine(tb string) string {
	re := regexp.MustCompile(`level=ERROR msg="table (is )?quarantined[^\n]*table=` + regexp.QuoteMeta(c.db+"."+tb) + `( |$)[^\n]*`)
	for _, p := range c.procs {
		if m := re.FindString(p.log.String()); m != "" {
			return m
		}
	}
	return ""
}

// exitLine is the last ERROR line of a process that exited by itself.
func exitLine(p *proc) string {
	lines := strings.Split(p.log.String(), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "level=ERROR") {
			return lines[i]
		}
	}
	return tail(p.log.String(), 3)
}

// lockHandover is the error a `run` stops with when another process took
// its source's lock (and so its writing) over: the lock checker's "lost the
// source lock", or the Kafka broker fencing its transactional producer.
var lockHandover = regexp.MustCompile(`level=ERROR .*(lost the source lock|fenced by another instance)`)

// handedOverTo returns the `run` process that took over from p when p is a
// `run` that stopped with lockHandover while that one still runs (it then
// holds the lock; the judge still requires every table equal and its clean
// exit on SIGTERM), else nil.
func handedOverTo(p *proc, procs []*proc) *proc {
	if len(p.args) == 0 || p.args[0] != "run" || !lockHandover.MatchString(exitLine(p)) {
		return nil
	}
	for _, q := range procs {
		if q != p && len(q.args) > 0 && q.args[0] == "run" && !q.exited() {
			return q
		}
	}
	return nil
}

// judge lets the system settle, then checks every table: equal to the
// source (harness.Compare: row by row, no business key twice; soft deletes
// compare the live rows), or quarantined with tidemark saying so where the
// draws make that a documented refusal; no process stopped by itself
// unless it named the table and the cause and the rest is equal; no I5
// record; every process still running stops cleanly.
func (c *campaign) judge() {
	t := c.t
	c.phase = "settle"
	c.proxy.RemoveAll()
	for _, p := range c.procs {
		if p.stopped {
			p.cont()
		}
	}
	diffs := map[string]*harness.Diff{}
	quarantined := map[string]string{}
	settled := func() bool {
		all := true
		for _, tb := range c.tables {
			if q := c.quarantineLine(tb.name); q != "" {
				quarantined[tb.name] = q
			}
			d, err := harness.Compare(c.ctx, c.my, c.pg, harness.TableSpec{Database: c.db, Table: tb.name, Key: tb.compareKey(), SourceZone: c.s.zone, SoftDelete: c.s.deleteMode == "soft"})
			if err != nil {
				d = &harness.Diff{Table: tb.name, Examples: []string{err.Error()}, Missing: 1}
			}
			diffs[tb.name] = d
			if !d.Equal() && quarantined[tb.name] == "" {
				all = false
			}
		}
		return all
	}
	// 150 s, and longer while the target still moves: on a loaded
	// machine an apply group with max_records 7 takes minutes over a
	// first-run snapshot of 40,000 rows (soak seed 635885042598: the
	// settle ended while partition 5 of t0 was in its snapshot). The
	// settle waits on as long as the appliers' stored offsets or the
	// checkpoint moved in the last settleStall, up to settleMax; a target
	// that stops moving is judged as it is.
	start := time.Now()
	deadline := start.Add(settleFor)
	moved, movedAt := c.applied(), start
	extended := false
	// Once before the first comparison too: a target already equal (or
	// its tables all quarantined, as the draws allow) skips the loop, and
	// a documented stop (a resync that took the free lock, a partition
	// stop) was then judged a stop by itself (soak seed 787796038735: t0
	// and t1 quarantined, the tailer stopped on the lock a resync had
	// taken, never restarted).
	c.restartPartitionStops()
	c.restartLockTakeovers()
	for !settled() && time.Now().Before(deadline) {
		c.restartPartitionStops()
		c.restartLockTakeovers()
		stopped := false
		for _, p := range c.procs {
			if p.exited() && !p.killed && p.documented == "" && handedOverTo(p, c.procs) == nil {
				stopped = true
			}
		}
		if stopped && time.Until(deadline) > 10*time.Second {
			// A process that stopped by itself will not make it converge.
			deadline = time.Now().Add(10 * time.Second)
		}
		time.Sleep(time.Second)
		if a := c.applied(); a != moved {
			moved, movedAt = a, time.Now()
		}
		if !stopped && time.Until(deadline) < settleStall && time.Since(movedAt) < settleStall && time.Since(start) < settleMax {
			deadline, extended = time.Now().Add(settleStall), true
		}
	}
	if extended {
		t.Logf("settle: the target still moved after %s; waited %s in all (last move %s before the end)", settleFor, time.Since(start).Round(time.Second), time.Since(movedAt).Round(time.Second))
	}
	// A lagging partition or a late record could still change the target:
	// compare once more after a pause.
	time.Sleep(2 * time.Second)
	settled()
	c.phase = "judge"
	var fails []string
	stops := map[*proc]string{}
	for _, p := range c.procs {
		if !p.exited() || p.killed || p.documented != "" || p.cmd.ProcessState.ExitCode() == 0 {
			continue
		}
		if by := handedOverTo(p, c.procs); by != nil {
			// Not a stop: the documented end of a writer that another
			// took over from; the tables must still be equal.
			c.res.faults["lock_handover"]++
			t.Logf("%s stopped because %s holds the source lock now (documented): %s", p.role, by.role, exitLine(p))
			continue
		}
		stops[p] = exitLine(p)
	}
	for _, tb := range c.tables {
		d := diffs[tb.name]
		c.res.rows += d.SourceRows
		q := quarantined[tb.name]
		switch {
		case q != "" && tb.mayQuarantine != "":
			c.res.quarantines++
			t.Logf("%s quarantined, as the draws allow (%s): %s", tb.name, tb.mayQuarantine, q)
		case q != "":
			fails = append(fails, fmt.Sprintf("%s was quarantined, but nothing the campaign drew is a documented refusal for it (loud, but a finding): %s\n    %s", tb.name, q, d))
		case !d.Equal():
			excused := false
			for _, line := range stops {
				if strings.Contains(line, c.db+"."+tb.name) || strings.Contains(line, `"`+tb.name+`"`) {
					excused = true
				}
			}
			switch {
			case excused:
			case len(stops) > 0:
				fails = append(fails, fmt.Sprintf("%s differs from the source after a process stopped (below): %s", tb.name, d))
			default:
				fails = append(fails, fmt.Sprintf("%s differs from the source and tidemark did not say so (wrong in silence): %s\n    %s", tb.name, d, strings.Join(d.Examples, "\n    ")))
			}
		}
	}
	for p, line := range stops {
		// First: a stop is the finding the differences follow from.
		fails = append([]string{fmt.Sprintf("%s stopped by itself (exit %d): %s", p.role, p.cmd.ProcessState.ExitCode(), line)}, fails...)
	}
	for _, p := range c.procs {
		if p.exited() {
			continue
		}
		if code := p.term(60 * time.Second); code != 0 {
			fails = append(fails, fmt.Sprintf("%s: exit %d after SIGTERM: %s", p.role, code, exitLine(p)))
		}
	}
	fails = append(fails, c.readI5()...)
	if c.mon != nil {
		violations, polls, checked := c.mon.Result()
		fails = append(fails, violations...)
		if checked == 0 {
			fails = append(fails, fmt.Sprintf("I4: the monitor never verified a checkpoint against the ledger (%d polls)", polls))
		}
		c.t.Logf("I4 monitor: %d polls, %d ledger checks, %d violations", polls, checked, len(violations))
	}
	if len(fails) > 0 {
		c.res.failure = strings.SplitN(fails[0], "\n", 2)[0]
		t.Errorf("seed %d: %d findings:\n  %s", c.seed, len(fails), strings.Join(fails, "\n  "))
	}
}

// The settle's bounds (judge): settleFor at least, and on while the
// target moved in the last settleStall, up to settleMax.
const (
	settleFor   = 150 * time.Second
	settleStall = 30 * time.Second
	settleMax   = 10 * time.Minute
)

// applied is where the target stands: the appliers' stored offsets (their
// sum), the source's stored checkpoint in PostgreSQL and, where the
// campaign publishes to Kafka, the end offsets of its topics (the tailer's
// progress: in the apply topology the checkpoint is a Kafka record, and a
// tailer still publishing a snapshot or a backlog moves neither of the
// others until an applier reaches its records). It changes while anything
// still applies.
func (c *campaign) applied() string {
	var offsets int64
	var ckpt string
	if err := c.pg.QueryRow(c.ctx, "SELECT coalesce((SELECT sum(next_offset) FROM tidemark.stream_offsets WHERE consumer_group = $1), 0), coalesce((SELECT position FROM tidemark.checkpoints WHERE source = $2), '')",
		c.group, c.db).Scan(&offsets, &ckpt); err != nil {
		return "unknown: " + err.Error()
	}
	if c.s.topology == "pg" {
		return fmt.Sprint(offsets, " ", ckpt)
	}
	return fmt.Sprint(offsets, " ", ckpt, " ", c.published())
}

// published is the sum of the end offsets of the campaign's Kafka topics
// (every topic under its prefix), or why it could not be read.
func (c *campaign) published() string {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.env.KafkaBrokers...))
	if err != nil {
		return "unknown: " + err.Error()
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
	defer cancel()
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		return "unknown: " + err.Error()
	}
	var mine []string
	for _, name := range topics.Names() {
		if strings.HasPrefix(name, c.prefix+".") {
			mine = append(mine, name)
		}
	}
	if len(mine) == 0 {
		return "0"
	}
	ends, err := adm.ListEndOffsets(ctx, mine...)
	if err != nil {
		return "unknown: " + err.Error()
	}
	var sum int64
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			sum += o.Offset
		}
	})
	return fmt.Sprint(sum)
}

// readI5 returns what the I5 trigger recorded, but for the brief
// regression the apply topology documents (docs/SCALE-OUT.md, TRUNCATE and
// DROP TABLE): the first partition to reach a TRUNCATE's or DROP's control
// record removes the table's rows at or before its version, and a lagging
// partition still writes its older rows until it reaches its own copy of
// the record, which removes them again. The I5 trigger sees such a row as
// an insert after a newer delete (soak seed 598680345494: the cut-over's
// DROP of t0 applied by partition 0, then rows of the old t0 from
// partition 1). Such a record is excused, in a campaign whose topics have
// more than one partition, when both versions are at or before a control
// record of that table that an applier applied; the tables must still be
// equal at the end.
func (c *campaign) readI5() []string {
	rows, err := c.pg.Query(c.ctx, "SELECT tbl, key, kind, old_seq, old_idx, new_seq, new_idx FROM "+pgx.Identifier{c.db, "rel_i5"}.Sanitize()+" ORDER BY at")
	if err != nil {
		return []string{fmt.Sprintf("I5: read records: %v", err)}
	}
	defer rows.Close()
	var controls controls
	if c.s.topology == "apply" && (c.s.partitions > 1 || c.res.faults["partitions_increase"] > 0) {
		controls = c.controlsApplied()
	}
	replayed := c.replayedDrops()
	var bad []string
	excused, replayExcused := 0, 0
	for rows.Next() {
		var tbl, key, kind string
		var os, ns int64
		var oi, ni int32
		if err := rows.Scan(&tbl, &key, &kind, &os, &oi, &ns, &ni); err != nil {
			return append(bad, fmt.Sprintf("I5: read records: %v", err))
		}
		if kind == "insert after newer delete" && controls.covers(tbl, os, oi) && controls.covers(tbl, ns, ni) {
			excused++
			continue
		}
		if kind == "insert after newer delete" && replayed[tbl] {
			replayExcused++
			continue
		}
		if len(bad) < 10 {
			bad = append(bad, fmt.Sprintf("I5: %s %s: %s: version %d/%d then %d/%d", tbl, key, kind, os, oi, ns, ni))
		}
	}
	if err := rows.Err(); err != nil {
		bad = append(bad, fmt.Sprintf("I5: read records: %v", err))
	}
	if replayExcused > 0 {
		c.res.faults["i5_replayed_drop (excused)"] += replayExcused
		c.t.Logf("I5: %d inserts after a newer delete excused: the history replayed after the checkpoint was deleted applied the table's DROP TABLE again (documented, docs/FAILOVER.md)", replayExcused)
	}
	if excused > 0 {
		c.res.faults["i5_lagging_partition (excused)"] += excused
		c.t.Logf("I5: %d inserts after a newer delete excused: rows of a partition that lagged behind another's TRUNCATE or DROP TABLE record (documented, docs/SCALE-OUT.md)", excused)
	}
	return bad
}

// replayedDrop matches the PostgreSQL sink's log line for a source DROP
// TABLE it applied to a target table (sink/postgres ddlevents.go). A
// replayed TRUNCATE removes only the rows at its version or older and
// raises the table's horizon (docs/FAILOVER.md, since 36edfe2): the replay
// inserts nothing again after it, so it is no excuse.
var replayedDrop = regexp.MustCompile(`msg="dropping target table \(source DROP TABLE\)" .*table="\\"[^"]*\\"\.\\"([^"]*)\\""`)

// replayedDrops returns the tables whose DROP TABLE a process started
// after a checkpoint_delete applied again. docs/FAILOVER.md ("Starting
// over replays history into tables that hold its end"): "A DROP TABLE
// (ddl.drop_table: apply) in the replayed history is applied again: the
// target is briefly behind, and the replay of what followed brings it
// back"; the table dropped loses its tombstones and horizon, so the
// replay inserts rows again that a later replayed delete removes (soak
// seed 435178782051). The I5 trigger sees each as an insert after a newer
// delete; the tables must still be equal at the end.
func (c *campaign) replayedDrops() map[string]bool {
	out := map[string]bool{}
	if c.startOverAt == 0 {
		return out
	}
	for _, p := range c.procs[c.startOverAt:] {
		if len(p.args) > 0 && p.args[0] == "apply" {
			continue
		}
		for _, m := range replayedDrop.FindAllStringSubmatch(p.log.String(), -1) {
			out[m[1]] = true
		}
	}
	return out
}

// controlRecord matches an applier's log line for a TRUNCATE or DROP TABLE
// control record it applied (sink/postgres streamtarget.go).
var controlRecord = regexp.MustCompile(`msg="(?:dropped target rows older than a source DROP TABLE|truncated target rows older than a source TRUNCATE)" .*table="\\"[^"]*\\"\.\\"([^"]*)\\"" version=(\d+)\.(\d+)`)

// controls maps a target table to the versions of its TRUNCATE and DROP
// TABLE control records that an applier applied.
type controls map[string][][2]int64

// controlsApplied reads the control records the campaign's appliers
// applied from their logs.
func (c *campaign) controlsApplied() controls {
	out := controls{}
	for _, p := range c.procs {
		if len(p.args) == 0 || p.args[0] != "apply" {
			continue
		}
		for _, m := range controlRecord.FindAllStringSubmatch(p.log.String(), -1) {
			seq, _ := strconv.ParseInt(m[2], 10, 64)
			idx, _ := strconv.ParseInt(m[3], 10, 64)
			out[m[1]] = append(out[m[1]], [2]int64{seq, idx})
		}
	}
	return out
}

// covers reports whether version seq/idx of table tbl is at or before one
// of its control records.
func (cs controls) covers(tbl string, seq int64, idx int32) bool {
	for _, v := range cs[tbl] {
		if seq < v[0] || seq == v[0] && int64(idx) <= v[1] {
			return true
		}
	}
	return false
}

// report prints what a failing campaign needs to be replayed and read: the
// seed, the draws, the phase, and each process's last log lines; the full
// logs go to bin/nemesis/<seed>/.
func (c *campaign) report() {
	dir := filepath.Join(serverRoot(), "bin", "nemesis", fmt.Sprint(c.seed))
	_ = os.MkdirAll(dir, 0o755)
	var b strings.Builder
	fmt.Fprintf(&b, "NEMESIS FAILURE: seed %d (replay: make nemesis SEED=%d), database %s, while: %s\n", c.seed, c.seed, c.db, c.phase)
	fmt.Fprintf(&b, "settings: %+v\n", c.s)
	for _, tb := range c.tables {
		fmt.Fprintf(&b, "table %s: shape %s, business key %v, columns %d, live rows %d\n", tb.name, tb.shape, tb.bk, len(tb.cols), len(tb.live))
	}
	// The plan-level draws (settings, tables, steps, faults, schema
	// changes); all of them are in draws.txt.
	var plan []string
	for _, d := range c.draws {
		if !strings.HasPrefix(d, "tx=") && !strings.HasPrefix(d, "table=") && !strings.HasPrefix(d, "rows=") {
			plan = append(plan, d)
		}
	}
	_ = os.WriteFile(filepath.Join(dir, "draws.txt"), []byte(strings.Join(c.draws, "\n")+"\n"), 0o644)
	fmt.Fprintf(&b, "draws: %d (all in draws.txt); without the workload's: %s\n", len(c.draws), strings.Join(plan, " "))
	for i, p := range c.procs {
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%02d-%s.log", i, strings.ReplaceAll(p.role, " ", ""))), []byte(p.log.String()), 0o644)
	}
	c.cmdsMu.Lock()
	_ = os.WriteFile(filepath.Join(dir, "cmds.log"), []byte(strings.Join(c.cmds, "\n")), 0o644)
	c.cmdsMu.Unlock()
	for _, p := range []*proc{c.tailer, c.standby} {
		if p != nil {
			fmt.Fprintf(&b, "--- %s (last lines):\n%s\n", p.role, tail(p.log.String(), 12))
		}
	}
	for _, p := range c.appliers {
		fmt.Fprintf(&b, "--- %s (last lines):\n%s\n", p.role, tail(p.log.String(), 8))
	}
	_ = os.WriteFile(filepath.Join(dir, "report.txt"), []byte(b.String()), 0o644)
	c.t.Logf("%s(full logs: %s)", b.String(), dir)
}
