package integration

// Restarting the shared local servers (scripts/services.sh) from a test:
// PostgreSQL with pg_ctl (as the postgres user when running as root),
// MariaDB by re-running the exact command line of its running mariadbd.
// Packages run one at a time (go test -p 1), so no other package's test
// sees the restart; every helper leaves the server up, also on failure
// (t.Cleanup).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"tidemark/internal/testenv"
)

// pgServer is the local PostgreSQL's data directory and binaries.
type pgServer struct {
	dataDir, binDir, logFile string
}

func (f *fixture) pgServer(t *testing.T) *pgServer {
	t.Helper()
	s := &pgServer{}
	if err := f.pg.QueryRow(f.ctx, "SELECT current_setting('data_directory'), (SELECT setting FROM pg_config WHERE name = 'BINDIR')").Scan(&s.dataDir, &s.binDir); err != nil {
		t.Fatalf("locate the PostgreSQL data directory (the test user must be a superuser): %v", err)
	}
	s.logFile = filepath.Join(filepath.Dir(s.dataDir), "log", "postgresql.log")
	if _, err := os.Stat(filepath.Dir(s.logFile)); err != nil {
		s.logFile = "/dev/null"
	}
	t.Cleanup(func() {
		// Leave it running whatever happened.
		if _, err := dialPG(context.Background(), f.env, 2*time.Second); err != nil {
			_ = s.ctl("start")
		}
	})
	return s
}

func (s *pgServer) ctl(args ...string) error {
	argv := append([]string{filepath.Join(s.binDir, "pg_ctl"), "-D", s.dataDir, "-l", s.logFile, "-w", "-t", "60"}, args...)
	if os.Geteuid() == 0 {
		argv = append([]string{"runuser", "-u", "postgres", "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return nil
}

// restartImmediate runs pg_ctl restart -m immediate: every backend dies at
// once, without a checkpoint, and the server runs crash recovery.
func (s *pgServer) restartImmediate(t *testing.T) time.Duration {
	t.Helper()
	start := time.Now()
	if err := s.ctl("-m", "immediate", "restart"); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

// myServer is the local mariadbd: its pid and command line.
type myServer struct {
	f       *fixture
	pid     int
	argv    []string
	pidFile string
}

func (f *fixture) myServer(t *testing.T) *myServer {
	t.Helper()
	r, err := f.my.Execute("SELECT @@pid_file")
	if err != nil {
		t.Fatal(err)
	}
	pidFile, _ := r.GetString(0, 0)
	s := &myServer{f: f, pidFile: pidFile}
	if err := s.load(); err != nil {
		t.Fatalf("locate the running mariadbd: %v", err)
	}
	t.Cleanup(func() {
		if _, err := dialMy(f.env, 2*time.Second); err != nil {
			_ = s.start(60 * time.Second)
		}
	})
	return s
}

func (s *myServer) load() error {
	b, err := os.ReadFile(s.pidFile)
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("pid file %s: %w", s.pidFile, err)
	}
	cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return fmt.Errorf("command line of mariadbd (pid %d): %w", pid, err)
	}
	s.pid = pid
	s.argv = strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")
	return nil
}

func (s *myServer) alive() bool { return syscall.Kill(s.pid, 0) == nil && procRunning(s.pid) }

func procRunning(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie ("Z") has exited.
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

// restart stops mariadbd (kill: SIGKILL, a crash; otherwise SHUTDOWN, a
// clean stop) and starts it again with the same command line. It returns
// how long the server was unavailable.
func (s *myServer) restart(t *testing.T, kill bool) time.Duration {
	t.Helper()
	start := time.Now()
	if kill {
		if err := syscall.Kill(s.pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	} else {
		c, err := s.f.env.MySQL()
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Execute("SHUTDOWN")
		c.Close()
	}
	if !testenv.WaitFor(60*time.Second, func() bool { return !s.alive() }) {
		t.Fatalf("mariadbd (pid %d) did not stop", s.pid)
	}
	if err := s.start(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

func (s *myServer) start(timeout time.Duration) error {
	cmd := exec.Command(s.argv[0], s.argv[1:]...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start mariadbd: %w", err)
	}
	go func() { _ = cmd.Wait() }()
	c, err := dialMy(s.f.env, timeout)
	if err != nil {
		return fmt.Errorf("mariadbd did not accept connections after a restart: %w", err)
	}
	c.Close()
	s.pid = cmd.Process.Pid
	return nil
}
