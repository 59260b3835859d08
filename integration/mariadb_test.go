package integration

// Private MariaDB servers for failover tests: each test starts its own
// mariadbd instances on free loopback ports, in their own data directories,
// configured like scripts/services.sh configures the shared one (binlog in
// ROW format with full images and metadata, gtid_strict_mode,
// log_slave_updates), and removes them at the end.

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"

	"tidemark/internal/testenv"
)

// privateMy is one mariadbd started by a test.
type privateMy struct {
	ServerID int
	Addr     string
	dir      string
	sock     string
	cnf      string
	cmd      *exec.Cmd
	exited   chan struct{}
	user     string // "mysql" when running as root
}

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startPrivateMariaDB initialises and starts a mariadbd with the given
// server_id. The tidemark test user (TIDEMARK_TEST_MYSQL_USER/PASSWORD)
// exists on it with every privilege; its binlog starts empty.
func (f *fixture) startPrivateMariaDB(t *testing.T, serverID int) *privateMy {
	t.Helper()
	dir, err := os.MkdirTemp("", fmt.Sprintf("tm-my%d-", serverID))
	if err != nil {
		t.Fatal(err)
	}
	s := &privateMy{ServerID: serverID, dir: dir, sock: filepath.Join(dir, "my.sock"), cnf: filepath.Join(dir, "my.cnf"), exited: make(chan struct{})}
	t.Cleanup(func() {
		s.kill()
		os.RemoveAll(dir)
	})
	if os.Geteuid() == 0 {
		s.user = "mysql"
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		u, err := user.Lookup("mysql")
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	port := freeLoopbackPort(t)
	s.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	cnf := fmt.Sprintf(`[mariadbd]
datadir = %[1]s/data
socket = %[2]s
pid-file = %[1]s/my.pid
log-error = %[1]s/error.log
bind-address = 127.0.0.1
port = %[3]d
skip-name-resolve
server-id = %[4]d
log-bin = mysql-bin
binlog-format = ROW
binlog-row-image = FULL
binlog-row-metadata = FULL
gtid-domain-id = 0
gtid-strict-mode = ON
log-slave-updates
sync-binlog = 0
innodb-flush-log-at-trx-commit = 2
innodb-buffer-pool-size = 32M
character-set-server = utf8mb4
collation-server = utf8mb4_general_ci
`, dir, s.sock, port, serverID)
	if err := os.WriteFile(s.cnf, []byte(cnf), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--defaults-file=" + s.cnf, "--datadir=" + dir + "/data", "--auth-root-authentication-method=normal", "--skip-test-db"}
	if s.user != "" {
		args = append(args, "--user="+s.user)
	}
	if out, err := exec.Command("mariadb-install-db", args...).CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, tail(string(out), 30))
	}
	s.start(t)
	// The UTC zone only (the harness's CONVERT_TZ needs it), not binlogged.
	tz, err := exec.Command("mariadb-tzinfo-to-sql", "--no-defaults", "/usr/share/zoneinfo/UTC", "UTC").Output()
	if err != nil {
		t.Fatalf("mariadb-tzinfo-to-sql: %v", err)
	}
	s.root(t, "SET SESSION sql_log_bin=0; USE mysql;\n"+string(tz))
	s.root(t, fmt.Sprintf(`SET SESSION sql_log_bin=0;
CREATE USER '%[1]s'@'127.0.0.1' IDENTIFIED BY '%[2]s';
GRANT ALL PRIVILEGES ON *.* TO '%[1]s'@'127.0.0.1' WITH GRANT OPTION;
RESET MASTER;`, f.env.MySQLUser, f.env.MySQLPassword))
	return s
}

func (s *privateMy) start(t *testing.T) {
	t.Helper()
	args := []string{"--defaults-file=" + s.cnf}
	if s.user != "" {
		args = append(args, "--user="+s.user)
	}
	cmd := exec.Command("/usr/sbin/mariadbd", args...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(s.exited)
	ok := testenv.WaitFor(60*time.Second, func() bool {
		select {
		case <-s.exited:
			return true
		default:
		}
		return exec.Command("mariadb-admin", "--no-defaults", "--socket="+s.sock, "-uroot", "--connect-timeout=1", "ping").Run() == nil
	})
	select {
	case <-s.exited:
		ok = false
	default:
	}
	if !ok {
		b, _ := os.ReadFile(filepath.Join(s.dir, "error.log"))
		t.Fatalf("mariadbd %d did not start:\n%s", s.ServerID, tail(string(b), 30))
	}
}

// root runs SQL as root over the socket with the mariadb client.
func (s *privateMy) root(t *testing.T, sql string) string {
	t.Helper()
	cmd := exec.Command("mariadb", "--no-defaults", "--socket="+s.sock, "-uroot", "-N", "-B")
	cmd.Stdin = strings.NewReader(sql)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("server %d: %s: %v\n%s", s.ServerID, sql, err, out)
	}
	return strings.TrimSpace(string(out))
}

// conn connects as the test user over TCP.
func (f *fixture) connPrivate(t *testing.T, s *privateMy) *client.Conn {
	t.Helper()
	c, err := client.Connect(s.Addr, f.env.MySQLUser, f.env.MySQLPassword, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// kill stops the server at once (SIGKILL: a crashed primary).
func (s *privateMy) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
	}
}

// replicateFrom makes s a replica of primary by GTID (slave_pos).
func (f *fixture) replicateFrom(t *testing.T, s, primary *privateMy) {
	t.Helper()
	host, port, _ := net.SplitHostPort(primary.Addr)
	s.root(t, fmt.Sprintf(`CHANGE MASTER TO MASTER_HOST='%s', MASTER_PORT=%s, MASTER_USER='%s', MASTER_PASSWORD='%s', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1;
START SLAVE;`, host, port, f.env.MySQLUser, f.env.MySQLPassword))
}

// waitReplicated waits until s has applied every transaction primary has.
func waitReplicated(t *testing.T, s, primary *privateMy) {
	t.Helper()
	pos := primary.root(t, "SELECT @@gtid_binlog_pos")
	got := s.root(t, fmt.Sprintf("SELECT MASTER_GTID_WAIT('%s', 60)", pos))
	if got != "0" {
		t.Fatalf("replica %d did not reach %s: MASTER_GTID_WAIT = %s; %s", s.ServerID, pos, got, s.root(t, "SHOW SLAVE STATUS\\G"))
	}
}

// promote turns a replica into a primary: replication stopped and
// forgotten, writes allowed.
func (s *privateMy) promote(t *testing.T) {
	t.Helper()
	s.root(t, "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0;")
}
