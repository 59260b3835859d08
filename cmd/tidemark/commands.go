package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
)

// command is one subcommand of tidemark, as a small struct (as
// litestream's commands are): parseFlags reads its flags and loads what it
// reads before opening anything; run opens only the parts it uses, closes
// them, and returns the exit code.
type command interface {
	// parseFlags parses args; an error is printed (unless it is
	// errPrinted) and the command exits 2.
	parseFlags(args []string) error
	run(ctx context.Context) int
}

// errPrinted is a parseFlags error the flag package has already printed.
var errPrinted = errors.New("flags: printed")

// execute parses c's flags and runs it.
func execute(ctx context.Context, c command, args []string, stderr io.Writer) int {
	if err := c.parseFlags(args); err != nil {
		if !errors.Is(err, errPrinted) {
			fmt.Fprintln(stderr, err)
		}
		return exitUsage
	}
	return c.run(ctx)
}

// cmdBase is what every command has: its name, its output, and, once
// parseConfig ran, the config and the command's logger.
type cmdBase struct {
	name           string
	stdout, stderr io.Writer
	cfg            *Config
	log            *slog.Logger
}

// parseConfig parses --config plus the flags extra adds, loads the config
// and sets up the command's logger (log.* of the config, on stderr).
func (b *cmdBase) parseConfig(args []string, extra func(*flag.FlagSet)) error {
	fs := flag.NewFlagSet(b.name, flag.ContinueOnError)
	fs.SetOutput(b.stderr)
	path := fs.String("config", "tidemark.yaml", "path to the YAML config")
	if extra != nil {
		extra(fs)
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("tidemark: %w", err)
	}
	cfg, err := LoadConfig(*path)
	if err != nil {
		return fmt.Errorf("tidemark: %w", err)
	}
	b.cfg = cfg
	b.setLogger(cfg.Log)
	return nil
}

// setLogger sets the command's logger: the one place a logger is made.
func (b *cmdBase) setLogger(lc LogConfig) {
	b.log = newLogger(lc, b.stderr)
}

// startFailed ends a daemon whose start-up returned err. A start-up cut
// short by SIGINT or SIGTERM (ctx ended and err is that cancellation) is
// not a failure: nothing was applied yet, so it is a clean stop (exit 0),
// as it is once the daemon runs. Any other error is "start failed" (exit 1).
func startFailed(ctx context.Context, log *slog.Logger, err error) int {
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		log.Info("stopped cleanly", "during", "start-up")
		return exitOK
	}
	log.Error("start failed", "err", err)
	return exitFailed
}

// fail logs msg ("start failed", "plan failed"…) with err and returns
// exitFailed.
func (b *cmdBase) fail(msg string, err error) int {
	b.log.Error(msg, "err", err)
	return exitFailed
}

// openSourceAndState opens a one-shot command's source parts (use) and its
// state target (mode) on cl. When that fails it has said why, ok is false
// and exit is the exit code: 2 for the source's config, 1 when the target
// cannot be opened ("<command> failed").
func (b *cmdBase) openSourceAndState(ctx context.Context, use sourceParts, mode openMode, cl *closers) (src *source, state stateTarget, exit int, ok bool) {
	src, err := openSource(b.cfg, b.log, use, cl)
	if err != nil {
		fmt.Fprintln(b.stderr, "tidemark:", err)
		return nil, stateTarget{}, exitUsage, false
	}
	if state, err = openStateTarget(ctx, b.cfg, b.log, mode, cl); err != nil {
		return nil, stateTarget{}, b.fail(b.name+" failed", err), false
	}
	return src, state, exitOK, true
}

// checkpointCmd is `tidemark checkpoint`: it prints the checkpoint the
// pipeline's target holds (the older of PostgreSQL's and Kafka's in a
// fan-out). It opens the targets only, not the source.
type checkpointCmd struct {
	cmdBase
}

func (c *checkpointCmd) parseFlags(args []string) error { return c.parseConfig(args, nil) }

func (c *checkpointCmd) run(ctx context.Context) int {
	var cl closers
	defer cl.close()
	_, target, err := openPipelineTarget(ctx, c.cfg, c.log, openDaemon, &cl)
	if err != nil {
		return c.fail("start failed", err)
	}
	pos, ok, err := target.Checkpoint(ctx, c.cfg.Source.Name)
	if err != nil {
		return c.fail("read checkpoint failed", err)
	}
	if !ok {
		fmt.Fprintln(c.stdout, "no checkpoint for source", c.cfg.Source.Name)
		return exitOK
	}
	fmt.Fprintln(c.stdout, pos.String())
	return exitOK
}
