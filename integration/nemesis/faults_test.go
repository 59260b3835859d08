package nemesis

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// fault draws one fault the topology allows and injects it.
func (c *campaign) fault() {
	w := map[string]int{"kill9_tailer": 6, "stopcont_tailer": 3, "pg_restart": 2, "mariadb_restart": 2, "net_reset": 2, "net_latency": 2, "net_blackhole": 1}
	if c.s.fallback {
		w["purge_while_down"] = 2
	}
	if c.standby != nil {
		w["kill9_standby"] = 2
	}
	if len(c.appliers) > 0 {
		w["kill9_applier"], w["stopcont_applier"] = 5, 2
	}
	if c.s.topology != "pg" {
		w["kafka_restart"], w["partitions_increase"] = 1, 1
	}
	kind := c.weighted("fault", w)
	c.res.faults[kind]++
	c.phase += " " + kind
	switch kind {
	case "kill9_tailer":
		c.tailer.kill()
		c.burst(c.intn("txns", 0, 20), true)
		c.tailer = c.start("tailer", "run", "--config", c.cfg)
	case "kill9_standby":
		c.standby.kill()
		c.standby = c.start("standby", "run", "--config", c.cfg)
	case "kill9_applier":
		i := c.intn("applier", 0, len(c.appliers)-1)
		c.appliers[i].kill()
		c.burst(c.intn("txns", 0, 20), true)
		c.appliers[i] = c.start(fmt.Sprintf("applier %d", i), "apply", "--config", c.cfg)
	case "stopcont_tailer", "stopcont_applier":
		p := c.tailer
		if kind == "stopcont_applier" {
			p = c.appliers[c.intn("applier", 0, len(c.appliers)-1)]
		}
		p.stop()
		c.burst(c.intn("txns", 5, 40), true)
		c.sleep(time.Duration(c.intn("paused_ms", 200, 4000)) * time.Millisecond)
		p.cont()
	case "pg_restart":
		c.burst(c.intn("txns", 5, 30), true)
		if !c.dry {
			c.restartPG()
			c.pg.Close(c.ctx)
			c.pg = c.connectPG()
		}
	case "mariadb_restart":
		if kill := c.chance("sigkill", 0.5); !c.dry {
			c.restartMariaDB(kill)
		}
	case "net_reset":
		c.burst(c.intn("txns", 5, 30), true)
		if err := c.net(func() error { return c.proxy.ResetAll() }); err != nil {
			c.t.Fatal(err)
		}
	case "net_latency", "net_blackhole":
		tx := harness.Toxic{Name: "nm_latency", Type: "latency", Attributes: map[string]any{"latency": c.intn("latency_ms", 20, 300), "jitter": 20}}
		if kind == "net_blackhole" {
			// Nothing comes back: the connection stays open, half-open
			// to the daemon until its read timeout.
			tx = harness.Toxic{Name: "nm_blackhole", Type: "timeout", Attributes: map[string]any{"timeout": 0}}
		}
		if err := c.net(func() error { return c.proxy.Add(tx) }); err != nil {
			c.t.Fatal(err)
		}
		c.burst(c.intn("txns", 5, 40), true)
		c.sleep(time.Duration(c.intn("toxic_ms", 500, 5000)) * time.Millisecond)
		if err := c.net(func() error { return c.proxy.Remove(tx.Name) }); err != nil {
			c.t.Fatal(err)
		}
	case "purge_while_down":
		c.purgeWhileDown()
	case "kafka_restart":
		c.restartKafka()
	case "partitions_increase":
		c.addPartitions(c.intn("partitions_added", 1, 3))
	}
}

// net changes the fault proxy (not in a dry run).
func (c *campaign) net(f func() error) error {
	if c.dry {
		return nil
	}
	return f()
}

// purgeWhileDown stops the tailers, writes, purges every binlog the daemon
// has not read, writes again, and starts them: the fallback must catch up
// (with delete detection, deletes included; without it the writes while
// down are inserts and updates only: deletes that no binlog holds are
// documented as lost without keydiff).
func (c *campaign) purgeWhileDown() {
	c.tailer.kill()
	if c.standby != nil {
		c.standby.kill()
	}
	c.burst(c.intn("txns", 5, 30), c.s.keydiff)
	if !c.dry {
		c.source("FLUSH BINARY LOGS")
		r, err := c.my.Execute("SHOW MASTER STATUS")
		if err != nil {
			c.t.Fatal(err)
		}
		file, _ := r.GetString(0, 0)
		c.source("PURGE BINARY LOGS TO '" + file + "'")
	}
	c.burst(c.intn("txns", 0, 20), c.s.keydiff)
	c.startTailers()
}

// serverRoot is the repository's checkout (its scripts/services.sh and
// .data belong to whoever started the servers this test uses).
func serverRoot() string {
	p, _ := filepath.Abs("../..")
	return p
}

// restartPG runs pg_ctl restart -m immediate on the local PostgreSQL (as
// the reliability suite's F3 does).
func (c *campaign) restartPG() {
	var dataDir, binDir string
	if err := c.pg.QueryRow(c.ctx, "SELECT current_setting('data_directory'), (SELECT setting FROM pg_config WHERE name = 'BINDIR')").Scan(&dataDir, &binDir); err != nil {
		c.t.Fatalf("locate the PostgreSQL data directory (the test user must be a superuser): %v", err)
	}
	logFile := filepath.Join(filepath.Dir(dataDir), "log", "postgresql.log")
	if _, err := os.Stat(filepath.Dir(logFile)); err != nil {
		logFile = "/dev/null"
	}
	argv := []string{filepath.Join(binDir, "pg_ctl"), "-D", dataDir, "-l", logFile, "-w", "-t", "60", "-m", "immediate", "restart"}
	if os.Geteuid() == 0 {
		argv = append([]string{"runuser", "-u", "postgres", "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = "/"
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
}

// restartMariaDB stops mariadbd (SIGKILL or SHUTDOWN) and starts it again
// with the same command line (as the reliability suite's F4 does).
func (c *campaign) restartMariaDB(kill bool) {
	r, err := c.my.Execute("SELECT @@pid_file")
	if err != nil {
		c.t.Fatal(err)
	}
	pidFile, _ := r.GetString(0, 0)
	b, err := os.ReadFile(pidFile)
	if err != nil {
		c.t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		c.t.Fatal(err)
	}
	cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		c.t.Fatal(err)
	}
	argv := strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")
	if kill {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	} else {
		_, _ = c.my.Execute("SHUTDOWN")
	}
	c.my.Close()
	if !testenv.WaitFor(60*time.Second, func() bool {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		f := strings.Fields(string(st))
		return err != nil || len(f) < 3 || f[2] == "Z"
	}) {
		c.t.Fatalf("mariadbd (pid %d) did not stop", pid)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start mariadbd: %v", err)
	}
	go func() { _ = cmd.Wait() }()
	c.my = c.connectMy()
}

// restartKafka kills the local broker (SIGKILL) and starts it again with
// scripts/services.sh up (which starts only what is not running).
func (c *campaign) restartKafka() {
	if c.dry {
		c.burst(c.intn("txns", 5, 30), true)
		return
	}
	root := serverRoot()
	b, err := os.ReadFile(filepath.Join(root, ".data", "kafka", "kafka.pid"))
	if err != nil {
		c.t.Fatalf("the Kafka broker's pid file: %v", err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 {
		c.t.Fatalf("the Kafka broker's pid file holds %q", b)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	testenv.WaitFor(30*time.Second, func() bool { return syscall.Kill(pid, 0) != nil })
	c.burst(c.intn("txns", 5, 30), true)
	cmd := exec.Command(filepath.Join(root, "scripts", "services.sh"), "up")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Fatalf("restart Kafka: %v\n%s", err, out)
	}
}

// addPartitions adds partitions to every change topic of the campaign.
func (c *campaign) addPartitions(n int) {
	if c.dry {
		c.burst(c.intn("txns", 5, 40), true)
		return
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.env.KafkaBrokers...))
	if err != nil {
		c.t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
	defer cancel()
	var topics []string
	for _, tb := range c.tables {
		topics = append(topics, c.prefix+"."+c.db+"."+tb.name)
	}
	if _, err := adm.CreatePartitions(ctx, n, topics...); err != nil {
		c.t.Logf("add %d partitions to %v: %v", n, topics, err)
	}
	c.burst(c.intn("txns", 5, 40), true)
}

// partitionStop is the documented stop of a `run` after partitions were
// added to its change topics (docs/SCALE-OUT.md, "Partition counts"): the
// running tailer stops before it publishes by the new count, and a
// restarted one that finds the apply group still behind on the old
// partitions stops after apply.partition_change_wait. Both errors say to
// start the tailer again (sink/kafka topics.go).
var partitionStop = regexp.MustCompile(`level=ERROR .*the partition count of change topic \S+ (changed from \d+ to \d+ while the tailer ran|is \d+, and (was -?\d+ when the tailer last published|the checkpoint does not say))`)

// restartPartitionStops starts again each `run` that stopped with
// partitionStop in a campaign that added partitions, as the error says an
// operator does (soak seed 15213570897: the tailer stopped 17 s in, and
// the judge counted the documented stop as a finding). It is called while
// the system settles, until the tables are equal.
func (c *campaign) restartPartitionStops() {
	if c.dry || c.res.faults["partitions_increase"] == 0 {
		return
	}
	c.restartStopped("partition_stop", "stopped on the partitions the campaign added (documented; started again, as the error says)",
		func(p *proc, line string) bool { return partitionStop.MatchString(line) })
}

// restartStopped starts again every `run` that exited by itself (not
// killed by the campaign, not documented yet) with a last error that
// documented accepts: the stop is recorded as documented under fault and
// logged with why, and the new process takes the old one's role.
func (c *campaign) restartStopped(fault, why string, documented func(p *proc, line string) bool) {
	for _, p := range append([]*proc(nil), c.procs...) {
		if !p.exited() || p.killed || p.documented != "" || len(p.args) == 0 || p.args[0] != "run" {
			continue
		}
		line := exitLine(p)
		if !documented(p, line) {
			continue
		}
		p.documented = line
		c.res.faults[fault]++
		c.t.Logf("%s %s: %s", p.role, why, line)
		q := c.start(p.role, p.args...)
		switch p {
		case c.tailer:
			c.tailer = q
		case c.standby:
			c.standby = q
		}
	}
}

// restartLockTakeovers starts again, as a supervisor would, a `run` that
// stopped because another process took its source's lock over
// (lockHandover) when that process was a `tidemark resync` that found the
// lock free and resynced itself (campaign.resyncedHere: a
// lock_session_kill had just ended the daemon's lock session, and the
// command took the lock before the daemon's next check took it back; the
// command's producer fenced the daemon's; docs/schema-changes.md, resync
// with no daemon running). That stop is documented and loud; the tables must still end
// equal, with the daemon running again. Only while no other `run` runs (a
// standby that took over is handedOverTo's).
func (c *campaign) restartLockTakeovers() {
	if c.dry || len(c.resyncedHere) == 0 {
		return
	}
	c.restartStopped("lock_taken_by_resync", "stopped because a tidemark resync took the free source lock and resynced itself (documented; started again, as a supervisor would)",
		func(p *proc, line string) bool {
			return lockHandover.MatchString(line) && handedOverTo(p, c.procs) == nil && stoppedDuring(line, c.resyncedHere)
		})
}

// logTime is the time= field of a log line.
var logTime = regexp.MustCompile(`\btime=(\S+)`)

// stoppedDuring says whether log line (a process's stop) was written while
// one of the windows ran, or in the few seconds after its end that the
// stopping process takes to log it. A line without a time is not.
func stoppedDuring(line string, ws []window) bool {
	m := logTime.FindStringSubmatch(line)
	if m == nil {
		return false
	}
	at, err := time.Parse(time.RFC3339Nano, m[1])
	if err != nil {
		return false
	}
	for _, w := range ws {
		if !at.Before(w.from) && !at.After(w.to.Add(5*time.Second)) {
			return true
		}
	}
	return false
}
