package verify

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsOnlyRoot: verify depends on the root package and the standard
// library only; the two sides are reached through the root's interfaces
// (tidemark.SourceVerifier, TargetVerifier, AssertTarget), never by
// importing binlog or sink/postgres.
func TestImportsOnlyRoot(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list -deps listed nothing")
	}
	for _, d := range deps {
		if d != "tidemark" && d != "tidemark/verify" {
			t.Errorf("verify depends on %s (only the root package and the standard library are allowed)", d)
		}
	}
}
