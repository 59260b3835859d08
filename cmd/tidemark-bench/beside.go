package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/jackc/pgx/v5"

	"tidemark"
	"tidemark/integration/harness"
)

// The beside bench's source: a big table of the peers' shape, snapshotted
// while a writer keeps a small table busy.
const (
	besideDB = "tidemark_bench_beside"
	// smallDDL is the busy small table: stamp is the source's NOW(6) when
	// the row was written.
	smallDDL = "CREATE TABLE small (id BIGINT NOT NULL PRIMARY KEY, stamp TIMESTAMP(6) NOT NULL, note VARCHAR(16) NOT NULL)"
	// besidePerTx is the rows of one writer transaction.
	besidePerTx = 10
)

// lagStats summarizes the lags of the small table's rows of one window.
type lagStats struct {
	n             int
	p50, p99, max time.Duration
}

func (l lagStats) String() string {
	if l.n == 0 {
		return "no rows"
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%d", d.Milliseconds()) }
	return fmt.Sprintf("%s / %s / %s ms (%d rows)", ms(l.p50), ms(l.p99), ms(l.max), l.n)
}

// summarize returns the quantiles of lags (seconds).
func summarize(lags []float64) lagStats {
	if len(lags) == 0 {
		return lagStats{}
	}
	s := append([]float64(nil), lags...)
	sort.Float64s(s)
	q := func(p float64) time.Duration {
		return time.Duration(s[int(p*float64(len(s)-1))] * float64(time.Second))
	}
	return lagStats{n: len(s), p50: q(0.5), p99: q(0.99), max: q(1)}
}

// besideRun is one run of the beside bench.
type besideRun struct {
	idle, during lagStats      // the small table's lag without a snapshot, and while the big one is snapshotted
	snapshot     time.Duration // the big table in state snapshotting → streaming
	request      time.Duration // tidemark resync (request) → snapshotting
	writerRate   float64       // rows/s the writer achieved
	rss          int64         // KiB, VmHWM of the daemon
	load         string        // load average after the run
	verify       string        // run 1: tidemark verify of both tables
}

// besideSummary is what the Targets table of issue 25 takes from the
// beside bench.
type besideSummary struct {
	rows     int
	topology string
	runs     []besideRun
}

// p99s returns the per-run p99 lags during the snapshot, in ms.
func (s besideSummary) p99s() []float64 {
	var v []float64
	for _, r := range s.runs {
		v = append(v, float64(r.during.p99.Milliseconds()))
	}
	return v
}

// besideTopologies are the values of -beside-topology.
var besideTopologies = map[string]string{
	"postgres": "`tidemark run` → PostgreSQL (snapshots beside the stream)",
	"fanout":   "`tidemark run` → PostgreSQL + Kafka fan-out (target.kafka beside target.postgres)",
}

// benchBeside measures the lag of a busy small table while a big table of
// o.besideRows rows is snapshotted beside it: `tidemark run` streams both
// tables of besideDB; a writer commits besidePerTx-row transactions to
// small at o.besideRate rows/s, each row stamped with the source's NOW(6);
// for o.besideIdle seconds nothing else happens (the ceiling: the same
// writer's lag with no snapshot running), then `tidemark resync --table
// besideDB.big` asks the daemon to snapshot the big table, and the writer
// goes on until it is streaming again. A row's lag is
// pg_xact_commit_timestamp(xmin) − stamp (as make bench's T3). The rows
// written while the big table was in state snapshotting are the "during"
// window. Each run starts a daemon of its own (source beside_<topology>_N,
// its own target schema), o.runs runs.
func benchBeside(ctx context.Context, o options) (besideSummary, error) {
	sum := besideSummary{rows: o.besideRows, topology: o.besideTopology}
	if _, ok := besideTopologies[o.besideTopology]; !ok {
		return sum, fmt.Errorf("-beside-topology %q: want postgres or fanout", o.besideTopology)
	}
	sv, err := connect(ctx)
	if err != nil {
		return sum, err
	}
	defer sv.close(ctx)
	env, my, pg := sv.env, sv.my, sv.pg
	var tct string
	if err := pg.QueryRow(ctx, "SHOW track_commit_timestamp").Scan(&tct); err != nil {
		return sum, err
	}
	if tct != "on" {
		return sum, errors.New("the beside bench needs track_commit_timestamp=on in PostgreSQL to see when a row became visible (scripts/services.sh sets it; restart the services)")
	}
	var brokers []string
	if o.besideTopology == "fanout" {
		if brokers, err = env.Kafka(); err != nil {
			return sum, err
		}
	}
	cleanup, err := buildTidemark(&o)
	if err != nil {
		return sum, err
	}
	defer cleanup()
	if err := ensureBig(my, o.besideRows); err != nil {
		return sum, err
	}
	prefix := "beside_" + o.besideTopology + "_"
	if err := resetTargets(ctx, pg, prefix); err != nil {
		return sum, err
	}
	for i := 1; i <= o.runs; i++ {
		source := fmt.Sprintf("%s%d", prefix, i)
		fmt.Fprintf(os.Stderr, "== [%d] %s: idle %ds, then resync of %s.big (%d rows) (load %s)\n", i, o.besideTopology, o.besideIdle, besideDB, o.besideRows, loadAvg())
		r, err := besideOnce(ctx, o, env, my, pg, source, brokers, i == 1)
		if err != nil {
			return sum, err
		}
		fmt.Fprintf(os.Stderr, "   snapshot %s; lag p50/p99/max without: %s; during: %s\n", r.snapshot.Round(time.Millisecond), r.idle, r.during)
		sum.runs = append(sum.runs, r)
		if err := resetTargets(ctx, pg, prefix); err != nil {
			return sum, err
		}
	}
	b := sum.table(o.besideRate)
	fmt.Print(b)
	if o.out == "" {
		return sum, nil
	}
	return sum, replaceSection(o.out, fmt.Sprintf("beside-%s-%d", o.besideTopology, o.besideRows), fmt.Sprintf("## Lag of a busy small table while a %d-row table is snapshotted beside it, %s (`make bench-beside`, %s)\n\n"+
		"`tidemark run` streams %s.small and %s.big (%d rows of the peers' shape). A writer commits %d-row transactions to small at %.0f rows/s, each row stamped with the source's NOW(6); a row's lag is pg_xact_commit_timestamp(xmin) − that stamp (as `make bench`'s T3). For %d s nothing else runs: the **ceiling**, the same writer's lag with no snapshot; then `tidemark resync --table %s.big` asks the running daemon for a snapshot of big, and the writer goes on until big streams again. \"During\" is the rows written while big was in state snapshotting (polled every 100 ms in tidemark.tables). Each run starts its own daemon into its own schema (default snapshot.parallelism); %d runs. %s\n\n```\n%s```\n",
		o.besideRows, besideTopologies[o.besideTopology], time.Now().UTC().Format("2006-01-02 15:04 UTC"),
		besideDB, besideDB, o.besideRows, besidePerTx, o.besideRate, o.besideIdle, besideDB, o.runs, machine(), b))
}

// table prints the runs and the medians.
func (s besideSummary) table(rate float64) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "run\tbig: snapshotting → streaming\trows/s\tsmall: lag p50 / p99 / max, no snapshot (ceiling)\tduring the snapshot\tp99 during ÷ p99 ceiling\twriter rows/s\tdaemon VmHWM\tload after\n")
	var snaps, ratios []float64
	var per []string
	for i, r := range s.runs {
		x := float64(r.during.p99) / float64(max(r.idle.p99, time.Millisecond))
		ratios = append(ratios, x)
		snaps = append(snaps, r.snapshot.Seconds())
		per = append(per, fmt.Sprintf("%d", r.during.p99.Milliseconds()))
		fmt.Fprintf(tw, "%d\t%s\t%.0f\t%s\t%s\t%.1f×\t%.0f\t%.0f MiB\t%s\n", i+1, r.snapshot.Round(time.Millisecond), float64(s.rows)/r.snapshot.Seconds(),
			r.idle, r.during, x, r.writerRate, float64(r.rss)/1024, r.load)
	}
	tw.Flush()
	b.WriteString("\n")
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure (median of the runs)\tper run\tmedian\ttarget\t")
	m := medianOf(s.p99s())
	fmt.Fprintf(tw, "p99 lag of the small table during the snapshot (ms)\t%s\t%.0f\t≤ 1000\t%s\n", strings.Join(per, " "), m, pass(m <= 1000))
	var idle []float64
	var perIdle []string
	for _, r := range s.runs {
		idle = append(idle, float64(r.idle.p99.Milliseconds()))
		perIdle = append(perIdle, fmt.Sprintf("%d", r.idle.p99.Milliseconds()))
	}
	fmt.Fprintf(tw, "p99 lag of the same writer with no snapshot, same run (ms)\t%s\t%.0f\t\t\n", strings.Join(perIdle, " "), medianOf(idle))
	var perRatio []string
	for _, x := range ratios {
		perRatio = append(perRatio, fmt.Sprintf("%.1f×", x))
	}
	fmt.Fprintf(tw, "p99 during ÷ p99 without\t%s\t%.1f×\t\t\n", strings.Join(perRatio, " "), medianOf(ratios))
	fmt.Fprintf(tw, "snapshot of %d rows, snapshotting → streaming\t\t%s\t\t\n", s.rows, time.Duration(medianOf(snaps)*float64(time.Second)).Round(time.Millisecond))
	tw.Flush()
	fmt.Fprintf(&b, "tidemark verify of both tables after run 1: %s\n", s.runs[0].verify)
	return b.String()
}

// ensureBig makes besideDB.big hold rows rows of the peers' shape, loading
// it only when it does not already (a 5M-row load takes minutes).
func ensureBig(my *client.Conn, rows int) error {
	r, err := my.Execute("SELECT COUNT(*), COALESCE(MAX(id), 0) FROM " + besideDB + ".big")
	if err == nil && len(r.Values) == 1 {
		n, _ := r.GetInt(0, 0)
		top, _ := r.GetInt(0, 1)
		if n == int64(rows) && top == int64(rows) {
			fmt.Fprintf(os.Stderr, "== %s.big already holds %d rows\n", besideDB, rows)
			return nil
		}
	}
	return loadTable(my, besideDB, "big", rows)
}

// besideOnce is one run: a daemon of its own, the idle window, the resync,
// the lags.
func besideOnce(ctx context.Context, o options, env harness.Env, my *client.Conn, pg *pgx.Conn, source string, brokers []string, check bool) (besideRun, error) {
	var r besideRun
	if err := harness.Exec(my, "DROP TABLE IF EXISTS "+besideDB+".small", "USE "+besideDB, smallDDL); err != nil {
		return r, fmt.Errorf("create %s.small: %w", besideDB, err)
	}
	start, err := harness.SourcePosition(my)
	if err != nil {
		return r, err
	}
	if start.IsZero() {
		return r, errors.New("beside bench: gtid_binlog_pos is empty after a logged statement: the bench needs GTIDs")
	}
	cfg, err := writeConfigDB(env, source, besideDB, "*", start)
	if err != nil {
		return r, err
	}
	defer os.Remove(cfg)
	if len(brokers) > 0 {
		addKafka(cfg, brokers, fmt.Sprintf("tmbeside%d", time.Now().UnixNano()%1e9))
	}
	d, err := startDaemon(o.bin, cfg, env)
	if err != nil {
		return r, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_, _ = d.stop()
		}
	}()
	// Warm-up: the daemon meets small with its first row and snapshots
	// it (a new table); waited for and left out of the figures.
	if err := harness.Exec(my, "SET time_zone = '+00:00'", "INSERT INTO small VALUES (-1, NOW(6), 'warm-up')"); err != nil {
		return r, err
	}
	warm, err := harness.SourcePosition(my)
	if err != nil {
		return r, err
	}
	if err := harness.WaitCaughtUp(ctx, pg, "", source, warm, 10*time.Minute); err != nil {
		return r, err
	}

	w, err := startWriter(env, o.besideRate)
	if err != nil {
		return r, err
	}
	idleFrom := time.Now()
	time.Sleep(time.Duration(o.besideIdle) * time.Second)
	idleTo := time.Now()
	reqAt := time.Now()
	if out, err := tidemarkCmd(o.bin, cfg, env, "resync", "--table", besideDB+".big", "--wait", "0"); err != nil {
		w.stop()
		return r, fmt.Errorf("tidemark resync --table %s.big: %v\n%s", besideDB, err, out)
	}
	from, to, err := waitSnapshot(ctx, pg, source, tidemark.TableID{Database: besideDB, Name: "big"}, reqAt, 3*time.Hour)
	if err != nil {
		w.stop()
		return r, err
	}
	written, rate, werr := w.stop()
	if werr != nil {
		return r, fmt.Errorf("beside writer: %w", werr)
	}
	r.snapshot, r.request, r.writerRate = to.Sub(from), from.Sub(reqAt), rate
	end, err := harness.SourcePosition(my)
	if err != nil {
		return r, err
	}
	if err := harness.WaitCaughtUp(ctx, pg, "", source, end, 30*time.Minute); err != nil {
		return r, err
	}
	r.rss, err = d.stop()
	stopped = true
	if err != nil {
		return r, fmt.Errorf("tidemark run exited: %w", err)
	}
	r.load = loadAvg()

	rows, err := pg.Query(ctx, "SELECT extract(epoch from stamp)::float8, extract(epoch from (pg_xact_commit_timestamp(xmin) - stamp))::float8 FROM "+
		pgx.Identifier{source, "small"}.Sanitize()+" WHERE id >= 0")
	if err != nil {
		return r, fmt.Errorf("read lags of %s.small: %w", source, err)
	}
	var idle, during []float64
	n := 0
	for rows.Next() {
		var at float64
		var lag *float64
		if err := rows.Scan(&at, &lag); err != nil {
			rows.Close()
			return r, err
		}
		if lag == nil {
			rows.Close()
			return r, fmt.Errorf("a row of %s.small has no commit timestamp (track_commit_timestamp was off when it was written?)", source)
		}
		n++
		t := time.Unix(0, int64(at*1e9))
		switch {
		case !t.Before(idleFrom) && t.Before(idleTo):
			idle = append(idle, *lag)
		case !t.Before(from) && !t.After(to):
			during = append(during, *lag)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return r, err
	}
	if n != written {
		return r, fmt.Errorf("beside bench: %d rows of small in PostgreSQL, %d written", n, written)
	}
	r.idle, r.during = summarize(idle), summarize(during)
	if check {
		fmt.Fprintln(os.Stderr, "== tidemark verify of small and big")
		out, err := tidemarkCmd(o.bin, cfg, env, "verify", "--examples", "2")
		if r.verify, err = verdictOf(source, []byte(out), err); err != nil {
			return r, err
		}
	}
	return r, nil
}

// tidemarkCmd runs a tidemark command with cfg to its end.
func tidemarkCmd(bin, cfg string, env harness.Env, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := tidemarkExec(env, bin, append(args[:1:1], append([]string{"--config", cfg}, args[1:]...)...)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// waitSnapshot polls tidemark.tables every 100 ms until the table, asked
// for a resync at requested, has been snapshotting and streams again, and
// returns when it was first seen snapshotting and then streaming.
func waitSnapshot(ctx context.Context, pg *pgx.Conn, source string, id tidemark.TableID, requested time.Time, timeout time.Duration) (from, to time.Time, err error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		var state, reason string
		var updated time.Time
		err := pg.QueryRow(ctx, "SELECT state, coalesce(reason, ''), updated_at FROM tidemark.tables WHERE source = $1 AND database = $2 AND table_name = $3",
			source, id.Database, id.Name).Scan(&state, &reason, &updated)
		now := time.Now()
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return from, to, fmt.Errorf("read the state of %s: %w", id, err)
		case state == string(tidemark.TableSnapshotting) && from.IsZero():
			from = now
		case state == string(tidemark.TableStreaming) && !from.IsZero():
			return from, now, nil
		case state == string(tidemark.TableStreaming) && updated.After(requested):
			// Snapshotted between two polls: the window is the request's.
			return requested, now, nil
		case state == string(tidemark.TableQuarantined):
			return from, to, fmt.Errorf("%s was quarantined during its snapshot: %s", id, reason)
		}
		select {
		case <-ctx.Done():
			return from, to, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return from, to, fmt.Errorf("%s did not go through snapshotting back to streaming within %s of the resync at %s", id, timeout, requested.Format(time.TimeOnly))
}

// writer commits besidePerTx-row transactions to besideDB.small at a steady
// rate on a connection of its own.
type writer struct {
	mu      sync.Mutex
	quit    chan struct{}
	done    chan struct{}
	err     error
	written int
	took    time.Duration
}

func startWriter(env harness.Env, rate float64) (*writer, error) {
	my, err := env.MySQL()
	if err != nil {
		return nil, err
	}
	if err := harness.Exec(my, "SET time_zone = '+00:00'", "USE "+besideDB); err != nil {
		my.Close()
		return nil, err
	}
	w := &writer{quit: make(chan struct{}), done: make(chan struct{})}
	interval := time.Duration(float64(time.Second) * besidePerTx / rate)
	go func() {
		defer close(w.done)
		defer my.Close()
		t0 := time.Now()
		next := t0
		id := 0
		for {
			select {
			case <-w.quit:
				w.mu.Lock()
				w.written, w.took = id, time.Since(t0)
				w.mu.Unlock()
				return
			default:
			}
			if err := harness.Exec(my, fmt.Sprintf("INSERT INTO small (id, stamp, note) SELECT %d + seq, NOW(6), 'busy' FROM seq_1_to_%d", id, besidePerTx)); err != nil {
				w.mu.Lock()
				w.err, w.written, w.took = err, id, time.Since(t0)
				w.mu.Unlock()
				return
			}
			id += besidePerTx
			next = next.Add(interval)
			if behind := time.Since(next); behind > interval {
				// The source could not keep the rate: go on at it from
				// here rather than in a burst.
				next = time.Now()
			}
			time.Sleep(time.Until(next))
		}
	}()
	return w, nil
}

// stop ends the writer and returns the rows it wrote and its rate.
func (w *writer) stop() (rows int, rate float64, err error) {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.written, float64(w.written) / w.took.Seconds(), w.err
}
