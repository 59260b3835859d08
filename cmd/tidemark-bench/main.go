// Command tidemark-bench measures tidemark against its ceilings in one run,
// on the local services (scripts/services.sh), and writes
// docs/PERFORMANCE.md.
//
// It writes a fixed backlog into MariaDB (insert-heavy: 800 transactions of
// 1000 rows + 200,000 single-row transactions = 1M row changes; and an
// update-heavy mix over a Zipf-distributed hot set), then measures:
//
//	C1 raw go-mysql decode of the backlog with a no-op handler (tailer ceiling)
//	C2 PostgreSQL COPY of the same rows into an identical table (apply ceiling)
//	C3 a naive per-row autocommit upsert consumer on a sample (hand-written baseline)
//	T1 the tidemark tailer with UTC normalization and dedupe into a null sink
//	T2 the tidemark binary draining each backlog end to end into PostgreSQL
//	T3 p50/p99 lag (source commit → visible in PostgreSQL) at 50% of T2's rate
//
// and prints R1 = T1/C1, R2 = T2/C2, R3 = T2/C3, the lags and the peak RSS.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"
	"time"
	_ "time/tzdata"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/jackc/pgx/v5"

	"tidemark"
	"tidemark/binlog"
	"tidemark/dedupe"
	"tidemark/integration/harness"
	"tidemark/internal/workload"
)

const (
	benchDB = "tidemark_bench"
	zone    = "Asia/Kolkata"
)

// The benchmark table: DECIMAL, DATETIME, TIMESTAMP, VARCHAR and JSON.
const tableDDL = `CREATE TABLE %s (
	id BIGINT NOT NULL PRIMARY KEY,
	amount DECIMAL(12,2) NOT NULL,
	created_at DATETIME(6) NOT NULL,
	updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	name VARCHAR(64) NOT NULL,
	doc JSON
) DEFAULT CHARSET=utf8mb4`

type options struct {
	bulkTx, bulkRows, singles, updates, hotKeys, naive int
	lagSeconds                                         int
	out                                                string
	bin                                                string
	t1Profile, t2Profile                               string
	fallbackRows                                       int
	runs                                               int
	peerRows                                           int
	applyRows                                          int
	appliers                                           int
	tailerProfile                                      string
	snapParRows                                        int
	pgShapeRows                                        int
	drainRuns                                          int
	beside                                             bool
	besideRows, besideIdle                             int
	besideRate                                         float64
	besideTopology                                     string
	targets25                                          bool
	longRows                                           int
}

// loadAtStart is the load average when the bench started.
var loadAtStart string

func main() {
	var o options
	flag.IntVar(&o.bulkTx, "bulk-tx", 800, "bulk insert transactions")
	flag.IntVar(&o.bulkRows, "bulk-rows", 1000, "rows per bulk transaction")
	flag.IntVar(&o.singles, "singles", 200000, "single-row insert transactions")
	flag.IntVar(&o.updates, "updates", 200000, "update-heavy changes (Zipf over the hot set)")
	flag.IntVar(&o.hotKeys, "hot-keys", 20000, "rows in the update-heavy table")
	flag.IntVar(&o.naive, "naive", 20000, "rows for the naive per-row consumer sample")
	flag.IntVar(&o.lagSeconds, "lag-seconds", 20, "duration of the lag measurement")
	flag.StringVar(&o.out, "out", "docs/PERFORMANCE.md", "report file")
	flag.StringVar(&o.bin, "bin", "", "tidemark binary (default: build it)")
	flag.StringVar(&o.t1Profile, "t1-cpuprofile", "", "write a CPU profile of T1 (tailer + dedupe) to this file")
	flag.StringVar(&daemonLog, "daemon-log", "warn", "log.level of the tidemark daemons the bench starts")
	flag.IntVar(&batchChanges, "batch", 0, "batch.max_changes of the daemon (default: tidemark's)")
	flag.StringVar(&o.t2Profile, "t2-cpuprofile", "", "write a CPU profile of the daemon during T2 insert-heavy to this file")
	flag.IntVar(&o.runs, "runs", 3, "measure this many times on the same backlog; the report gives medians")
	flag.IntVar(&o.peerRows, "peers", 0, "instead: load a table of this many rows with pgloader and with tidemark's first-run snapshot")
	flag.StringVar(&snapshotProfile, "snapshot-cpuprofile", "", "with -fallback: write a CPU profile of the first full reload to this file")
	flag.IntVar(&fallbackChunkRows, "chunk-rows", 0, "with -fallback: fallback.chunk_rows (default: tidemark's)")
	flag.IntVar(&o.fallbackRows, "fallback", 0, "instead: benchmark the fallback catch-up on a table of this many rows")
	flag.IntVar(&o.applyRows, "apply", 0, "instead: benchmark the scale-out topology (1, 2, 3 appliers vs run) on a backlog of this many inserts")
	flag.IntVar(&o.appliers, "appliers", 3, "with -apply: measure groups of 1 … this many appliers (0: the tailer only, K/D)")
	flag.StringVar(&o.tailerProfile, "tailer-profile", "", "with -apply: write CPU, block and mutex profiles of the Kafka tailer to this prefix (PREFIX.cpu.N, PREFIX.block.N, PREFIX.mutex.N for run N)")
	flag.IntVar(&o.snapParRows, "snapshot-parallel", 0, "instead: the first-run snapshot of a table of this many rows at snapshot.parallelism 1, 2 and 4, each against the COPY ceiling of the same run")
	flag.IntVar(&o.pgShapeRows, "pg-shapes", 0, "instead: PostgreSQL's share of a first-run snapshot of a table of this many rows: tidemark's copy loaded by one COPY into its target layout and into the peers'")
	flag.IntVar(&o.drainRuns, "drain-runs", -1, "with -peers: streaming drains of pg_chameleon start_replica and tidemark run (default: -runs; 0: none)")
	flag.BoolVar(&o.beside, "beside", false, "instead: the lag of a busy small table while a big table (-beside-rows) is snapshotted beside the stream")
	flag.IntVar(&o.besideRows, "beside-rows", 5000000, "with -beside, -targets25: rows of the big table")
	flag.IntVar(&o.besideIdle, "beside-idle", 20, "with -beside: seconds of the writer alone (the ceiling) before the snapshot")
	flag.Float64Var(&o.besideRate, "beside-rate", 500, "with -beside: rows/s the writer commits to the small table (10-row transactions)")
	flag.StringVar(&o.besideTopology, "beside-topology", "postgres", "with -beside: postgres (tidemark run → PostgreSQL) or fanout (PostgreSQL + Kafka)")
	flag.BoolVar(&o.targets25, "targets25", false, "instead: every benchmark of issue 25's Targets table, then the table")
	flag.IntVar(&o.longRows, "long-rows", 0, "with -targets25: also the peers and R7 at this many rows (10000000)")
	flag.Parse()
	if o.drainRuns < 0 {
		o.drainRuns = o.runs
	}
	loadAtStart = loadAvg()
	// The same GC settings as the tidemark binary (cmd/tidemark tuneGC), for
	// C1 and T1 alike, which run in this process.
	debug.SetGCPercent(400)
	debug.SetMemoryLimit(200 << 20)
	if o.targets25 {
		if err := benchTargets25(context.Background(), o); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if o.beside {
		if _, err := benchBeside(context.Background(), o); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if o.peerRows > 0 {
		if _, err := benchPeers(context.Background(), o); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if o.snapParRows > 0 {
		if _, err := benchSnapshotParallel(context.Background(), o); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if o.pgShapeRows > 0 {
		if err := benchPGShapes(context.Background(), o); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if o.applyRows > 0 {
		if o.out == "docs/PERFORMANCE.md" {
			o.out = "docs/SCALE-OUT.md"
		}
		if _, err := benchApply(context.Background(), o); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if o.fallbackRows > 0 {
		if _, err := benchFallback(context.Background(), o.fallbackRows, o.runs, o.out); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type result struct {
	name  string
	rows  int
	took  time.Duration
	extra string
}

func (r result) rate() float64 { return float64(r.rows) / r.took.Seconds() }

// services connects to the local services (scripts/services.sh env).
type services struct {
	env harness.Env
	my  *client.Conn
	pg  *pgx.Conn
}

func connect(ctx context.Context) (*services, error) {
	env, err := harness.EnvFromOS()
	if err != nil {
		return nil, err
	}
	lab, err := workload.OpenLab(ctx, env)
	if err != nil {
		return nil, err
	}
	return &services{env: env, my: lab.Source(), pg: lab.Target()}, nil
}

func (s *services) close(ctx context.Context) {
	s.my.Close()
	s.pg.Close(ctx)
}

// buildTidemark builds the tidemark binary into a temporary directory
// unless -bin names one; cleanup removes it.
func buildTidemark(o *options) (cleanup func(), err error) {
	if o.bin != "" {
		return func() {}, nil
	}
	dir, err := os.MkdirTemp("", "tidemark-bench-")
	if err != nil {
		return nil, err
	}
	o.bin = filepath.Join(dir, "tidemark")
	b := exec.Command("go", "build", "-o", o.bin, "./cmd/tidemark")
	b.Stdout, b.Stderr = os.Stderr, os.Stderr
	if err := b.Run(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("build tidemark: %w", err)
	}
	return func() { os.RemoveAll(dir) }, nil
}

func run(ctx context.Context, o options) error {
	sv, err := connect(ctx)
	if err != nil {
		return err
	}
	defer sv.close(ctx)
	env, my, pg := sv.env, sv.my, sv.pg
	cleanup, err := buildTidemark(&o)
	if err != nil {
		return err
	}
	defer cleanup()

	step := func(s string) { fmt.Fprintf(os.Stderr, "== %s\n", s) }
	step("loading the backlog into MariaDB")
	// The streams start before the CREATE TABLEs: tidemark sees the tables
	// created in the stream and streams them (a table that appears without
	// its CREATE and is missing from the target is snapshotted first,
	// which would measure something else).
	// On a fresh server (a fresh clone's services) gtid_binlog_pos is
	// empty until something is logged; an empty start position would make
	// the daemons snapshot instead of stream. The DROP is logged first.
	if err := harness.Exec(my, "DROP DATABASE IF EXISTS "+benchDB); err != nil {
		return err
	}
	ddlStart, err := harness.SourcePosition(my)
	if err != nil {
		return err
	}
	if ddlStart.GTID == "" {
		return fmt.Errorf("the source's gtid_binlog_pos is empty after a logged statement: the bench needs GTIDs (log_bin on, MariaDB)")
	}
	if err := harness.Exec(my, "CREATE DATABASE "+benchDB, "USE "+benchDB,
		fmt.Sprintf(tableDDL, "ins"), fmt.Sprintf(tableDDL, "upd"), fmt.Sprintf(tableDDL, "lag"),
		"SET time_zone = '"+zone+"'"); err != nil {
		return err
	}

	// Update-heavy backlog: a hot set updated with Zipf-distributed keys,
	// in transactions of 1–10 updates.
	if err := harness.Exec(my, fmt.Sprintf(`INSERT INTO upd (id, amount, created_at, name, doc)
		SELECT seq, 1.00, NOW(6), CONCAT('hot-', seq), '{"v": 0}' FROM seq_1_to_%d`, o.hotKeys)); err != nil {
		return err
	}
	// The update-heavy stream starts at the CREATE TABLEs: it carries the
	// hot set's inserts and then the updates.
	updStart := ddlStart
	updRows := o.hotKeys + o.updates
	t0 := time.Now()
	// The plan (which key each update hits, how updates group into
	// transactions) is drawn here and stored unlogged; a procedure then
	// runs it inside the server, one UPDATE statement per change: the same
	// binlog as a client sending them, without 240k round trips.
	zipf := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), 1.1, 1, uint64(o.hotKeys-1))
	var keys, txns []string
	done := 0
	for t := 0; done < o.updates; t++ {
		n := 1 + int(zipf.Uint64()%10)
		if n > o.updates-done {
			n = o.updates - done
		}
		txns = append(txns, fmt.Sprintf("(%d, %d, %d)", t, done, done+n-1))
		for j := 0; j < n; j++ {
			keys = append(keys, fmt.Sprintf("(%d, %d)", done+j, 1+zipf.Uint64()))
		}
		done += n
	}
	plan := []string{"SET SESSION sql_log_bin = 0",
		"CREATE TABLE upd_plan (i INT PRIMARY KEY, k BIGINT NOT NULL)", "CREATE TABLE upd_txn (t INT PRIMARY KEY, lo INT NOT NULL, hi INT NOT NULL)"}
	for lo := 0; lo < len(keys); lo += 5000 {
		plan = append(plan, "INSERT INTO upd_plan VALUES "+strings.Join(keys[lo:min(lo+5000, len(keys))], ", "))
	}
	for lo := 0; lo < len(txns); lo += 5000 {
		plan = append(plan, "INSERT INTO upd_txn VALUES "+strings.Join(txns[lo:min(lo+5000, len(txns))], ", "))
	}
	plan = append(plan, "SET SESSION sql_log_bin = 1", `CREATE PROCEDURE run_updates()
		BEGIN
			DECLARE t, ntx, lo, hi, key_ INT DEFAULT 0;
			SELECT COUNT(*) INTO ntx FROM upd_txn;
			WHILE t < ntx DO
				SELECT u.lo, u.hi INTO lo, hi FROM upd_txn u WHERE u.t = t;
				START TRANSACTION;
				WHILE lo <= hi DO
					SELECT k INTO key_ FROM upd_plan WHERE i = lo;
					UPDATE upd SET amount = amount + 0.01, name = CONCAT('u-', lo), updated_at = NOW(6) WHERE id = key_;
					SET lo = lo + 1;
				END WHILE;
				COMMIT;
				SET t = t + 1;
			END WHILE;
		END`, "CALL run_updates()")
	if err := harness.Exec(my, plan...); err != nil {
		return err
	}
	updEnd, err := harness.SourcePosition(my)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "   update-heavy: %d updates in %s\n", o.updates, time.Since(t0).Round(time.Millisecond))

	// Insert-heavy backlog. T2 streams it from the CREATE TABLEs (through
	// the update-heavy backlog, whose rows are filtered out); C1 and T1
	// decode just this range.
	insStart, err := harness.SourcePosition(my)
	if err != nil {
		return err
	}
	t0 = time.Now()
	id := 0
	for i := 0; i < o.bulkTx; i++ {
		if err := harness.Exec(my, fmt.Sprintf(`INSERT INTO ins (id, amount, created_at, name, doc)
			SELECT %d + seq, (seq %% 100000) / 100, NOW(6) - INTERVAL seq SECOND, CONCAT('name-', seq), CONCAT('{"k": ', seq, ', "tags": ["a", "b"]}')
			FROM seq_1_to_%d`, id, o.bulkRows)); err != nil {
			return err
		}
		id += o.bulkRows
	}
	// Single-row transactions: a procedure loop, one autocommit each.
	if err := harness.Exec(my, `CREATE PROCEDURE singles(first BIGINT, n INT)
		BEGIN
			DECLARE i INT DEFAULT 0;
			WHILE i < n DO
				INSERT INTO ins (id, amount, created_at, name, doc) VALUES (first + i, (i % 100000) / 100, NOW(6), CONCAT('single-', i), '{"single": true}');
				SET i = i + 1;
			END WHILE;
		END`, fmt.Sprintf("CALL singles(%d, %d)", id+1, o.singles)); err != nil {
		return err
	}
	insEnd, err := harness.SourcePosition(my)
	if err != nil {
		return err
	}
	insRows := o.bulkTx*o.bulkRows + o.singles
	fmt.Fprintf(os.Stderr, "   insert-heavy: %d row changes in %s\n", insRows, time.Since(t0).Round(time.Millisecond))

	bl := backlog{ddlStart: ddlStart, updStart: updStart, updEnd: updEnd, insStart: insStart, insEnd: insEnd, insRows: insRows, updRows: updRows}
	var runs []runFigures
	for i := 1; i <= o.runs; i++ {
		step(fmt.Sprintf("run %d of %d", i, o.runs))
		if err := resetTargets(ctx, pg, "bench_"); err != nil {
			return err
		}
		f, err := measure(ctx, o, env, my, pg, bl, i)
		if err != nil {
			return err
		}
		runs = append(runs, f)
		fmt.Fprint(os.Stderr, f.table(o.runs))
	}
	tableText := report(runs)
	fmt.Print(tableText)
	return writeReport(o, tableText)
}

func pass(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// machine describes this machine and how busy it was while the bench ran.
func machine() string {
	mem := "?"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		mem = strings.Fields(strings.SplitN(string(b), "\n", 2)[0])[1] + " kB"
	}
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	return fmt.Sprintf("Machine: %d cores (%s), %s RAM, Go %s; load average before the run %s, after %s.",
		runtime.NumCPU(), cpu, mem, runtime.Version(), loadAtStart, loadAvg())
}

// loadAvg is the 1/5/15-minute load average (/proc/loadavg).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func writeReport(o options, table string) error {
	body := fmt.Sprintf(`## Streaming: `+"`make bench`"+` (%s)

%s MariaDB 10.11, PostgreSQL 15 (fsync on) and tidemark share the machine.

Backlog: insert-heavy %d row changes (%d transactions of %d rows + %d single-row
transactions) into a table with BIGINT, DECIMAL, DATETIME (Asia/Kolkata), TIMESTAMP, VARCHAR and
JSON columns; update-heavy: %d updates over %d hot keys (Zipf s=1.1, 1–10 per transaction),
streamed together with the hot keys' inserts. Every measurement ran %d times on the same backlog;
each ratio divides two figures of the same run, and the median of the per-run ratios is shown.

`+"```"+`
%s`+"```"+`

- C1 reads the binlog with go-mysql's BinlogSyncer (ParseTime) and does nothing with the rows.
- T1 is binlog.Tailer (type conversion, UTC normalization) + dedupe.Window, into a null sink.
- C2 is one pgx CopyFrom of rows of the same shape into an identical table with a primary key.
- C3 is one INSERT … ON CONFLICT DO UPDATE per row, autocommit, on a sample.
- C3b is what a competent engineer writes in a day: go-mysql's canal, rows gathered per source
  transaction and written, at a transaction boundary once 1,000 rows or 100 ms have gathered, as
  multi-row INSERT … ON CONFLICT DO UPDATE statements (coalesced by key) plus the binlog position in
  one PostgreSQL transaction; DATETIME rebuilt in the source zone (cmd/tidemark-bench/canal.go).
- T2 runs the real binary (`+"`tidemark run`"+`) from the backlog's start until its checkpoint
  reaches the backlog's end. Update-heavy is reported twice: the source changes it drained per
  second, and the rows PostgreSQL actually wrote per second (pg_stat_user_tables n_tup_ins +
  n_tup_upd + n_tup_del after the daemon exited): with Zipf(1.1) most updates of a batch fall on the
  same keys and are coalesced before the target, so the first figure is not a write rate.
- V runs `+"`tidemark verify`"+` on the table T2 just replicated; RV compares its rows/s with T2's.
- T3 runs a generator at half of T2's insert-heavy rate (100-row transactions) while tidemark
  streams. A row's lag is the moment it became visible in PostgreSQL — the commit timestamp of the
  transaction that wrote it, pg_xact_commit_timestamp(xmin), with track_commit_timestamp=on —
  minus the source NOW(6) stored in the row (same machine clock; NOW(6) is taken when the source
  statement starts, so the figure errs high by the source statement's duration).
- Peak RSS is VmHWM from /proc/<pid>/status of each daemon, polled every 50 ms until it exits.
`, time.Now().UTC().Format("2006-01-02 15:04 UTC"), machine(),
		o.bulkTx*o.bulkRows+o.singles, o.bulkTx, o.bulkRows, o.singles, o.updates, o.hotKeys, o.runs, table)
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	return replaceSection(o.out, "main", body)
}

func host(addr string) (string, uint16) {
	h, p, _ := strings.Cut(addr, ":")
	var port int
	fmt.Sscan(p, &port)
	return h, uint16(port)
}

// seqOf returns the domain-0 sequence number of a GTID position.
func seqOf(p tidemark.Position) uint64 {
	set, _ := tidemark.ParseMariaDBGTIDSet(p.GTID)
	var s uint64
	for _, g := range set {
		s = g.Seq
	}
	return s
}

// rawDecode is C1: go-mysql's decode with a no-op handler.
func rawDecode(ctx context.Context, env harness.Env, from, to tidemark.Position) (result, error) {
	h, p := host(env.MySQLAddr)
	syncer := replication.NewBinlogSyncer(replication.BinlogSyncerConfig{
		ServerID: 7001, Flavor: "mariadb", Host: h, Port: p, User: env.MySQLUser, Password: env.MySQLPassword,
		ParseTime: true, TimestampStringLocation: time.UTC, Logger: slog.New(slog.DiscardHandler),
	})
	defer syncer.Close()
	gs, err := mysql.ParseMariadbGTIDSet(from.GTID)
	if err != nil {
		return result{}, err
	}
	st, err := syncer.StartSyncGTID(gs)
	if err != nil {
		return result{}, err
	}
	end := seqOf(to)
	rows := 0
	var cur uint64
	start := time.Now()
	for {
		ev, err := st.GetEvent(ctx)
		if err != nil {
			return result{}, err
		}
		switch e := ev.Event.(type) {
		case *replication.RowsEvent:
			rows += len(e.Rows)
		case *replication.MariadbGTIDEvent:
			cur = e.GTID.SequenceNumber
		case *replication.XIDEvent:
			if cur >= end {
				return result{name: "C1 raw go-mysql decode", rows: rows, took: time.Since(start)}, nil
			}
		}
	}
}

// tailerOnly is T1: tidemark's tailer and dedupe, discarding the output.
func tailerOnly(ctx context.Context, env harness.Env, from, to tidemark.Position) (result, error) {
	loc, _ := time.LoadLocation(zone)
	tl, err := binlog.New(binlog.Config{Name: "bench_t1", Addr: env.MySQLAddr, User: env.MySQLUser, Password: env.MySQLPassword,
		ServerID: 7002, Include: []string{benchDB + ".ins"}, Zone: tidemark.ZonePolicy{Location: loc}})
	if err != nil {
		return result{}, err
	}
	win, err := dedupe.New(dedupe.Config{})
	if err != nil {
		return result{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make(chan tidemark.Chunk, 4)
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- tl.Stream(ctx, from, out) }()
	end := seqOf(to)
	rows := 0
	for {
		select {
		case ch := <-out:
			rows += len(win.Filter(ch.Changes))
			if !ch.Commit.IsZero() && seqOf(ch.Commit) >= end {
				took := time.Since(start)
				cancel()
				<-errc
				st := win.Stats()
				return result{name: "T1 tidemark tailer + dedupe", rows: rows, took: took, extra: fmt.Sprintf("dedupe dropped %d", st.DroppedDuplicate+st.DroppedRegression)}, nil
			}
		case err := <-errc:
			return result{}, fmt.Errorf("tailer stopped: %v", err)
		}
	}
}

// copyCeiling is C2: one COPY of rows shaped like the backlog.
func copyCeiling(ctx context.Context, pg *pgx.Conn, schema string, n int) (result, error) {
	tbl := pgx.Identifier{schema, "ins"}.Sanitize()
	if _, err := pg.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()+"; CREATE TABLE "+tbl+` (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL,
		created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, name text NOT NULL, doc jsonb,
		_tm_seq bigint NOT NULL, _tm_idx integer NOT NULL, _tm_commit_time timestamptz, _tm_loaded_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return result{}, err
	}
	now := time.Now().UTC()
	i := 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i >= n {
			return nil, nil
		}
		i++
		return []any{int64(i), fmt.Sprintf("%d.%02d", i%1000, i%100), now.Add(-time.Duration(i) * time.Second), now,
			fmt.Sprintf("name-%d", i), fmt.Sprintf(`{"k": %d, "tags": ["a", "b"]}`, i), int64(i), int32(1), now}, nil
	})
	start := time.Now()
	c, err := pg.CopyFrom(ctx, pgx.Identifier{schema, "ins"},
		[]string{"id", "amount", "created_at", "updated_at", "name", "doc", "_tm_seq", "_tm_idx", "_tm_commit_time"}, src)
	if err != nil {
		return result{}, err
	}
	return result{name: "C2 PostgreSQL COPY ceiling", rows: int(c), took: time.Since(start)}, nil
}

// naive is C3: one autocommit upsert per row.
func naive(ctx context.Context, pg *pgx.Conn, n int) (result, error) {
	if _, err := pg.Exec(ctx, `CREATE TABLE bench_ceiling.naive (LIKE bench_ceiling.ins INCLUDING ALL)`); err != nil {
		return result{}, err
	}
	now := time.Now().UTC()
	start := time.Now()
	for i := 0; i < n; i++ {
		if _, err := pg.Exec(ctx, `INSERT INTO bench_ceiling.naive (id, amount, created_at, updated_at, name, doc, _tm_seq, _tm_idx)
			VALUES ($1, $2, $3, $4, $5, $6, $7, 1) ON CONFLICT (id) DO UPDATE SET amount = EXCLUDED.amount, name = EXCLUDED.name,
			updated_at = EXCLUDED.updated_at, _tm_seq = EXCLUDED._tm_seq`,
			int64(i), fmt.Sprintf("%d.%02d", i%1000, i%100), now, now, fmt.Sprintf("name-%d", i), `{"k": 1}`, int64(i)); err != nil {
			return result{}, err
		}
	}
	return result{name: "C3 naive per-row upsert", rows: n, took: time.Since(start)}, nil
}

// batchChanges is the -batch flag: batch.max_changes of every daemon run.
var batchChanges int

// snapshotPar is snapshot.parallelism of the configs writeConfigDB writes
// (0: tidemark's default).
var snapshotPar int

// daemonLog is the -daemon-log flag: log.level of every daemon run.
var daemonLog = "warn"

func writeConfig(env harness.Env, source, table string, start tidemark.Position) (string, error) {
	return writeConfigDB(env, source, benchDB, table, start)
}

// writeConfigDB writes a daemon config for db.table into a temporary file;
// the source password and the target DSN come from the environment.
func writeConfigDB(env harness.Env, source, db, table string, start tidemark.Position) (string, error) {
	y := fmt.Sprintf(`source:
  name: %s
  addr: %s
  user: %s
  password: ${TM_BENCH_PW}
  server_id: %d
  time_zone: %s
  include: ["%s.%s"]
  start_position: "%s"
target:
  postgres:
    dsn: ${TM_BENCH_DSN}
    schema: %s
log:
  level: %s
`, source, env.MySQLAddr, env.MySQLUser, 7100+len(source)+len(table), zone, db, table, start, source, daemonLog)
	if batchChanges > 0 {
		y += fmt.Sprintf("batch:\n  max_changes: %d\n", batchChanges)
	}
	if snapshotPar > 0 {
		y += fmt.Sprintf("snapshot:\n  parallelism: %d\n", snapshotPar)
	}
	f, err := os.CreateTemp("", "tidemark-bench-*.yaml")
	if err != nil {
		return "", err
	}
	defer f.Close()
	_, err = io.WriteString(f, y)
	return f.Name(), err
}

// tidemarkExec is the tidemark binary bin run with args, the source
// password and the target DSN in its environment (the configs writeConfig
// and writeConfigDB write name them).
func tidemarkExec(env harness.Env, bin string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "TM_BENCH_PW="+env.MySQLPassword, "TM_BENCH_DSN="+env.PGDSN)
	return cmd
}

// daemon is a running tidemark child process and the watch on its peak RSS.
type daemon struct {
	cmd *exec.Cmd
	rss *rssWatch
}

func startDaemon(bin, cfg string, env harness.Env, extra ...string) (*daemon, error) {
	cmd := tidemarkExec(env, bin, append([]string{"run", "--config", cfg}, extra...)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &daemon{cmd: cmd, rss: watchRSS(cmd.Process.Pid)}, nil
}

// stop ends the daemon with SIGTERM and returns its peak RSS (VmHWM, KiB).
func (d *daemon) stop() (peakKiB int64, err error) {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	err = d.cmd.Wait()
	return d.rss.Peak(), err
}

// endToEnd is T2: the real binary drains a backlog.
func endToEnd(ctx context.Context, bin string, env harness.Env, pg *pgx.Conn, source, table string, from, to tidemark.Position, rows int, extra ...string) (result, int64, error) {
	if from.IsZero() {
		// Without a start position the daemon takes a snapshot first: a
		// different measure than the stream this times.
		return result{}, 0, fmt.Errorf("end to end %s: no start position (the daemon would snapshot, not stream)", table)
	}
	cfg, err := writeConfig(env, source, table, from)
	if err != nil {
		return result{}, 0, err
	}
	defer os.Remove(cfg)
	start := time.Now()
	d, err := startDaemon(bin, cfg, env, extra...)
	if err != nil {
		return result{}, 0, err
	}
	err = harness.WaitCaughtUp(ctx, pg, "", source, to, 30*time.Minute)
	took := time.Since(start)
	rss, serr := d.stop()
	if err != nil {
		return result{}, rss, err
	}
	if serr != nil {
		return result{}, rss, fmt.Errorf("tidemark exited: %w", serr)
	}
	return result{name: "T2 tidemark end to end, " + table, rows: rows, took: took, extra: fmt.Sprintf("VmHWM %d MiB", rss/1024)}, rss, nil
}

// rowsWritten reads what PostgreSQL itself counted for a table: rows
// inserted, updated and deleted (pg_stat_user_tables). The daemon has
// exited; its backends flush their counters as they exit, a moment later:
// read until the sum has not moved for a second.
func rowsWritten(ctx context.Context, pg *pgx.Conn, schema, table string) (int64, error) {
	var last int64 = -1
	same := 0
	for i := 0; i < 100; i++ {
		var n int64
		if _, err := pg.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
			return 0, err
		}
		if err := pg.QueryRow(ctx, `SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint FROM pg_stat_user_tables
			WHERE schemaname = $1 AND relname = $2`, schema, table).Scan(&n); err != nil {
			return 0, fmt.Errorf("read pg_stat_user_tables for %s.%s: %w", schema, table, err)
		}
		if n > 0 && n == last {
			same++
			if same == 4 {
				return n, nil
			}
		} else {
			same = 0
		}
		last = n
		time.Sleep(250 * time.Millisecond)
	}
	return 0, fmt.Errorf("read pg_stat_user_tables for %s.%s: counters did not settle (last %d)", schema, table, last)
}

// lag is T3: stream while a generator writes at a fixed rate. A row's lag
// is the moment it became visible in PostgreSQL — the commit timestamp of
// the transaction that wrote it, pg_xact_commit_timestamp(xmin), which needs
// track_commit_timestamp=on — minus the source's NOW(6) stored in the row
// when its INSERT ran (same machine, same clock). NOW(6) is taken at the
// start of the source statement, a millisecond or so before its COMMIT, so
// the figure errs high by that much.
func lag(ctx context.Context, o options, env harness.Env, my *client.Conn, pg *pgx.Conn, source string, rate float64) (p50, p99 time.Duration, n int, rss int64, err error) {
	var tct string
	if err = pg.QueryRow(ctx, "SHOW track_commit_timestamp").Scan(&tct); err != nil {
		return
	}
	if tct != "on" {
		err = fmt.Errorf("T3 needs track_commit_timestamp=on in PostgreSQL to see when a row became visible (scripts/services.sh sets it; restart the services: scripts/services.sh down && scripts/services.sh up)")
		return
	}
	start, err := harness.SourcePosition(my)
	if err != nil {
		return
	}
	cfg, err := writeConfig(env, source, "lag", start)
	if err != nil {
		return
	}
	defer os.Remove(cfg)
	d, err := startDaemon(o.bin, cfg, env)
	if err != nil {
		return
	}
	if err = harness.Exec(my, "SET time_zone = '+00:00'"); err != nil {
		return
	}
	// Warm-up: the daemon meets the table for the first time with its
	// first row and creates (snapshots) its target then. One row with a
	// negative id, waited for and left out of the figures: T3 times the
	// steady stream, not the start.
	if err = harness.Exec(my, `INSERT INTO lag (id, amount, created_at, updated_at, name, doc) VALUES (-1, 1.00, NOW(6), NOW(6), 'warm-up', '{}')`); err != nil {
		return
	}
	warm, err := harness.SourcePosition(my)
	if err != nil {
		return
	}
	if err = harness.WaitCaughtUp(ctx, pg, "", source, warm, 5*time.Minute); err != nil {
		return
	}
	// Batches of 100 rows per transaction at the target rate.
	perTx := 100
	interval := time.Duration(float64(time.Second) * float64(perTx) / rate)
	deadline := time.Now().Add(time.Duration(o.lagSeconds) * time.Second)
	next := time.Now()
	id := 0
	for time.Now().Before(deadline) {
		if err = harness.Exec(my, fmt.Sprintf(`INSERT INTO lag (id, amount, created_at, updated_at, name, doc)
			SELECT %d + seq, 1.00, NOW(6), NOW(6), 'lag', '{}' FROM seq_1_to_%d`, id, perTx)); err != nil {
			return
		}
		id += perTx
		next = next.Add(interval)
		time.Sleep(time.Until(next))
	}
	end, err := harness.SourcePosition(my)
	if err != nil {
		return
	}
	if err = harness.WaitCaughtUp(ctx, pg, "", source, end, 5*time.Minute); err != nil {
		return
	}
	rss, _ = d.stop()
	rows, err := pg.Query(ctx, "SELECT extract(epoch from (pg_xact_commit_timestamp(xmin) - updated_at))::float8 FROM "+pgx.Identifier{source, "lag"}.Sanitize()+" WHERE id >= 0")
	if err != nil {
		return
	}
	var lags []float64
	for rows.Next() {
		var s *float64
		if err = rows.Scan(&s); err != nil {
			rows.Close()
			return
		}
		if s == nil {
			rows.Close()
			err = fmt.Errorf("a row of %s.lag has no commit timestamp (track_commit_timestamp was off when it was written?)", source)
			return
		}
		lags = append(lags, *s)
	}
	rows.Close()
	if err = rows.Err(); err != nil {
		return
	}
	if len(lags) != id {
		err = fmt.Errorf("lag test: %d rows in PostgreSQL, %d written", len(lags), id)
		return
	}
	sort.Float64s(lags)
	q := func(p float64) time.Duration {
		return time.Duration(lags[int(p*float64(len(lags)-1))] * float64(time.Second))
	}
	return q(0.5), q(0.99), len(lags), rss, nil
}

// verifyRun is V: `tidemark verify` of a table the daemon replicated, timed
// as a subprocess (in-database chunked checksums on both sides).
func verifyRun(bin string, env harness.Env, source, table string, rows int) (result, error) {
	cfg, err := writeConfig(env, source, table, tidemark.Position{})
	if err != nil {
		return result{}, err
	}
	defer os.Remove(cfg)
	cmd := tidemarkExec(env, bin, "verify", "--config", cfg, "--table", benchDB+"."+table)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err != nil {
		return result{}, fmt.Errorf("tidemark verify: %v\n%s", err, out)
	}
	return result{name: "V tidemark verify, " + table, rows: rows, took: took, extra: "exit 0 (equal)"}, nil
}

// quiescePG makes each timed load of a bench start from the same quiet
// PostgreSQL, whichever load came before it: the tables in schemas named
// prefix… that earlier loads wrote are left out of autovacuum (their
// vacuum and analyze would otherwise run during the next load, at a point
// autovacuum_naptime decides), a CHECKPOINT writes out their dirty
// buffers, and an autovacuum worker still running is waited for (up to a
// minute). Before, the tool timed last in a run (tidemark) shared
// PostgreSQL with the background work of the three loads before it.
func quiescePG(ctx context.Context, pg *pgx.Conn, prefix string) error {
	rows, err := pg.Query(ctx, `SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p') AND starts_with(n.nspname, $1) AND NOT 'autovacuum_enabled=false' = ANY (coalesce(c.reloptions, '{}'))`, prefix)
	if err != nil {
		return fmt.Errorf("quiesce postgres: list tables: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("quiesce postgres: list tables: %w", err)
	}
	for _, name := range names {
		if _, err := pg.Exec(ctx, "ALTER TABLE "+name+" SET (autovacuum_enabled = false)"); err != nil {
			return fmt.Errorf("quiesce postgres: %s: %w", name, err)
		}
	}
	if _, err := pg.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("quiesce postgres: checkpoint: %w", err)
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var n int
		if err := pg.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'").Scan(&n); err != nil {
			return fmt.Errorf("quiesce postgres: autovacuum workers: %w", err)
		}
		if n == 0 {
			return nil
		}
	}
	return nil
}
