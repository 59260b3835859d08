package main

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
)

// cmdStatus runs `tidemark status args` as the binary does.
func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return execute(ctx, &statusCmd{cmdBase: cmdBase{name: "status", stdout: stdout, stderr: stderr}}, args, stderr)
}

// cmdVerify runs `tidemark verify args` with the verify section section
// returns of the config (none when nil).
func cmdVerify(ctx context.Context, args []string, stdout, stderr io.Writer, section func(*Config) VerifyConfig) int {
	return execute(ctx, &verifyCmd{cmdBase: cmdBase{name: "verify", stdout: stdout, stderr: stderr}, section: section}, args, stderr)
}

// TestEveryCommandDocumented: every command tidemark runs is in usage()
// and in the package doc (apply was missing from the doc), and a name
// that is not a command is none.
func TestEveryCommandDocumented(t *testing.T) {
	var u strings.Builder
	usage(&u)
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(src[:strings.Index(string(src), "package main")])
	for _, name := range []string{"run", "apply", "checkpoint", "catchup", "resync", "verify", "status", "doctor", "plan", "demo"} {
		if newCommand(name, io.Discard, io.Discard) == nil {
			t.Errorf("%s is not a command", name)
		}
		if !strings.Contains(u.String(), "\n  "+name+" ") {
			t.Errorf("usage() does not list %s", name)
		}
		if !strings.Contains(doc, "//\ttidemark "+name+" ") {
			t.Errorf("the package doc does not list %s", name)
		}
	}
	if c := newCommand("wire", io.Discard, io.Discard); c != nil {
		t.Errorf("newCommand(wire) = %T, want nil", c)
	}
}
