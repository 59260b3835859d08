package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/sink/kafka"
)

// benchApply measures the scale-out topology (docs/SCALE-OUT.md) on the
// local services: a backlog of rows inserts and rows/4 updates is drained
//
//	D  by `tidemark run` straight into PostgreSQL (the ceiling: one process)
//	K  by the Kafka tailer (`tidemark run` with an apply section) into a
//	   topic of 12 partitions
//	A1, A2, A3 by 1, 2 and 3 `tidemark apply` processes from that topic into
//	   fresh target tables
//
// and prints each rate and An/D, per run and as medians. An applier's time
// runs from its group's first committed batch to the last (joining the
// group is reported apart).
// It returns K/D of each run.
func benchApply(ctx context.Context, o options) ([]float64, error) {
	s, err := connect(ctx)
	if err != nil {
		return nil, err
	}
	defer s.close(ctx)
	brokers, err := s.env.Kafka()
	if err != nil {
		return nil, err
	}
	cleanup, err := buildTidemark(&o)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	const db, table = "tidemark_bench_apply", "t"
	rows := o.applyRows
	// The streams start before the CREATE TABLE (and after a logged
	// statement: a fresh server's gtid_binlog_pos is empty): a table that
	// appears without its CREATE and is missing from the target is
	// snapshotted first, which would time a snapshot, not the stream.
	if _, err := s.my.Execute("DROP DATABASE IF EXISTS " + db); err != nil {
		return nil, fmt.Errorf("set up source: %w", err)
	}
	from, err := harness.SourcePosition(s.my)
	if err != nil {
		return nil, err
	}
	if from.IsZero() {
		return nil, fmt.Errorf("set up source: gtid_binlog_pos is empty after a logged statement: the bench needs GTIDs")
	}
	for _, q := range []string{"CREATE DATABASE " + db, fmt.Sprintf(tableDDL, db+"."+table)} {
		if _, err := s.my.Execute(q); err != nil {
			return nil, fmt.Errorf("set up source: %w", err)
		}
	}
	fmt.Fprintf(os.Stderr, "bench apply: writing %d inserts and %d updates\n", rows, rows/4)
	for i := 0; i < rows; i += 1000 {
		var b strings.Builder
		fmt.Fprintf(&b, "INSERT INTO %s.%s (id, amount, created_at, name, doc) VALUES ", db, table)
		for j := i; j < min(i+1000, rows); j++ {
			if j > i {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "(%d, %d.%02d, '2026-11-29 10:00:00.%06d', 'name-%d', '{\"k\":%d}')", j, j, j%100, j%1000000, j, j)
		}
		if _, err := s.my.Execute(b.String()); err != nil {
			return nil, fmt.Errorf("write backlog: %w", err)
		}
	}
	for i := 0; i < rows; i += 400 {
		if _, err := s.my.Execute(fmt.Sprintf("UPDATE %s.%s SET amount = amount + 1 WHERE id BETWEEN %d AND %d", db, table, i, i+99)); err != nil {
			return nil, fmt.Errorf("write backlog: %w", err)
		}
	}
	to, err := harness.SourcePosition(s.my)
	if err != nil {
		return nil, err
	}
	changes := rows + rows/4

	type figures struct{ direct, tail float64 }
	var all []figures
	n := min(max(o.appliers, 0), 3)
	members := make([][]float64, n)
	ratios := make([][]float64, n)
	var tailRatios []float64
	var out strings.Builder
	hdr, sep := "| run | D run → PostgreSQL | K tailer → Kafka | **K/D** |", "|---|---|---|---|"
	for k := 1; k <= n; k++ {
		hdr, sep = hdr+fmt.Sprintf(" A%d |", k), sep+"---|"
	}
	for k := 1; k <= n; k++ {
		hdr, sep = hdr+fmt.Sprintf(" A%d/D |", k), sep+"---|"
	}
	if n > 0 {
		hdr, sep = hdr+" group join |", sep+"---|"
	}
	fmt.Fprintf(&out, "%s\n%s\n", hdr, sep)
	for run := 1; run <= o.runs; run++ {
		// D: tidemark run into PostgreSQL.
		src := fmt.Sprintf("bench_direct_%d", run)
		if err := resetSchema(ctx, s, db+"_d", src); err != nil {
			return nil, err
		}
		cfg, err := writeConfigDB(s.env, src, db, table, from)
		if err != nil {
			return nil, err
		}
		setTargetSchema(cfg, db+"_d")
		t0 := time.Now()
		d, err := startDaemon(o.bin, cfg, s.env)
		if err != nil {
			return nil, err
		}
		werr := harness.WaitCaughtUp(ctx, s.pg, "", src, to, 30*time.Minute)
		direct := time.Since(t0)
		if _, err := d.stop(); err != nil || werr != nil {
			return nil, fmt.Errorf("direct run: %v %v", werr, err)
		}
		os.Remove(cfg)

		// K: the Kafka tailer.
		prefix := fmt.Sprintf("tmbench%d%d", time.Now().Unix()%100000, run)
		tsrc := fmt.Sprintf("bench_tail_%d", run)
		tcfg, err := writeConfigDB(s.env, tsrc, db, table, from)
		if err != nil {
			return nil, err
		}
		addScaleOut(tcfg, brokers, prefix, "bench-"+prefix)
		var prof []string
		if o.tailerProfile != "" {
			prof = []string{"--cpuprofile", fmt.Sprintf("%s.cpu.%d", o.tailerProfile, run),
				"--blockprofile", fmt.Sprintf("%s.block.%d", o.tailerProfile, run),
				"--mutexprofile", fmt.Sprintf("%s.mutex.%d", o.tailerProfile, run)}
		}
		reader, err := checkpointReader(ctx, brokers, prefix)
		if err != nil {
			return nil, err
		}
		t0 = time.Now()
		tail, err := startDaemon(o.bin, tcfg, s.env, prof...)
		if err != nil {
			reader.Close()
			return nil, err
		}
		err = waitKafkaCheckpoint(ctx, reader, tsrc, to)
		tailTook := time.Since(t0)
		reader.Close()
		if err != nil {
			tail.stop()
			return nil, err
		}
		if _, err := tail.stop(); err != nil {
			return nil, fmt.Errorf("tailer: %w", err)
		}
		topic := prefix + "." + db + "." + table
		f := figures{direct: float64(changes) / direct.Seconds(), tail: float64(changes) / tailTook.Seconds()}
		tailRatios = append(tailRatios, f.tail/f.direct)
		row := fmt.Sprintf("| %d | %.0f/s | %.0f/s | **%.2f** |", run, f.direct, f.tail, f.tail/f.direct)
		var ratioCells, joins []string
		for k := 1; k <= n; k++ {
			schema := fmt.Sprintf("%s_a%d", db, k)
			group := fmt.Sprintf("bench-%s-%d", prefix, k)
			if err := resetSchema(ctx, s, schema, ""); err != nil {
				return nil, err
			}
			acfg, err := writeConfigDB(s.env, tsrc, db, table, from)
			if err != nil {
				return nil, err
			}
			setTargetSchema(acfg, schema)
			addScaleOut(acfg, brokers, prefix, group)
			rate, join, err := drainWithAppliers(ctx, o.bin, acfg, s, brokers, topic, group, k, changes, schema+"."+table, rows)
			os.Remove(acfg)
			if err != nil {
				return nil, err
			}
			members[k-1] = append(members[k-1], rate)
			ratios[k-1] = append(ratios[k-1], rate/f.direct)
			row += fmt.Sprintf(" %.0f/s |", rate)
			ratioCells = append(ratioCells, fmt.Sprintf(" %.2f |", rate/f.direct))
			joins = append(joins, join.Round(100*time.Millisecond).String())
		}
		os.Remove(tcfg)
		if n > 0 {
			row += strings.Join(ratioCells, "") + " " + strings.Join(joins, " / ") + " |"
		}
		fmt.Fprintf(&out, "%s\n", row)
		all = append(all, f)
		fmt.Fprint(os.Stderr, out.String())
	}
	var d, k []float64
	for _, f := range all {
		d, k = append(d, f.direct), append(k, f.tail)
	}
	med := fmt.Sprintf("| **median** | %.0f/s | %.0f/s | **%.2f** |", medianOf(d), medianOf(k), medianOf(tailRatios))
	for i := range n {
		med += fmt.Sprintf(" %.0f/s |", medianOf(members[i]))
	}
	for i := range n {
		med += fmt.Sprintf(" **%.2f** |", medianOf(ratios[i]))
	}
	if n > 0 {
		med += " |"
	}
	fmt.Fprintf(&out, "%s\n", med)
	appliersNote := ""
	if n > 0 {
		appliersNote = fmt.Sprintf(" A1–A%d: 1 … %d `tidemark apply` processes from that topic into fresh tables of the same PostgreSQL, timed from the group's first commit to its last.", n, n)
	}
	// The tailer alone (-appliers 0, make bench-25) has a section of
	// its own: it must not replace make bench-apply's appliers table.
	section := "Measured: apply throughput"
	if n == 0 {
		section = "Measured: Kafka tailer K/D"
	}
	body := fmt.Sprintf("## %s\n\n`make bench-apply` (`go run ./cmd/tidemark-bench -apply %d -appliers %d -runs %d`; %s): a backlog of %d inserts (1000-row transactions) and %d updates (100-row transactions) = %d changes; %d runs. D: `tidemark run` into PostgreSQL. K: the Kafka tailer (exactly once) into a topic of 12 partitions, timed from its start to its checkpoint in Kafka reaching the backlog's end; K/D is the tailer's rate over D's in the same run (target ≥ 0.8, issue 25).%s\n\n%s",
		section, rows, n, o.runs, machine(), rows, rows/4, changes, o.runs, appliersNote, out.String())
	fmt.Println(body)
	if o.out == "" {
		return tailRatios, nil
	}
	return tailRatios, replaceSection(o.out, section, body)
}

// resetSchema drops a target schema and a source's checkpoint.
func resetSchema(ctx context.Context, s *services, schema, source string) error {
	if _, err := s.pg.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return err
	}
	if source != "" {
		_, _ = s.pg.Exec(ctx, "DELETE FROM tidemark.checkpoints WHERE source = $1", source)
	}
	return nil
}

func setTargetSchema(cfg, schema string) {
	b, _ := os.ReadFile(cfg)
	y := string(b)
	i := strings.Index(y, "    schema: ")
	j := i + strings.Index(y[i:], "\n")
	os.WriteFile(cfg, []byte(y[:i]+"    schema: "+schema+y[j:]), 0o600)
}

// addScaleOut adds target.kafka and an apply section to a config written
// by writeConfigDB.
func addScaleOut(cfg string, brokers []string, prefix, group string) {
	insertBeforeLog(cfg, fmt.Sprintf(`
  kafka:
    brokers: [%s]
    topic_prefix: %s
    exactly_once: true
    partitions: 12
apply:
  group: %s
metrics:
  listen: "off"`, strings.Join(brokers, ", "), prefix, group))
}

// addKafka adds target.kafka beside target.postgres (the fan-out) to a
// config written by writeConfigDB.
func addKafka(cfg string, brokers []string, prefix string) {
	insertBeforeLog(cfg, fmt.Sprintf(`
  kafka:
    brokers: [%s]
    topic_prefix: %s`, strings.Join(brokers, ", "), prefix))
}

// insertBeforeLog puts yaml before the log section of a config written by
// writeConfigDB.
func insertBeforeLog(cfg, yaml string) {
	b, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, []byte(strings.Replace(string(b), "\nlog:", yaml+"\nlog:", 1)), 0o600)
}

// checkpointReader opens a Kafka sink that only reads the tailer's
// checkpoint (it never initializes the transactional id, so it does not
// fence the tailer).
func checkpointReader(ctx context.Context, brokers []string, prefix string) (*kafka.Sink, error) {
	return kafka.Open(ctx, kafka.Config{Brokers: brokers, TopicPrefix: prefix, ExactlyOnce: true,
		TransactionalID: "bench-reader-" + prefix, Logger: slog.New(slog.DiscardHandler)})
}

// waitKafkaCheckpoint polls the tailer's checkpoint in Kafka every 50 ms
// (as harness.WaitCaughtUp polls D's in PostgreSQL) until it reaches to.
// Until issue 25 it started `tidemark checkpoint` every 300 ms, which
// timed a process start and a Kafka connection per poll too.
func waitKafkaCheckpoint(ctx context.Context, r *kafka.Sink, source string, to tidemark.Position) error {
	deadline := time.Now().Add(30 * time.Minute)
	for time.Now().Before(deadline) {
		if pos, ok, err := r.Checkpoint(ctx, source); err == nil && ok {
			if c, cerr := pos.Compare(to); cerr == nil && c >= 0 {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("the tailer did not reach %s", to)
}

// drainWithAppliers starts n appliers and waits until the group's stored
// offsets reach the topic's end. It returns changes/s from the first
// commit to the last, and the time to that first commit.
func drainWithAppliers(ctx context.Context, bin, cfg string, s *services, brokers []string, topic, group string, n, changes int, target string, rows int) (float64, time.Duration, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, 0, err
	}
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
			_ = p.Wait()
		}
	}()
	t0 := time.Now()
	for i := 0; i < n; i++ {
		cmd := tidemarkExec(s.env, bin, "apply", "--config", cfg)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return 0, 0, err
		}
		procs = append(procs, cmd)
	}
	var first time.Time
	deadline := time.Now().Add(30 * time.Minute)
	for time.Now().Before(deadline) {
		done, stored := true, 0
		ends.Each(func(o kadm.ListedOffset) {
			var next int64
			err := s.pg.QueryRow(ctx, "SELECT next_offset FROM tidemark.stream_offsets WHERE consumer_group = $1 AND topic = $2 AND partition = $3",
				group, topic, o.Partition).Scan(&next)
			if err == nil {
				stored++
			}
			// The end is one past the last record, or past the commit
			// marker after it.
			if err != nil || next < o.Offset-1 {
				done = false
			}
		})
		if stored > 0 && first.IsZero() {
			first = time.Now()
		}
		if done {
			took := time.Since(first)
			var got int
			if err := s.pg.QueryRow(ctx, "SELECT count(*) FROM "+target).Scan(&got); err != nil {
				return 0, 0, err
			}
			if got != rows {
				return 0, 0, fmt.Errorf("%d appliers drained %s but %s has %d rows, want %d", n, topic, target, got, rows)
			}
			// The rate in source changes (records also count schema
			// records and commit markers).
			return float64(changes) / took.Seconds(), first.Sub(t0), nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0, 0, fmt.Errorf("%d appliers did not drain %s", n, topic)
}
