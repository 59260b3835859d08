package tidemark_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// allowedImports are the exceptions to the import rule, each with its
// reason: product package → the tidemark packages it may import besides
// the root.
var allowedImports = map[string][]string{
	// The PostgreSQL control state is checkpoint's room: the sink writes
	// it in its own transactions, under checkpoint's DDL lock, in
	// checkpoint's schema (docs/ARCHITECTURE.md, "The one exception").
	// checkpoint itself imports only the root, so the edge is one way.
	"tidemark/sink/postgres": {"tidemark/checkpoint"},
}

// TestImportRule: the root package depends on the standard library only;
// every product package (the packages outside cmd/, integration/ and
// internal/) depends on the root and the standard library and third-party
// libraries, never on another product package (ARCHITECTURE.md: only cmd/
// and integration/ wire them); internal/testenv depends on no tidemark
// package at all, so that every package's tests can use it. Non-test
// dependencies only: tests may import across.
func TestImportRule(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Deps \" \"}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var checked []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, deps := f[0], f[1:]
		var allowed []string
		switch {
		case pkg == "tidemark":
			allowed = []string{}
		case pkg == "tidemark/internal/testenv":
			allowed = []string{}
		case strings.HasPrefix(pkg, "tidemark/cmd/"), strings.HasPrefix(pkg, "tidemark/integration"), strings.HasPrefix(pkg, "tidemark/internal/"):
			continue
		default:
			allowed = append([]string{"tidemark"}, allowedImports[pkg]...)
		}
		checked = append(checked, pkg)
		for _, d := range deps {
			if d == "tidemark" || strings.HasPrefix(d, "tidemark/") {
				if !slices.Contains(allowed, d) {
					t.Errorf("%s depends on %s: %s", pkg, d, rule(pkg))
				}
			} else if pkg == "tidemark" && strings.Contains(strings.Split(d, "/")[0], ".") {
				t.Errorf("the root package depends on %s: it may import the standard library only", d)
			}
		}
	}
	// The rule must have been applied, not skipped by a go list that
	// listed nothing.
	for _, want := range []string{"tidemark", "tidemark/binlog", "tidemark/checkpoint", "tidemark/dedupe", "tidemark/fallback",
		"tidemark/metrics", "tidemark/sink/kafka", "tidemark/sink/postgres", "tidemark/status", "tidemark/verify", "tidemark/internal/testenv"} {
		if !slices.Contains(checked, want) {
			t.Errorf("go list did not list %s; checked %q", want, checked)
		}
	}
}

func rule(pkg string) string {
	switch pkg {
	case "tidemark":
		return "the root package imports the standard library only"
	case "tidemark/internal/testenv":
		return "the test environment imports no tidemark package (the root's own tests use it)"
	}
	return "a product package imports only the root (and libraries); cmd/ and integration/ wire product packages together"
}
