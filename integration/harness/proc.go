package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// BuildTidemark builds cmd/tidemark into a new temporary directory and
// returns the binary's path and a cleanup removing the directory: the
// integration suites run the real binary (a TestMain calls it once).
func BuildTidemark(prefix string) (string, func(), error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, fmt.Errorf("build tidemark: %w", err)
	}
	bin := filepath.Join(dir, "tidemark")
	build := exec.Command("go", "build", "-o", bin, "tidemark/cmd/tidemark")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("build tidemark: %w", err)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}

// LockedBuffer is a bytes sink safe for concurrent writes and reads: a
// daemon's stdout and stderr while the test reads its log.
type LockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *LockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *LockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
