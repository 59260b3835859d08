package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestReplaceSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "PERFORMANCE.md")
	if err := os.WriteFile(path, []byte("# Performance\n\nhand-written summary\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	steps := []struct{ name, body string }{
		{"main", "main 1\n"},
		{"peers", "peers 1\n"},
		{"main", "main 2\n"}, // replaces main 1 in place
	}
	for _, s := range steps {
		if err := replaceSection(path, s.name, s.body); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "# Performance\n\nhand-written summary\n\n" +
		"<!-- bench:main -->\nmain 2\n<!-- /bench:main -->\n\n" +
		"<!-- bench:peers -->\npeers 1\n<!-- /bench:peers -->\n"
	if string(got) != want {
		t.Fatalf("report:\n%s\nwant:\n%s", got, want)
	}
}

// A child's VmHWM is its own: a child that touches 64 MiB reports at
// least that, and this process's figure is not what it reports.
func TestVmHWMOfChild(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc on this system")
	}
	cmd := exec.Command("python3", "-c", "import sys,time; b = bytearray(64 << 20); sys.stdout.write('x'); sys.stdout.flush(); time.sleep(2)")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("python3 not available: %v", err)
	}
	w := watchRSS(cmd.Process.Pid)
	buf := make([]byte, 1)
	if _, err := out.Read(buf); err != nil {
		t.Fatal(err)
	}
	direct, err := vmHWM(strconv.Itoa(cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	peak := w.Peak()
	if direct < 64<<10 || peak < direct {
		t.Fatalf("VmHWM of a child holding 64 MiB: direct %d KiB, watched peak %d KiB", direct, peak)
	}
	if self, _ := vmHWM("self"); strings.TrimSpace(strconv.FormatInt(self, 10)) == "" {
		t.Fatal("no VmHWM for self")
	}
}

func TestMedianOf(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {[]float64{7}, 7}} {
		if got := medianOf(c.in); got != c.want {
			t.Errorf("medianOf(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// A tool that runs as a tree of processes (pg_chameleon: runuser, then
// python) is measured over the whole tree: a grandchild that touches
// 64 MiB counts, though the process started holds little of it.
func TestTreeRSSCountsDescendants(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc on this system")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not available")
	}
	// sh forks python (the "; true" keeps it from exec'ing it).
	cmd := exec.Command("sh", "-c", `python3 -c "import sys,time; b = bytearray(64 << 20); sys.stdout.write('x'); sys.stdout.flush(); time.sleep(2)"; true`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := watchTree(cmd.Process.Pid)
	buf := make([]byte, 1)
	if _, err := out.Read(buf); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // a few samples while python holds it
	own, err := vmHWM(strconv.Itoa(cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	peak := w.Peak()
	if own >= 64<<10 {
		t.Fatalf("sh itself holds %d KiB: the test does not tell a tree from a process", own)
	}
	if peak < 64<<10 {
		t.Fatalf("peak RSS of a tree whose grandchild holds 64 MiB: %d KiB (sh alone: %d KiB)", peak, own)
	}
}
