package main

import (
	"context"
	"io"
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
