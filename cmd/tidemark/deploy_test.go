package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"sort"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"tidemark"
)

// The files in deploy/: the Prometheus alert rules pass `promtool check
// rules` and their unit tests (`promtool test rules`: each alert fires on
// the series that should fire it); every metric the rules and the Grafana
// dashboard name is one the daemon registers and docs/metrics.md lists.

const deployDir = "../../deploy"

func TestAlertRulesPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (Debian package prometheus; scripts/services.sh up installs it): %v", err)
	}
	dir := filepath.Join(deployDir, "prometheus")
	for _, args := range [][]string{{"check", "rules", "tidemark-alerts.yml"}, {"test", "rules", "tidemark-alerts.test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// daemonMetricNames returns the metric names a running daemon exposes
// (every collector fed once).
func daemonMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	m := NewMetrics()
	tbl := &tidemark.Table{ID: tidemark.TableID{Database: "db", Name: "t"}}
	m.OnApply(&tidemark.Batch{Changes: []tidemark.Change{{Table: tbl, Op: tidemark.OpInsert, CommitTime: time.Now()}}}, tidemark.ApplyStats{Inserted: 1}, time.Millisecond)
	m.FallbackRun(map[string]int64{"db.t": 1})
	m.Error(os.ErrClosed)
	m.SetVerify(tidemark.VerifyRun{Tables: 1, FinishedAt: time.Now()})
	m.WatchDedupe(func(f func(string, uint64)) { f("seen", 1); f("keys", 1) })
	m.WatchDirectInserts(func() (int64, int64) { return 1, 0 })
	m.WatchTableStates()(tidemark.TableState{Table: tbl.ID, Mode: tidemark.TableStreaming})
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range fams {
		names[f.GetName()] = true
	}
	return names
}

var metricRE = regexp.MustCompile(`\btidemark_[a-z0-9_]+`)

// baseName strips the series suffixes of histograms.
func baseName(n string, known map[string]bool) string {
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(n, s); ok && known[b] {
			return b
		}
	}
	return n
}

func TestDeployMetricsExist(t *testing.T) {
	known := daemonMetricNames(t)
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, n := range regexp.MustCompile("`(tidemark_[a-z0-9_]+)`").FindAllStringSubmatch(string(doc), -1) {
		documented[n[1]] = true
	}
	// The exprs of the alert rules.
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert, Record, Expr string
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(deployDir, "prometheus", "tidemark-alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatalf("alert rules: %v", err)
	}
	exprs := map[string]string{}
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs["rule "+r.Alert+r.Record] = r.Expr
			alerts[r.Alert] = true
		}
	}
	for _, want := range []string{"TidemarkLagOverBudget", "TidemarkRetentionHeadroomUnderLagBudget", "TidemarkTableQuarantined", "TidemarkVerifyMismatch", "TidemarkApplyErrors"} {
		if !alerts[want] {
			t.Errorf("alert rules lack %s", want)
		}
	}
	// The targets of the dashboard's panels.
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Name  string
				Query any
			}
		}
	}
	b, err = os.ReadFile(filepath.Join(deployDir, "grafana", "tidemark-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	if len(dash.Panels) == 0 {
		t.Fatal("dashboard has no panels")
	}
	for _, p := range dash.Panels {
		for i, tg := range p.Targets {
			exprs["panel "+p.Title+" #"+string(rune('A'+i))] = tg.Expr
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok {
			exprs["variable "+v.Name] = q
		}
	}
	used := map[string]bool{}
	for where, e := range exprs {
		for _, n := range metricRE.FindAllString(e, -1) {
			n = baseName(n, known)
			used[n] = true
			if !known[n] {
				t.Errorf("%s names %s, which the daemon does not export", where, n)
			}
			if !documented[n] {
				t.Errorf("%s names %s, which docs/metrics.md does not list", where, n)
			}
		}
	}
	var names []string
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	t.Logf("metrics used by deploy/: %s", strings.Join(names, " "))
}

func TestFormatVersion(t *testing.T) {
	vcs := []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "false"}}
	cases := []struct {
		version, commit string
		settings        []debug.BuildSetting
		want            string
	}{
		{"v1.2.0", "fedcba9876543210", vcs, "v1.2.0 (fedcba987654) go1.26"},
		{"dev", "", vcs, "dev (0123456789ab) go1.26"},
		{"dev", "", append(vcs[:1:1], debug.BuildSetting{Key: "vcs.modified", Value: "true"}), "dev (0123456789ab, modified) go1.26"},
		{"dev", "", nil, "dev (unknown commit) go1.26"},
		{"dev", "abc", nil, "dev (abc) go1.26"},
	}
	for _, c := range cases {
		if got := formatVersion(c.version, c.commit, c.settings, "go1.26"); got != c.want {
			t.Errorf("formatVersion(%q, %q, %v) = %q, want %q", c.version, c.commit, c.settings, got, c.want)
		}
	}
}
