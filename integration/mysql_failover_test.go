package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// privateMySQL is a mysqld of the test's own, run from the MySQL 9.7 root of
// scripts/services.sh (TIDEMARK_TEST_MYSQL9_ROOT) with its datadir in a
// temporary directory bind-mounted into the root inside the process's own
// mount namespace.
type privateMySQL struct {
	Addr   string
	dir    string
	cmd    *exec.Cmd
	exited chan struct{}
}

func (f *fixture) startPrivateMySQL(t *testing.T, serverID int) *privateMySQL {
	t.Helper()
	root := testenv.MySQL9Root(t)
	dir, err := os.MkdirTemp("", fmt.Sprintf("tm-my9-%d-", serverID))
	if err != nil {
		t.Fatal(err)
	}
	s := &privateMySQL{dir: dir, exited: make(chan struct{})}
	t.Cleanup(func() {
		s.kill()
		os.RemoveAll(dir)
	})
	port := freeLoopbackPort(t)
	s.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	const mnt = "/srv/tidemark"
	cnf := fmt.Sprintf(`[mysqld]
user = root
datadir = %[1]s/data
socket = %[1]s/mysqld.sock
pid-file = %[1]s/mysqld.pid
log-error = %[1]s/mysqld.err
tmpdir = /tmp
bind-address = 127.0.0.1
port = %[2]d
mysqlx = OFF
skip-name-resolve
secure-file-priv =
server-id = %[3]d
log-bin = binlog
binlog-row-image = FULL
binlog-row-metadata = FULL
gtid-mode = ON
enforce-gtid-consistency = ON
sync-binlog = 0
innodb-flush-log-at-trx-commit = 2
innodb-buffer-pool-size = 32M
innodb-redo-log-capacity = 8M
skip-replica-start
`, mnt, port, serverID)
	init := fmt.Sprintf("SET SESSION sql_log_bin = 0;\nCREATE USER '%[1]s'@'127.0.0.1' IDENTIFIED BY '%[2]s';\nGRANT ALL PRIVILEGES ON *.* TO '%[1]s'@'127.0.0.1' WITH GRANT OPTION;\n",
		f.env.MySQLUser, f.env.MySQLPassword)
	for name, body := range map[string]string{"my.cnf": cnf, "init.sql": init} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mysqld := func(args ...string) *exec.Cmd {
		return exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c",
			`mount --bind "$1" "$0$2" && shift 2 && exec chroot "$0" "$@"`, root, dir, mnt,
			"/usr/sbin/mysqld", "--defaults-file=" + mnt + "/my.cnf"}, args...)...)
	}
	if out, err := mysqld("--initialize-insecure", "--init-file="+mnt+"/init.sql").CombinedOutput(); err != nil {
		errLog, _ := os.ReadFile(filepath.Join(dir, "mysqld.err"))
		t.Fatalf("initialize private MySQL: %v\n%s\n%s", err, out, errLog)
	}
	s.cmd = mysqld()
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	if !testenv.WaitFor(90*time.Second, func() bool {
		c, err := client.Connect(s.Addr, f.env.MySQLUser, f.env.MySQLPassword, "")
		if err == nil {
			c.Close()
		}
		return err == nil
	}) {
		errLog, _ := os.ReadFile(filepath.Join(dir, "mysqld.err"))
		t.Fatalf("private MySQL on %s did not start:\n%s", s.Addr, errLog)
	}
	return s
}

// kill ends the mysqld with SIGKILL (a crashed primary).
func (s *privateMySQL) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
}

func (f *fixture) connPrivateMySQL(t *testing.T, s *privateMySQL) *client.Conn {
	t.Helper()
	c, err := client.Connect(s.Addr, f.env.MySQLUser, f.env.MySQLPassword, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestMySQLFailoverToPromotedReplica: two real MySQL 9.7 servers, the second
// a GTID replica of the first (SOURCE_AUTO_POSITION=1); tidemark streams the
// primary through a fixed address (a proxy, standing for a virtual IP). The
// primary is killed with writes behind it, the replica promoted, the address
// moved and the writes continued there: tidemark follows the new server by
// GTID set in the next epoch, and the target equals the new primary row by
// row. A replica promoted while it lagged (it lacks transactions tidemark
// applied) is refused: tidemark stops naming what is missing and the fix.
func TestMySQLFailoverToPromotedReplica(t *testing.T) {
	t.Run("caught up", func(t *testing.T) { testMySQLFailover(t, false) })
	t.Run("lagging", func(t *testing.T) { testMySQLFailover(t, true) })
}

func testMySQLFailover(t *testing.T, lagging bool) {
	f := newMySQLFixture(t)
	a := f.startPrivateMySQL(t, 9201)
	b := f.startPrivateMySQL(t, 9202)
	ca, cb := f.connPrivateMySQL(t, a), f.connPrivateMySQL(t, b)
	if err := harness.Exec(cb, fmt.Sprintf("CHANGE REPLICATION SOURCE TO SOURCE_HOST = '127.0.0.1', SOURCE_PORT = %s, SOURCE_USER = '%s', SOURCE_PASSWORD = '%s', SOURCE_AUTO_POSITION = 1, GET_SOURCE_PUBLIC_KEY = 1",
		strings.Split(a.Addr, ":")[1], f.env.MySQLUser, f.env.MySQLPassword), "START REPLICA"); err != nil {
		t.Fatal(err)
	}
	proxy, err := harness.NewFaultProxy("my9-failover", a.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	db := testenv.Name("it_myfo_")
	f.dropLater(t, db, db)
	if err := harness.Exec(ca, "CREATE DATABASE "+db, "USE "+db, "CREATE TABLE t (id INT PRIMARY KEY, v INT, note VARCHAR(20))",
		"INSERT INTO t VALUES (1, 1, 'a'), (2, 2, 'a'), (3, 3, 'a')"); err != nil {
		t.Fatal(err)
	}
	cfg := f.relConfig(t, db, db, relOpts{Addr: proxy.Addr})
	d := f.startDaemon(t, cfg)
	defer func() {
		if !d.exited() {
			d.kill()
		}
	}()
	caughtUp := func(c *client.Conn) {
		t.Helper()
		pos, err := harness.SourcePosition(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := harness.WaitCaughtUp(f.untilExit(d), f.pg, "", db, pos, 2*time.Minute); err != nil {
			t.Fatalf("%v\n%s", err, tail(d.stderr.String(), 30))
		}
	}
	caughtUp(ca)
	if lagging {
		// The replica stops receiving; the primary goes on, tidemark too.
		if err := harness.Exec(cb, "STOP REPLICA"); err != nil {
			t.Fatal(err)
		}
	}
	for i := 10; i < 210; i++ {
		q := fmt.Sprintf("INSERT INTO %s.t VALUES (%d, %d, 'primary')", db, i, i)
		if i%3 == 0 {
			q = fmt.Sprintf("UPDATE %s.t SET v = v + 1, note = 'upd on a' WHERE id = %d", db, i-1)
		}
		if err := harness.Exec(ca, q); err != nil {
			t.Fatal(err)
		}
	}
	caughtUp(ca)
	if lagging {
		a.kill()
		if err := harness.Exec(cb, "RESET REPLICA ALL"); err != nil {
			t.Fatal(err)
		}
		if err := proxy.Retarget(b.Addr); err != nil {
			t.Fatal(err)
		}
		if err := harness.Exec(cb, fmt.Sprintf("INSERT INTO %s.t VALUES (1000, 0, 'lagging b')", db)); err != nil {
			t.Fatal(err)
		}
		if !testenv.WaitFor(90*time.Second, d.exited) {
			t.Fatalf("tidemark goes on after a failover to a lagging replica:\n%s", tail(d.stderr.String(), 30))
		}
		log := d.stderr.String()
		for _, want := range []string{"lacks transactions tidemark already applied", "tidemark catchup"} {
			if !strings.Contains(log, want) {
				t.Fatalf("the stop does not say %q:\n%s", want, tail(log, 20))
			}
		}
		if code := d.cmd.ProcessState.ExitCode(); code == 0 {
			t.Fatal("exit 0 after a refused failover")
		}
		t.Logf("refused: %s", grepLines(log, "level=ERROR"))
		return
	}
	// The replica has everything the primary has.
	want, err := harness.SourcePosition(ca)
	if err != nil {
		t.Fatal(err)
	}
	if !testenv.WaitFor(30*time.Second, func() bool {
		p, err := harness.SourcePosition(cb)
		c, cerr := p.Compare(want)
		return err == nil && cerr == nil && c >= 0
	}) {
		t.Fatal("the replica did not catch up with the primary")
	}

	// Failover.
	a.kill()
	if err := harness.Exec(cb, "STOP REPLICA", "RESET REPLICA ALL"); err != nil {
		t.Fatal(err)
	}
	if err := proxy.Retarget(b.Addr); err != nil {
		t.Fatal(err)
	}
	for i := 300; i < 400; i++ {
		q := fmt.Sprintf("INSERT INTO %s.t VALUES (%d, %d, 'new primary')", db, i, i)
		switch i % 4 {
		case 1:
			q = fmt.Sprintf("UPDATE %s.t SET note = 'upd on b' WHERE id = %d", db, i-290)
		case 2:
			q = fmt.Sprintf("DELETE FROM %s.t WHERE id = %d", db, i-280)
		}
		if err := harness.Exec(cb, q); err != nil {
			t.Fatal(err)
		}
	}
	caughtUp(cb)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, tail(d.stderr.String(), 30))
	}
	log := d.stderr.String()
	if !strings.Contains(log, "following a changed source by GTID") {
		t.Fatalf("the failover was not followed by GTID:\n%s", grepLines(log, "source identity"))
	}
	diff, err := harness.Compare(context.Background(), cb, f.pg, harness.TableSpec{Database: db, Table: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if !diff.Equal() {
		t.Fatalf("target differs from the new primary: %s\n%s", diff, strings.Join(diff.Examples, "\n"))
	}
	pos, _, err := harness.StoredCheckpoint(f.ctx, f.pg, "", db)
	if err != nil {
		t.Fatal(err)
	}
	r, err := cb.Execute("SELECT @@server_uuid")
	if err != nil {
		t.Fatal(err)
	}
	uuid, _ := r.GetString(0, 0)
	if pos.Epoch != 1 || pos.Source.Server != uuid {
		t.Fatalf("checkpoint %s: want epoch 1 on server %s", pos, uuid)
	}
	t.Logf("followed: %s; %s", grepLines(log, "following a changed source"), diff)
}
