// Package integration runs tidemark end to end against the real MariaDB and
// PostgreSQL started by scripts/services.sh: in process through the wired
// components, and as the real binary killed with SIGKILL.
package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/jackc/pgx/v5"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

var binPath string

func TestMain(m *testing.M) {
	bin, cleanup, err := harness.BuildTidemark("tidemark-it-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = bin
	code := m.Run()
	cleanup()
	os.Exit(code)
}

type fixture struct {
	env harness.Env
	my  *client.Conn
	pg  *pgx.Conn
	ctx context.Context
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	env, err := harness.EnvFromOS()
	if err != nil {
		t.Fatal(err)
	}
	return newFixtureWith(t, env)
}

// newMySQLFixture is newFixture with the real MySQL 9.7 of
// scripts/services.sh as the source (flavor mysql).
func newMySQLFixture(t *testing.T) *fixture {
	t.Helper()
	env, err := harness.EnvFromOS()
	if err != nil {
		t.Fatal(err)
	}
	if env, err = env.MySQL9(); err != nil {
		t.Fatal(err)
	}
	return newFixtureWith(t, env)
}

// eachSource runs body as a subtest on each source server: MariaDB 10.11
// and the real MySQL 9.7.
func eachSource(t *testing.T, body func(t *testing.T, f *fixture)) {
	t.Run("mariadb", func(t *testing.T) { body(t, newFixture(t)) })
	t.Run("mysql", func(t *testing.T) { body(t, newMySQLFixture(t)) })
}

// flavor is the source's flavor for a daemon config ("" for MariaDB, the
// default).
func (f *fixture) flavor() string {
	if f.env.Flavor == "mysql" {
		return "mysql"
	}
	return ""
}

// binlogStatusSQL is the statement that shows the binlog file being
// written: MySQL 8.4 removed SHOW MASTER STATUS.
func (f *fixture) binlogStatusSQL() string {
	if f.env.Flavor == "mysql" {
		return "SHOW BINARY LOG STATUS"
	}
	return "SHOW MASTER STATUS"
}

func newFixtureWith(t *testing.T, env harness.Env) *fixture {
	t.Helper()
	my, err := env.MySQL()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { my.Close() })
	ctx := context.Background()
	pg, err := env.PG(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(ctx) })
	return &fixture{env: env, my: my, pg: pg, ctx: ctx}
}

// newSource is the start most end-to-end tests share: a fresh source
// database name, prefix and random hex digits (not created here; dropped
// at cleanup with the target schema of its name and the checkpoint of the
// source of its name, see dropLater), and the source's position before the
// test writes.
func (f *fixture) newSource(t *testing.T, prefix string) (db string, start tidemark.Position) {
	t.Helper()
	db = testenv.Name(prefix)
	f.dropLater(t, db, db)
	start, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	return db, start
}

// newWorkload is newSource with w's tables set up in the database (w.My
// and w.Database are set here).
func (f *fixture) newWorkload(t *testing.T, prefix string, w harness.Workload) (db string, start tidemark.Position, _ *harness.Workload) {
	t.Helper()
	db, start = f.newSource(t, prefix)
	w.My, w.Database = f.my, db
	if err := w.Setup(); err != nil {
		t.Fatal(err)
	}
	return db, start, &w
}

// dropLater removes a test's source database, target schema and checkpoint.
func (f *fixture) dropLater(t *testing.T, db string, sources ...string) {
	t.Cleanup(func() {
		_, _ = f.my.Execute("DROP DATABASE IF EXISTS " + db)
		_, _ = f.pg.Exec(f.ctx, "DROP SCHEMA IF EXISTS "+db+" CASCADE")
		for _, s := range sources {
			_, _ = f.pg.Exec(f.ctx, "DELETE FROM tidemark.checkpoints WHERE source = $1", s)
			_, _ = f.pg.Exec(f.ctx, "DELETE FROM tidemark.source_epochs WHERE source = $1", s)
		}
	})
}

// configYAML writes a daemon config; the password comes from the
// environment (${TM_IT_MYSQL_PASSWORD}) to exercise expansion.
func (f *fixture) configYAML(t *testing.T, source, db, targetSchema, zone string, start tidemark.Position) string {
	t.Helper()
	return f.configYAMLWith(t, source, db, targetSchema, zone, start, "")
}

// configYAMLWith is configYAML plus extra top-level YAML (e.g. a fallback
// section).
func (f *fixture) configYAMLWith(t *testing.T, source, db, targetSchema, zone string, start tidemark.Position, extra string) string {
	t.Helper()
	return f.daemon(source, db, targetSchema, zone, start, extra).Write(t)
}

// daemon is the config configYAMLWith writes, for tests that change more
// before writing it.
func (f *fixture) daemon(source, db, targetSchema, zone string, start tidemark.Position, extra string) testenv.Daemon {
	return testenv.Daemon{
		Source: testenv.Source{Name: source, Flavor: f.flavor(), Addr: f.env.MySQLAddr, User: f.env.MySQLUser,
			Password: "${TM_IT_MYSQL_PASSWORD}", ServerID: testenv.ServerID(), TimeZone: zone,
			Include: []string{db + ".*"}, StartPosition: start.String(), Heartbeat: time.Second},
		Target: testenv.Target{Postgres: &testenv.Postgres{DSN: "${TM_IT_PG_DSN}", Schema: targetSchema}},
		Batch:  &testenv.Batch{MaxDelay: 50 * time.Millisecond},
		Log:    &testenv.Log{Level: "info"},
		// Metrics nil: "off" unless extra has a metrics section (daemons of
		// different tests must not fight over the default port;
		// TestMetricsMatchWorkload sets one).
		Extra: extra,
	}
}

// daemonProc is a running tidemark binary.
type daemonProc struct {
	cmd    *exec.Cmd
	stderr *lockedWriter
	done   chan error    // receives Wait's result once
	waited chan struct{} // closed when the process has exited
}

func (f *fixture) startDaemon(t *testing.T, config string, extraEnv ...string) *daemonProc {
	t.Helper()
	return f.startCommand(t, []string{"run", "--config", config}, extraEnv...)
}

// startCommand starts the tidemark binary with args (a long-running
// command: run or apply) and the test's credentials in its environment.
func (f *fixture) startCommand(t *testing.T, args []string, extraEnv ...string) *daemonProc {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	cmd.Env = append(os.Environ(), "TM_IT_MYSQL_PASSWORD="+f.env.MySQLPassword, "TM_IT_PG_DSN="+f.env.PGDSN)
	cmd.Env = append(cmd.Env, extraEnv...)
	lw := &lockedWriter{}
	cmd.Stderr = lw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemonProc{cmd: cmd, stderr: lw, done: make(chan error, 1), waited: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		close(d.waited)
		d.done <- err
	}()
	return d
}

// stop sends SIGTERM and returns the exit code. It first waits for the
// daemon's "starting" line: a signal that arrives before the daemon catches
// it (a process started a moment ago, with nothing left to catch up) would
// kill it instead of stopping it.
func (d *daemonProc) stop(t *testing.T) int {
	t.Helper()
	testenv.WaitFor(30*time.Second, func() bool { return d.exited() || strings.Contains(d.stderr.String(), "msg=starting") })
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.waited:
	case <-time.After(60 * time.Second):
		_ = d.cmd.Process.Kill()
		t.Fatalf("daemon did not stop on SIGTERM; stderr:\n%s", d.stderr.String())
	}
	return d.cmd.ProcessState.ExitCode()
}

func (d *daemonProc) kill() {
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.waited
}

func (f *fixture) compare(t *testing.T, spec harness.TableSpec) *harness.Diff {
	t.Helper()
	d, err := harness.Compare(f.ctx, f.my, f.pg, spec)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Equal() {
		t.Fatalf("target differs from source: %s\n%s", d, strings.Join(d.Examples, "\n"))
	}
	return d
}

func (f *fixture) waitCaughtUp(t *testing.T, source string, d *daemonProc) {
	t.Helper()
	target, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	ctx := f.untilExit(d)
	if err := harness.WaitCaughtUp(ctx, f.pg, "", source, target, 120*time.Second); err != nil {
		stderr := ""
		if d != nil {
			stderr = d.stderr.String()
		}
		t.Fatalf("%v\ndaemon stderr:\n%s", err, stderr)
	}
}

// untilExit is the fixture's context, canceled when the daemon d (if any)
// exits: a wait for its progress then ends at once.
func (f *fixture) untilExit(d *daemonProc) context.Context {
	if d == nil {
		return f.ctx
	}
	ctx, cancel := context.WithCancelCause(f.ctx)
	go func() {
		<-d.waited
		cancel(errors.New("the daemon exited"))
	}()
	return ctx
}

// lockedWriter collects a subprocess's output for failure messages.
type lockedWriter = harness.LockedBuffer
