package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// testLibraries are modules the integration tests use that the daemon
// must not link: network-fault injection (toxiproxy and what it pulls in:
// gorilla/mux, zerolog), vitess (the MySQL 8 test server), the test
// harness itself, the test environment (internal/testenv) and the standard
// library's testing packages.
var testLibraries = []string{
	"github.com/Shopify/toxiproxy",
	"github.com/gorilla/mux",
	"github.com/rs/zerolog",
	"vitess.io/vitess",
	"tidemark/integration",
	"tidemark/internal/testenv",
	"testing",
}

// TestBinaryLinksNoTestCode: `go list -deps ./cmd/tidemark` (the packages
// the production binary links, tests excluded) holds none of the test
// libraries. The demo once imported integration/harness and pulled
// toxiproxy, gorilla/mux and zerolog into the binary.
func TestBinaryLinksNoTestCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 || !slices.Contains(deps, "tidemark/binlog") {
		t.Fatalf("go list -deps listed %d packages, not the binary's: %q", len(deps), out)
	}
	if bad := linked(deps, testLibraries); len(bad) > 0 {
		t.Fatalf("the tidemark binary links test code: %s", strings.Join(bad, ", "))
	}
}

// linked returns the packages of deps under one of the module paths.
func linked(deps, modules []string) []string {
	var bad []string
	for _, d := range deps {
		for _, m := range modules {
			if d == m || strings.HasPrefix(d, m+"/") {
				bad = append(bad, d)
			}
		}
	}
	return bad
}
