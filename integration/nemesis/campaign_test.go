package nemesis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/jackc/pgx/v5"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// settings is a campaign's drawn topology and configuration.
type settings struct {
	topology      string // pg | apply | fanout
	members       int    // apply members
	partitions    int    // Kafka partitions per change topic
	standby       bool   // a second `run` waiting on the source lock
	deleteMode    string // hard | soft
	mirrorIndexes bool
	notNull       bool
	version       string // gtid | filepos
	dedupe        bool
	fallback      bool
	keydiff       bool
	maxChanges    int // batch.max_changes (0: the default)
	maxRecords    int // apply.max_records
	dropTable     string
	zone          string
	start         string // stream (from a position before the tables) | snapshot (first-run snapshot of filled tables)
}

// result is what a campaign did, for the soak table.
type result struct {
	topology    string
	faults      map[string]int
	ddl, rows   int
	quarantines int
	failure     string
}

// window is a span of wall-clock time.
type window struct{ from, to time.Time }

type campaign struct {
	t      *testing.T
	seed   uint64
	rng    *rand.Rand
	ext    *rand.Rand // the extension draws' stream (ext_test.go)
	late   *rand.Rand // the later draws' stream (late_test.go)
	inExt  bool       // c.rng is ext's or late's stream now (withStream)
	draws  []string
	env    harness.Env
	ctx    context.Context
	my     *client.Conn // the workload's connection
	pg     *pgx.Conn
	db     string
	prefix string // Kafka topic prefix
	group  string
	cfg    string // config path
	s      settings
	tables []*table
	large  *table              // the table preloadLarge filled (nil: none)
	proxy  *harness.FaultProxy // the daemon's way to MariaDB
	// I4 (run → PostgreSQL, version gtid): a ledger of db.ticks and a
	// monitor of the checkpoint (harness, the reliability suite's).
	led   *harness.Ledger
	mon   *harness.Monitor
	procs []*proc
	// startOverAt is the index in procs of the first process started
	// after a checkpoint_delete (0: none), which replays the history.
	startOverAt int
	// resyncedHere are the runs (start to end) of the resync commands
	// that found the source's lock free and did the work themselves
	// (ddl_test.go): a daemon whose lock session had just ended is
	// fenced by them while they hold the lock.
	resyncedHere []window
	// cmds are the commands runCmd ran (a resync, a verify…), each with
	// its start, end, exit code and output: report writes them to
	// cmds.log (soak seed 787796038735 stopped on a lock a command's
	// session held, and what that command printed was lost).
	cmdsMu sync.Mutex
	cmds   []string
	// the campaign's current processes
	tailer, standby *proc
	appliers        []*proc
	res             result
	txns            int
	// dry draws the campaign without running it (no server, no process):
	// the draws are the same as a real run's, for choosing seeds.
	dry   bool
	phase string // what the campaign was doing, for the failure report
}

// draw records one draw (every draw of the campaign is in c.draws, in
// order: the failure report prints them).
// The extension draws (from c.ext) are marked with a leading "+".
func (c *campaign) draw(name string, v any) {
	if c.inExt {
		name = "+" + name
	}
	c.draws = append(c.draws, fmt.Sprintf("%s=%v", name, v))
}

func (c *campaign) intn(name string, lo, hi int) int {
	v := lo + c.rng.IntN(hi-lo+1)
	c.draw(name, v)
	return v
}

func (c *campaign) chance(name string, p float64) bool {
	v := c.rng.Float64() < p
	c.draw(name, v)
	return v
}

func (c *campaign) pick(name string, opts ...string) string {
	v := opts[c.rng.IntN(len(opts))]
	c.draw(name, v)
	return v
}

// weighted draws one of the keys of w with probability proportional to its
// weight (keys in sorted order, so the draw is reproducible).
func (c *campaign) weighted(name string, w map[string]int) string {
	keys := make([]string, 0, len(w))
	total := 0
	for k, n := range w {
		if n > 0 {
			keys = append(keys, k)
			total += n
		}
	}
	sort.Strings(keys)
	x := c.rng.IntN(total)
	for _, k := range keys {
		if x < w[k] {
			c.draw(name, k)
			return k
		}
		x -= w[k]
	}
	panic("unreachable")
}

func (c *campaign) drawSettings() {
	s := &c.s
	s.topology = c.weighted("topology", map[string]int{"pg": 5, "apply": 3, "fanout": 2})
	if s.topology == "apply" {
		s.members = c.intn("apply.members", 1, 3)
		s.maxRecords = []int{7, 50, 500}[c.intn("apply.max_records#", 0, 2)]
	}
	if s.topology != "pg" {
		s.partitions = c.intn("kafka.partitions", 1, 6)
	}
	s.standby = c.chance("standby", 0.25)
	s.deleteMode = c.pick("delete_mode", "hard", "soft")
	s.mirrorIndexes = c.chance("mirror.indexes", 0.5)
	if s.deleteMode == "hard" {
		s.notNull = c.chance("mirror.not_null", 0.5)
	}
	s.version = c.weighted("version", map[string]int{"gtid": 3, "filepos": 1})
	s.dedupe = c.chance("dedupe", 0.3)
	s.start = c.weighted("start", map[string]int{"stream": 3, "snapshot": 1})
	// An empty start position snapshots first only with the fallback on
	// (without it, it means the oldest binlog).
	if s.start == "snapshot" {
		s.fallback = true
		c.draw("fallback", "true (forced by start=snapshot)")
	} else {
		s.fallback = c.chance("fallback", 0.4)
	}
	if s.fallback && s.topology != "apply" {
		// The topology's tailer has no PostgreSQL target to list keys
		// (its start refuses keydiff, naming the table).
		s.keydiff = c.chance("fallback.keydiff", 0.6)
	}
	s.maxChanges = []int{0, 5, 40, 300}[c.intn("batch.max_changes#", 0, 3)]
	s.dropTable = c.pick("ddl.drop_table", "refuse", "apply")
	s.zone = c.pick("source.time_zone", "UTC", "America/New_York", "Europe/Berlin")
}

func (c *campaign) drawTables() {
	n := c.intn("tables", 2, 4)
	nokey := false
	for i := 0; i < n; i++ {
		tb := &table{name: fmt.Sprintf("t%d", i), next: 1}
		for {
			tb.shape = c.weighted(tb.name+".shape", map[string]int{"pk": 3, "uk1": 2, "uk2": 3, "cpk": 2, "nullu": 2, "nokey": 1})
			if tb.shape != "nokey" || !nokey {
				break
			}
		}
		switch tb.shape {
		case "uk1", "uk2":
			if c.chance(tb.name+".business_keys", 0.6) {
				tb.bk = tb.keyCols()
			}
		case "nokey":
			nokey = true
			if c.chance(tb.name+".business_keys", 0.5) {
				tb.bk = []string{"k"}
			} else {
				tb.mayQuarantine = "no primary key and no business key (documented refusal)"
			}
		}
		nc := c.intn(tb.name+".columns", 1, 6)
		for j := 0; j < nc; j++ {
			f := families[c.rng.IntN(len(families))]
			c.draw(fmt.Sprintf("%s.c%d", tb.name, j), f.name)
			tb.cols = append(tb.cols, col{name: fmt.Sprintf("c%d_%s", j, f.name), fam: f})
		}
		tb.colSeq = nc
		c.tables = append(c.tables, tb)
	}
}

// config writes the daemon's YAML.
func (c *campaign) config(start string) {
	s := c.s
	var b strings.Builder
	fmt.Fprintf(&b, "source:\n  name: %s\n  addr: %s\n  user: %s\n  password: ${NM_MYSQL_PASSWORD}\n  server_id: %d\n  version: %s\n  time_zone: %s\n  include: [\"%s.*\"]\n  heartbeat: 1s\n  start_position: %q\n",
		c.db, c.proxy.Addr, c.env.MySQLUser, 7000+c.seed%20000, s.version, s.zone, c.db, start)
	var bks []string
	for _, tb := range c.tables {
		if tb.bk != nil {
			bks = append(bks, fmt.Sprintf("    %s.%s: [%s]", c.db, tb.name, strings.Join(tb.bk, ", ")))
		}
	}
	if len(bks) > 0 {
		b.WriteString("  business_keys:\n" + strings.Join(bks, "\n") + "\n")
	}
	fmt.Fprintf(&b, "target:\n  postgres:\n    dsn: ${NM_PG_DSN}\n    schema: %s\n    delete_mode: %s\n    mirror:\n      indexes: %v\n      not_null: %v\n    ddl:\n      drop_table: %s\n",
		c.db, s.deleteMode, s.mirrorIndexes, s.notNull, s.dropTable)
	if s.topology != "pg" {
		fmt.Fprintf(&b, "  kafka:\n    brokers: [%s]\n    topic_prefix: %s\n    exactly_once: true\n    partitions: %d\n", strings.Join(c.env.KafkaBrokers, ", "), c.prefix, s.partitions)
	}
	if s.topology == "apply" {
		fmt.Fprintf(&b, "apply:\n  group: %s\n  max_records: %d\n", c.group, s.maxRecords)
	}
	b.WriteString("batch:\n  max_delay: 50ms\n")
	if s.maxChanges > 0 {
		fmt.Fprintf(&b, "  max_changes: %d\n", s.maxChanges)
	}
	fmt.Fprintf(&b, "dedupe:\n  enabled: %v\n", s.dedupe)
	if s.fallback {
		b.WriteString("fallback:\n  enabled: true\n  tables:\n")
		for _, tb := range c.tables {
			dd := ""
			if s.keydiff {
				dd = ", delete_detection: keydiff"
			}
			fmt.Fprintf(&b, "    %s.%s: {column: updated_at%s}\n", c.db, tb.name, dd)
		}
		if c.led != nil {
			fmt.Fprintf(&b, "    %s.ticks: {column: at}\n", c.db)
		}
	} else {
		b.WriteString("fallback:\n  enabled: false\n")
	}
	b.WriteString("metrics:\n  listen: \"off\"\nlog:\n  level: info\n")
	c.cfg = filepath.Join(c.t.TempDir(), "tidemark.yaml")
	if err := os.WriteFile(c.cfg, []byte(b.String()), 0o600); err != nil {
		c.t.Fatal(err)
	}
}

// runCampaign runs one seed's campaign and judges it.
func runCampaign(t *testing.T, seed uint64) *result {
	c := newCampaign(t, seed)
	env, err := harness.EnvFromOS()
	if err != nil {
		t.Fatal(err)
	}
	c.env = env
	c.drawSettings()
	c.drawTables()
	c.drawExtTables()
	c.res.topology = c.s.topology
	if c.s.topology != "pg" && len(env.KafkaBrokers) == 0 {
		t.Fatal("the campaign draws a Kafka topology but TIDEMARK_TEST_KAFKA_BROKERS is not set (scripts/services.sh up starts Kafka)")
	}
	// One cleanup, in this order: the processes first (nothing may write
	// while the report is taken and the schemas dropped).
	t.Cleanup(func() {
		if c.led != nil {
			c.led.Stop()
			c.mon.Stop()
		}
		for _, p := range c.procs {
			if !p.exited() {
				p.kill()
			}
		}
		if c.proxy != nil {
			c.proxy.Close()
		}
		if c.my != nil {
			c.my.Close() // a failed statement may have left a transaction open
		}
		if t.Failed() {
			c.report()
		}
		c.drop()
	})
	c.setup()
	c.run()
	c.judge()
	return &c.res
}

func (c *campaign) connectMy() *client.Conn {
	var my *client.Conn
	var err error
	if !testenv.WaitFor(60*time.Second, func() bool { my, err = c.env.MySQL(); return err == nil }) {
		c.t.Fatalf("connect to MariaDB: %v", err)
	}
	if _, err := my.Execute("SET time_zone = '" + c.s.zone + "'"); err != nil {
		c.t.Fatalf("set the session zone: %v", err)
	}
	if c.db != "" {
		_, _ = my.Execute("USE `" + c.db + "`")
	}
	return my
}

func (c *campaign) connectPG() *pgx.Conn {
	var pg *pgx.Conn
	var err error
	if !testenv.WaitFor(60*time.Second, func() bool { pg, err = c.env.PG(c.ctx); return err == nil }) {
		c.t.Fatalf("connect to PostgreSQL: %v", err)
	}
	return pg
}

func (c *campaign) setup() {
	t := c.t
	c.phase = "setup"
	start := ""
	if !c.dry {
		c.db = fmt.Sprintf("nm%d_%s", c.seed%1000000, testenv.Name("")[:6])
		c.prefix = "nm" + strings.TrimPrefix(c.db, "nm")
		c.group = "nm-apply-" + c.db
		c.my = c.connectMy()
		c.pg = c.connectPG()
		var err error
		if c.proxy, err = harness.NewFaultProxy("nm-mariadb", c.env.MySQLAddr); err != nil {
			t.Fatal(err)
		}
		c.source("CREATE DATABASE `"+c.db+"`", "USE `"+c.db+"`")
		pos, err := harness.SourcePosition(c.my)
		if err != nil {
			t.Fatal(err)
		}
		for _, tb := range c.tables {
			c.source(tb.createSQL(c.db, tb.name))
		}
		if c.s.topology == "pg" && c.s.version == "gtid" {
			if c.led, err = harness.NewLedger(c.env, c.my, c.db); err != nil {
				t.Fatal(err)
			}
		}
		watchI5(c)
		start = pos.String()
	}
	if c.s.start == "snapshot" {
		// A first run: the tables already hold rows, no checkpoint, no
		// start position.
		start = ""
		for _, tb := range c.tables {
			n := c.intn(tb.name+".preload", 100, 3000)
			for n > 0 {
				k := min(n, 500)
				c.source(tb.insertRows(c.db, c.rng, k))
				n -= k
			}
		}
	}
	if c.s.start == "snapshot" {
		c.preloadLarge()
	}
	if !c.dry {
		c.config(start)
	}
	c.startTailers()
	if c.led != nil {
		c.led.Start(50 * time.Millisecond)
		c.mon = harness.StartMonitor(c.env, c.db, c.db, c.led)
	}
	for i := 0; i < c.s.members; i++ {
		c.appliers = append(c.appliers, c.start(fmt.Sprintf("applier %d", i), "apply", "--config", c.cfg))
	}
	if c.s.start == "snapshot" && c.chance("kill_during_snapshot", 0.5) {
		// kill -9 of the tailer inside its first-run snapshot, 1–3 times,
		// under a light load with deletes (issue 22 §1b).
		kills := c.intn("snapshot_kills", 1, 3)
		deletes := c.drawKillDeletes()
		for i := kills; i > 0; i-- {
			c.burst(c.intn("txns", 1, 10), true)
			pause := time.Duration(c.intn("snapshot_kill_ms", 100, 2500)) * time.Millisecond
			if deletes {
				// Instead of the pause: the kill as soon as the big
				// table's copy has begun (the deletes need copied rows).
				c.awaitLargeCopied()
			} else {
				c.sleep(pause)
			}
			c.res.faults["kill9_during_snapshot"]++
			c.tailer.kill()
			if deletes {
				c.deleteCopied()
			}
			c.tailer = c.start("tailer", "run", "--config", c.cfg)
		}
	}
}

// dryRun draws seed's campaign without running it.
func dryRun(t *testing.T, seed uint64) *campaign {
	c := newCampaign(t, seed)
	c.dry = true
	c.drawSettings()
	c.drawTables()
	c.drawExtTables()
	c.setup()
	c.run()
	return c
}

func newCampaign(t *testing.T, seed uint64) *campaign {
	c := &campaign{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), ext: rand.New(rand.NewPCG(seed^0x6e656d65, seed)),
		late: rand.New(rand.NewPCG(seed^0x6c617465, seed^0x6e656d65)), ctx: context.Background()}
	c.res.faults = map[string]int{}
	return c
}

// drop removes the campaign's database, schema, checkpoint and offsets
// (kept with NEMESIS_KEEP=1 when the campaign failed).
func (c *campaign) drop() {
	if c.db == "" || c.t.Failed() && os.Getenv("NEMESIS_KEEP") != "" {
		c.t.Logf("kept %s on both sides (NEMESIS_KEEP)", c.db)
		return
	}
	my, pg := c.connectMy(), c.connectPG()
	defer my.Close()
	defer pg.Close(context.Background())
	_, _ = my.Execute("SET SESSION lock_wait_timeout = 30")
	_, _ = my.Execute("DROP DATABASE IF EXISTS `" + c.db + "`")
	_, _ = pg.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+c.db+`" CASCADE`)
	_, _ = pg.Exec(context.Background(), "DROP EVENT TRIGGER IF EXISTS "+pgx.Identifier{"nm_i5_" + c.db}.Sanitize())
	_, _ = pg.Exec(context.Background(), "DELETE FROM tidemark.checkpoints WHERE source = $1", c.db)
	_, _ = pg.Exec(context.Background(), "DELETE FROM tidemark.stream_offsets WHERE consumer_group = $1", c.group)
}

func (c *campaign) startTailers() {
	c.tailer = c.start("tailer", "run", "--config", c.cfg)
	if c.s.standby {
		c.standby = c.start("standby", "run", "--config", c.cfg)
	}
}

func (c *campaign) sleep(d time.Duration) {
	if !c.dry {
		time.Sleep(d)
	}
}

// source runs statements on the workload's connection, failing the
// campaign at the first error.
func (c *campaign) source(sqls ...string) {
	c.t.Helper()
	if c.dry {
		return
	}
	for _, q := range sqls {
		if _, err := c.my.Execute(q); err != nil {
			c.t.Fatalf("source: %.300s: %v", q, err)
		}
	}
}

// tx runs statements in one transaction (an XA transaction when xa).
func (c *campaign) tx(xa bool, sqls []string) {
	c.t.Helper()
	c.txns++
	if xa {
		id := fmt.Sprintf("'nm%d'", c.txns)
		c.source("XA START " + id)
		c.source(sqls...)
		c.source("XA END "+id, "XA PREPARE "+id, "XA COMMIT "+id)
		return
	}
	if c.dry {
		return
	}
	if _, err := c.my.Execute("BEGIN"); err != nil {
		// Between transactions a broken workload connection is not the
		// daemon's business: reconnect once.
		c.t.Logf("workload connection: %v; reconnecting", err)
		c.my.Close()
		c.my = c.connectMy()
		c.source("BEGIN")
	}
	c.source(sqls...)
	c.source("COMMIT")
}

// run draws and executes the campaign's steps.
func (c *campaign) run() {
	steps := c.intn("steps", 6, 14)
	for i := 0; i < steps; i++ {
		kind := c.weighted(fmt.Sprintf("step%d", i), map[string]int{"burst": 5, "ddl": 2, "fault": 3})
		c.phase = fmt.Sprintf("step %d (%s)", i, kind)
		switch kind {
		case "burst":
			c.burst(c.intn("txns", 5, 60), true)
		case "ddl":
			c.ddl()
		case "fault":
			c.fault()
		}
		c.extStep(i)
	}
	c.burst(c.intn("final.txns", 5, 30), true)
}

// burst runs n workload transactions, pausing a drawn 0–4 ms between them
// so the daemon streams while the source writes.
func (c *campaign) burst(n int, deletes bool) {
	for i := 0; i < n; i++ {
		c.transaction(deletes)
		c.sleep(time.Duration(c.rng.IntN(5)) * time.Millisecond)
	}
}

func (c *campaign) liveTable(name string) *table {
	var cand []*table
	for _, tb := range c.tables {
		if len(tb.live) > 0 {
			cand = append(cand, tb)
		}
	}
	if len(cand) == 0 {
		return nil
	}
	tb := cand[c.rng.IntN(len(cand))]
	c.draw(name, tb.name)
	return tb
}

// transaction draws and runs one workload transaction.
func (c *campaign) transaction(deletes bool) {
	w := map[string]int{"insert": 20, "insert_multi": 10, "update": 25, "update_key": 6, "delete": 10, "hot_key": 4, "mixed": 10, "xa": 3, "big": 1, "delete_many": 2}
	if !deletes {
		w["delete"], w["delete_many"], w["update_key"] = 0, 0, 0
	}
	kind := c.weighted("tx", w)
	var sqls []string
	switch kind {
	case "insert", "insert_multi", "big":
		tb := c.tables[c.rng.IntN(len(c.tables))]
		n := 1
		if kind == "insert_multi" {
			n = 2 + c.rng.IntN(40)
		} else if kind == "big" {
			n = 2000 + c.rng.IntN(8000)
		}
		c.draw("rows", fmt.Sprintf("%s:%d", tb.name, n))
		for n > 0 {
			k := min(n, 500)
			sqls = append(sqls, tb.insertRows(c.db, c.rng, k))
			n -= k
		}
	case "hot_key":
		tb := c.liveTable("table")
		if tb == nil {
			return
		}
		r := tb.live[c.rng.IntN(len(tb.live))]
		for i := 20 + c.rng.IntN(180); i > 0; i-- {
			sqls = append(sqls, tb.update(c.db, c.rng, r))
		}
	case "delete_many":
		tb := c.liveTable("table")
		if tb == nil {
			return
		}
		for i := len(tb.live) / 10; i >= 0 && len(tb.live) > 0; i-- {
			sqls = append(sqls, tb.remove(c.db, c.rng.IntN(len(tb.live))))
		}
	default:
		ops := 1 + c.rng.IntN(3)
		if kind == "mixed" || kind == "xa" {
			ops = 3 + c.rng.IntN(6)
		}
		for i := 0; i < ops; i++ {
			op := kind
			if kind == "mixed" || kind == "xa" {
				op = []string{"insert", "update", "update", "update_key", "delete"}[c.rng.IntN(5)]
				if !deletes && (op == "delete" || op == "update_key") {
					op = "update"
				}
			}
			if q := c.op(op); q != "" {
				sqls = append(sqls, q)
			}
		}
	}
	if len(sqls) > 0 {
		c.tx(kind == "xa", sqls)
	}
}

// op is one statement of a transaction.
func (c *campaign) op(kind string) string {
	if kind == "insert" {
		tb := c.tables[c.rng.IntN(len(c.tables))]
		return tb.insertRows(c.db, c.rng, 1)
	}
	tb := c.liveTable("table")
	if tb == nil {
		return ""
	}
	i := c.rng.IntN(len(tb.live))
	switch kind {
	case "update":
		return tb.update(c.db, c.rng, tb.live[i])
	case "update_key":
		return tb.rekey(c.db, i)
	default:
		return tb.remove(c.db, i)
	}
}
