// Command tidemark is a change-data-capture daemon: it tails a MySQL or
// MariaDB binlog and applies UTC-normalized, version-guarded changes to
// PostgreSQL, committing each batch with its checkpoint.
//
// Usage:
//
//	tidemark run --config tidemark.yaml   replicate until SIGINT/SIGTERM
//	tidemark apply --config F             a member of the apply group (Kafka → PostgreSQL)
//	tidemark checkpoint --config F        print the stored checkpoint
//	tidemark catchup --config F [--table] catch up with bounded reads
//	tidemark resync --config F --table T  re-snapshot a (quarantined) table
//	tidemark verify --config F            compare source and target in-database
//	tidemark status --config F            positions, retention headroom, lag
//	tidemark doctor --config F            check every source/target prerequisite
//	tidemark plan --config F              print the target DDL, run nothing
//	tidemark demo                         run the demo on the local services
//	tidemark version                      print the version
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"syscall"
	_ "time/tzdata" // time zones work on a machine without zoneinfo
)

// version and commit are set with -ldflags "-X main.version=… -X
// main.commit=…" (make build, deploy/Containerfile). Without commit, the
// VCS revision Go stamps into the build (go build in a git checkout) is
// used.
var (
	version = "dev"
	commit  = ""
)

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

func main() {
	tuneGC()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// tuneGC trades memory the pipeline bounds anyway for CPU the database
// needs: GOGC=400 with a 200 MiB soft limit, unless GOGC / GOMEMLIMIT are
// set in the environment. The live heap is bounded (chunks, one batch, a
// small decode cache), so the limit is only approached under bursts.
func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(200 << 20)
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, `usage: tidemark <command> [flags]

commands:
  run --config FILE          replicate until SIGINT/SIGTERM, then commit what was read and exit 0
                             (with an apply section: the source's tailer, publishing to Kafka)
  apply --config FILE        a member of the apply group: Kafka change topics → PostgreSQL
  checkpoint --config FILE   print the checkpoint stored in the target
  catchup --config FILE [--table db.t]...
                             catch up with bounded reads (all tables: moves the checkpoint;
                             run it while the daemon is stopped)
  resync --config FILE --table db.t [--wait 30m]
                             re-snapshot a table (e.g. a quarantined one) and stream it again;
                             asks the running daemon, or does it itself when none runs
  verify --config FILE [--table db.t]... [--since 24h] [--json]
                             compare source and target; exit 0 equal, 1 different, 2 error
  doctor --config FILE       check every prerequisite of source and target (ok / warn / fix);
                             exit 0 when nothing needs a fix, 1 otherwise
  status --config FILE [--json]
                             checkpoint, binlog retention headroom, per-table watermark/mode/lag
  plan --config FILE         print the DDL tidemark would run on the target (tables, NOT NULL,
                             mirrored indexes) without running it
  demo                       replicate a demo workload on the local services (make demo)
  version                    print the version`)
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "version", "--version":
		fmt.Fprintln(stdout, "tidemark", buildVersion())
		return exitOK
	case "help", "-h", "--help":
		usage(stdout)
		return exitOK
	}
	c := newCommand(args[0], stdout, stderr)
	if c == nil {
		fmt.Fprintf(stderr, "tidemark: unknown command %q\n", args[0])
		usage(stderr)
		return exitUsage
	}
	return execute(ctx, c, args[1:], stderr)
}

// newCommand returns the command name names, nil for an unknown one.
func newCommand(name string, stdout, stderr io.Writer) command {
	b := cmdBase{name: name, stdout: stdout, stderr: stderr}
	switch name {
	case "run":
		return &runCmd{cmdBase: b}
	case "apply":
		return &applyCmd{cmdBase: b}
	case "checkpoint":
		return &checkpointCmd{cmdBase: b}
	case "catchup":
		return &catchupCmd{cmdBase: b}
	case "resync":
		return &resyncCmd{cmdBase: b}
	case "verify":
		return &verifyCmd{cmdBase: b, section: func(c *Config) VerifyConfig { return c.Verify }}
	case "status":
		return &statusCmd{cmdBase: b}
	case "doctor":
		return &doctorCmd{cmdBase: b}
	case "plan":
		return &planCmd{cmdBase: b}
	case "demo":
		return &demoCmd{cmdBase: b}
	}
	return nil
}

func buildVersion() string {
	var settings []debug.BuildSetting
	goVersion := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		settings, goVersion = bi.Settings, bi.GoVersion
	}
	return formatVersion(version, commit, settings, goVersion)
}

// formatVersion is "<version> (<commit, 12 digits>[, modified]) <go
// version>": the commit from -ldflags, else vcs.revision; "unknown commit"
// when neither is there.
func formatVersion(version, commit string, settings []debug.BuildSetting, goVersion string) string {
	modified := false
	if commit == "" {
		for _, s := range settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	v := version
	switch {
	case commit == "":
		v += " (unknown commit)"
	case modified:
		v += " (" + commit[:min(12, len(commit))] + ", modified)"
	default:
		v += " (" + commit[:min(12, len(commit))] + ")"
	}
	if goVersion != "" {
		v += " " + goVersion
	}
	return v
}

func newLogger(cfg LogConfig, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.level()))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// startCPUProfile writes a CPU profile to path until the returned function
// is called.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create CPU profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("start CPU profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// startProfile samples every blocking event (name "block") or every mutex
// contention ("mutex") until the returned function writes the profile to
// path.
func startProfile(name, path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create %s profile: %w", name, err)
	}
	if name == "block" {
		runtime.SetBlockProfileRate(1)
	} else {
		runtime.SetMutexProfileFraction(1)
	}
	return func() {
		if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
			fmt.Fprintf(os.Stderr, "tidemark: write %s profile: %v\n", name, err)
		}
		f.Close()
	}, nil
}
