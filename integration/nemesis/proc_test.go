package nemesis

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"tidemark/integration/harness"
)

// proc is one running tidemark process (run, apply or resync) of a
// campaign. Its stderr is kept for the judge and the failure report.
type proc struct {
	role   string // "tailer", "standby", "applier 2", …
	args   []string
	cmd    *exec.Cmd
	log    *harness.LockedBuffer
	waited chan struct{}
	// killed is set when the campaign ended the process on purpose (its
	// exit status is then not a finding).
	killed  bool
	stopped bool // SIGSTOPped
	// documented is the documented stop the campaign answered by starting
	// the process again, as the error said to (restartPartitionStops): not
	// a finding either.
	documented string
}

func (c *campaign) start(role string, args ...string) *proc {
	if c.dry {
		return &proc{role: role, waited: make(chan struct{})}
	}
	cmd := exec.Command(binPath, args...)
	cmd.Env = append(os.Environ(), "NM_MYSQL_PASSWORD="+c.env.MySQLPassword, "NM_PG_DSN="+c.env.PGDSN)
	p := &proc{role: role, args: args, cmd: cmd, log: &harness.LockedBuffer{}, waited: make(chan struct{})}
	cmd.Stderr, cmd.Stdout = p.log, p.log
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start %s: %v", role, err)
	}
	go func() { _ = cmd.Wait(); close(p.waited) }()
	c.procs = append(c.procs, p)
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.waited:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill() {
	p.killed = true
	if p.cmd == nil {
		return
	}
	if p.stopped {
		p.cont()
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.waited
}

func (p *proc) stop() {
	if p.cmd != nil && !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGSTOP)
		p.stopped = true
	}
}

func (p *proc) cont() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	p.stopped = false
}

// term sends SIGTERM and returns the exit code (-1 when it had to be
// killed after timeout).
func (p *proc) term(timeout time.Duration) int {
	if p.exited() {
		return p.cmd.ProcessState.ExitCode()
	}
	if p.stopped {
		p.cont()
	}
	// A signal before the daemon installed its handler would kill it.
	deadline := time.Now().Add(30 * time.Second)
	for !p.exited() && !strings.Contains(p.log.String(), "msg=starting") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.waited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		p.kill()
		return -1
	}
}

// runCmd runs a short tidemark command (resync, status) and returns its exit
// code and output.
func (c *campaign) runCmd(timeout time.Duration, args ...string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	cmd.Env = append(os.Environ(), "NM_MYSQL_PASSWORD="+c.env.MySQLPassword, "NM_PG_DSN="+c.env.PGDSN)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	code := -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	c.cmdsMu.Lock()
	c.cmds = append(c.cmds, fmt.Sprintf("=== %s (%s → %s, exit %d)\n%s", strings.Join(args, " "),
		start.UTC().Format("15:04:05.000"), time.Now().UTC().Format("15:04:05.000"), code, out))
	c.cmdsMu.Unlock()
	if err != nil && cmd.ProcessState == nil {
		return -1, fmt.Sprintf("%s: %v", strings.Join(args, " "), err)
	}
	return code, string(out)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
