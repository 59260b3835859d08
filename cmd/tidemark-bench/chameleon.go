package main

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"tidemark"
	"tidemark/integration/harness"
)

// pg_chameleon 2.0 (PyPI), the second peer of `make bench-peers`: a venv
// under .data/ (the Makefile creates it), run as the postgres user (it
// refuses root) with its own HOME, so its configuration, logs and pid files
// stay under .data/ too.
const (
	chameleonVenv = ".data/chameleon"
	chameleonHome = ".data/chameleon-home"
	chameleonUser = "postgres"
)

// chameleonConfig is pg_chameleon's configuration: source "mysql" maps
// peersDB to schema. charset is 'utf8': pg_chameleon also names its CSV
// files' Python codec by it, and Python has no 'utf8mb4'.
const chameleonConfig = `---
pid_dir: '%[1]s/pid/'
log_dir: '%[1]s/logs/'
log_dest: file
log_level: info
log_days_keep: 1
rollbar_key: ''
rollbar_env: ''
type_override: {}
pg_conn:
  host: %[2]q
  port: %[3]q
  user: %[4]q
  password: %[5]q
  database: %[6]q
  charset: "utf8"
sources:
  mysql:
    db_conn:
      host: %[7]q
      port: %[8]q
      user: %[9]q
      password: %[10]q
      charset: 'utf8'
      connect_timeout: 10
    schema_mappings:
      %[11]s: %[12]s
    limit_tables:
    skip_tables:
    grant_select_to:
    lock_timeout: "120s"
    my_server_id: 7391
    replica_batch_size: 10000
    replay_max_rows: 10000
    batch_retention: '1 day'
    copy_max_memory: "300M"
    copy_mode: 'file'
    out_dir: '%[1]s/out'
    sleep_loop: 1
    on_error_replay: exit
    on_error_read: exit
    auto_maintenance: "disabled"
    gtid_enable: false
    type: mysql
    skip_events:
      insert:
      delete:
      update:
    keep_existing_schema: No
    net_read_timeout: 600
`

// chameleon runs pg_chameleon commands for one target schema.
type chameleon struct {
	bin, home string
}

// newChameleon writes pg_chameleon's configuration for a copy of peersDB
// into schema and makes a fresh replica catalog with the source added.
func newChameleon(env harness.Env, schema string) (*chameleon, error) {
	bin, err := filepath.Abs(filepath.Join(chameleonVenv, "bin", "chameleon"))
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("pg_chameleon not found at %s: `make bench-peers` installs it (a venv with pip install 'pg_chameleon>=2.0,<2.1')", bin)
	}
	home, err := filepath.Abs(chameleonHome)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(home, ".pg_chameleon")
	for _, d := range []string{"configuration", "pid", "logs", "out"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	dsn, err := url.Parse(env.PGDSN)
	if err != nil {
		return nil, fmt.Errorf("parse TIDEMARK_TEST_PG_DSN: %w", err)
	}
	pgPass, _ := dsn.User.Password()
	myHost, myPort, _ := strings.Cut(env.MySQLAddr, ":")
	cfg := fmt.Sprintf(chameleonConfig, dir, dsn.Hostname(), dsn.Port(), dsn.User.Username(), pgPass, strings.TrimPrefix(dsn.Path, "/"),
		myHost, myPort, env.MySQLUser, env.MySQLPassword, peersDB, schema)
	if err := os.WriteFile(filepath.Join(dir, "configuration", "bench.yml"), []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	if out, err := exec.Command("chown", "-R", chameleonUser, home).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("chown %s to %s: %v: %s", home, chameleonUser, err, out)
	}
	c := &chameleon{bin: bin, home: home}
	_, _ = c.run("drop_replica_schema") // none on a first run
	for _, step := range []string{"create_replica_schema", "add_source"} {
		if out, err := c.run(step); err != nil {
			return nil, fmt.Errorf("pg_chameleon %s: %v\n%s", step, err, out)
		}
	}
	return c, nil
}

// command is one pg_chameleon command in the foreground (--debug: logs to
// stderr, no daemon).
func (c *chameleon) command(step string) *exec.Cmd {
	args := []string{"-u", chameleonUser, "--", "env", "HOME=" + c.home, c.bin, step, "--config", "bench", "--debug"}
	if step != "create_replica_schema" && step != "drop_replica_schema" {
		args = append(args, "--source", "mysql")
	}
	cmd := exec.Command("runuser", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

func (c *chameleon) run(step string) (string, error) {
	out, err := c.command(step).CombinedOutput()
	return string(out), err
}

// initReplica times init_replica (the initial copy) and returns the peak
// resident set of its process tree (runuser, then python; KiB).
func (c *chameleon) initReplica() (time.Duration, int64, error) {
	var out bytes.Buffer
	cmd := c.command("init_replica")
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, fmt.Errorf("pg_chameleon init_replica: %w", err)
	}
	w := watchTree(cmd.Process.Pid)
	err := cmd.Wait()
	took, rss := time.Since(start), w.Peak()
	if err != nil || !strings.Contains(out.String(), "init replica for source mysql is complete") {
		return 0, 0, fmt.Errorf("pg_chameleon init_replica: %v\n%s", err, tail(out.String(), 40))
	}
	return took, rss, nil
}

// drain runs start_replica until done reports that the target has the
// backlog's last change, and returns the time from its start.
func (c *chameleon) drain(ctx context.Context, done func(ctx context.Context) bool) (time.Duration, error) {
	var out lockedBuffer
	cmd := c.command("start_replica")
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) // its own process group (Setpgid)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	}
	deadline := time.Now().Add(30 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return 0, fmt.Errorf("pg_chameleon start_replica exited: %v\n%s", err, tail(out.String(), 40))
		default:
		}
		if done(ctx) {
			took := time.Since(t0)
			stop()
			return took, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	return 0, fmt.Errorf("pg_chameleon start_replica did not drain the backlog in 30 minutes\n%s", tail(out.String(), 40))
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// lockedBuffer is a bytes.Buffer that a child's output and the bench may
// use at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// drainResult is the streaming drain of one backlog by pg_chameleon and by
// tidemark.
type drainResult struct {
	changes                         int
	chameleon, tidemark             time.Duration
	chameleonVerify, tidemarkVerify string
}

// drainChanges is the backlog of the drain: updates of 100 rows each, then
// one update of id 1 that the drain waits for.
const drainChanges = 32000

// drainPeers copies the peers' table with pg_chameleon (init_replica) and
// with tidemark (catchup, which stores a checkpoint), writes a backlog of
// updates to the source, and times pg_chameleon's start_replica and `tidemark
// run` draining it, one after the other (drain run number run); with check,
// both copies are then checked with `tidemark verify`.
func drainPeers(ctx context.Context, sv *services, bin string, run int, check bool,
	runTidemark func(source string) (time.Duration, int64, error),
	verify func(source string) (string, error)) (drainResult, error) {
	chSchema, tmSource := fmt.Sprintf("peers_chameleon_drain_%d", run), fmt.Sprintf("peers_tidemark_drain_%d", run)
	r := drainResult{changes: drainChanges + 1}
	fmt.Fprintf(os.Stderr, "== drain [%d]: initial copies (pg_chameleon init_replica, tidemark catchup)\n", run)
	ch, err := newChameleon(sv.env, chSchema)
	if err != nil {
		return r, err
	}
	if _, _, err := ch.initReplica(); err != nil {
		return r, err
	}
	if _, _, err := runTidemark(tmSource); err != nil {
		return r, err
	}
	fmt.Fprintf(os.Stderr, "== drain: writing %d changes\n", r.changes)
	var stmts []string
	for i := 0; i < drainChanges/100; i++ {
		lo := 2 + i*100
		stmts = append(stmts, fmt.Sprintf("UPDATE %s.t SET amount = amount + 1 WHERE id BETWEEN %d AND %d", peersDB, lo, lo+99))
	}
	// The last change marks this run's drain: the source row keeps the
	// marks of earlier runs, so an initial copy of a later run already
	// holds them (a mark without the run's number let runs 2 and 3 of
	// pg_chameleon "drain" in 7 and 46 ms).
	mark := fmt.Sprintf("-drained-%d", run)
	stmts = append(stmts, fmt.Sprintf("UPDATE %s.t SET name = CONCAT(name, '%s') WHERE id = 1", peersDB, mark))
	if err := harness.Exec(sv.my, stmts...); err != nil {
		return r, fmt.Errorf("write the drain's backlog: %w", err)
	}
	to, err := harness.SourcePosition(sv.my)
	if err != nil {
		return r, err
	}
	drained := func(ctx context.Context) bool {
		var name string
		err := sv.pg.QueryRow(ctx, "SELECT name FROM "+chSchema+".t WHERE id = 1").Scan(&name)
		return err == nil && strings.HasSuffix(name, mark)
	}
	if drained(ctx) {
		return r, fmt.Errorf("drain %d: pg_chameleon's initial copy %s already holds the backlog's last change (%s): the drain would time nothing", run, chSchema, mark)
	}
	// Each drain from the same quiet PostgreSQL: the two initial copies'
	// tables (and then pg_chameleon's drain's updates) are not vacuumed,
	// analyzed or written out during the other's drain (quiescePG).
	if err := quiescePG(ctx, sv.pg, "peers_"); err != nil {
		return r, err
	}
	fmt.Fprintln(os.Stderr, "== drain: pg_chameleon start_replica")
	r.chameleon, err = ch.drain(ctx, drained)
	if err != nil {
		return r, err
	}
	fmt.Fprintln(os.Stderr, "== drain: tidemark run")
	cfg, err := writeConfigDB(sv.env, tmSource, peersDB, "t", tidemark.Position{})
	if err != nil {
		return r, err
	}
	if err := quiescePG(ctx, sv.pg, "peers_"); err != nil {
		return r, err
	}
	defer os.Remove(cfg)
	t0 := time.Now()
	d, err := startDaemon(bin, cfg, sv.env)
	if err != nil {
		return r, err
	}
	werr := harness.WaitCaughtUp(ctx, sv.pg, "", tmSource, to, 30*time.Minute)
	r.tidemark = time.Since(t0)
	if _, err := d.stop(); err != nil || werr != nil {
		return r, fmt.Errorf("tidemark drain: %v %v", werr, err)
	}
	fmt.Fprintf(os.Stderr, "   pg_chameleon %s, tidemark %s\n", r.chameleon.Round(time.Millisecond), r.tidemark.Round(time.Millisecond))
	if !check {
		return r, nil
	}
	if r.chameleonVerify, err = verify(chSchema); err != nil {
		return r, err
	}
	if r.tidemarkVerify, err = verify(tmSource); err != nil {
		return r, err
	}
	return r, nil
}

// chameleonVersion is pg_chameleon's version, from its venv.
func chameleonVersion() string {
	out, err := exec.Command(filepath.Join(chameleonVenv, "bin", "pip"), "show", "pg_chameleon").Output()
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "Version: "); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}
