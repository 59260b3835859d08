package nemesis

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// dimensions are the values each dimension of a campaign can draw; the CI
// seed set must draw every one of them.
func dimensions() map[string][]string {
	var fams []string
	for _, f := range families {
		fams = append(fams, f.name)
	}
	var legacy []string
	for _, f := range legacyFamilies {
		legacy = append(legacy, f.name)
	}
	return map[string][]string{
		"topology":             {"pg", "apply", "fanout"},
		"apply.members":        {"1", "2", "3"},
		"standby":              {"true", "false"},
		"delete_mode":          {"hard", "soft"},
		"mirror.indexes":       {"true", "false"},
		"mirror.not_null":      {"true", "false"},
		"version":              {"gtid", "filepos"},
		"dedupe":               {"true", "false"},
		"fallback":             {"true", "false"},
		"fallback.keydiff":     {"true", "false"},
		"batch":                {"default", "5", "40", "300"},
		"ddl.drop_table":       {"refuse", "apply"},
		"source.time_zone":     {"UTC", "America/New_York", "Europe/Berlin"},
		"start":                {"stream", "snapshot"},
		"kill_during_snapshot": {"true", "false"},
		"shape":                shapes,
		"business_keys":        {"true", "false"},
		"family":               fams,
		"tx":                   {"insert", "insert_multi", "update", "update_key", "delete", "hot_key", "mixed", "xa", "big", "delete_many"},
		"ddl":                  {"add_column", "add_column_default", "drop_column", "rename_column", "modify_column", "add_index", "drop_index", "add_unique", "truncate", "cutover", "drop_create", "resync"},
		"legacy_charset":       legacy,
		"long_name":            {"true", "false"},
		"large_table":          {"true", "false"},
		"kill_deletes":         {"true", "false"},
		"ext_fault":            {"lock_session_kill", "checkpoint_delete", "nul_byte", "gtid_backwards"},
		"fault": {"kill9_tailer", "stopcont_tailer", "kill9_standby", "kill9_applier", "stopcont_applier", "pg_restart", "mariadb_restart",
			"net_reset", "net_latency", "net_blackhole", "purge_while_down", "kafka_restart", "partitions_increase"},
	}
}

var tableDraw = regexp.MustCompile(`^t\d+\.(shape|business_keys|c\d+)$`)

// covered is the set of dimension=value a campaign drew.
func covered(c *campaign) map[string]bool {
	out := map[string]bool{}
	for _, d := range c.draws {
		k, v, _ := strings.Cut(d, "=")
		k = strings.TrimPrefix(k, "+")
		v, _, _ = strings.Cut(v, " ")
		switch {
		case tableDraw.MatchString(k):
			k = strings.SplitN(k, ".", 2)[1]
			if strings.HasPrefix(k, "c") {
				k = "family"
			}
		case k == "family" || k == "new_shape":
			k = map[string]string{"family": "family", "new_shape": "shape"}[k]
		case k == "batch.max_changes#":
			k, v = "batch", []string{"default", "5", "40", "300"}[atoi(v)]
		}
		out[k+"="+v] = true
	}
	return out
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// cost estimates a campaign's wall time from its draws: rows written and
// slow faults.
func cost(c *campaign) int {
	n := 0
	for _, d := range c.draws {
		k, v, _ := strings.Cut(d, "=")
		switch strings.TrimPrefix(k, "+") {
		case "large_rows":
			n += atoi(v) / 40
		case "ext_fault":
			n += map[string]int{"checkpoint_delete": 60}[v] + 20
		case "rows":
			_, r, _ := strings.Cut(v, ":")
			n += atoi(r) / 20
		case "tx":
			n++
		case "fault":
			n += map[string]int{"kafka_restart": 600, "pg_restart": 60, "mariadb_restart": 60, "purge_while_down": 40, "net_blackhole": 80}[v] + 20
		case "ddl":
			n += map[string]int{"resync": 60, "cutover": 40}[v] + 10
		}
	}
	return n
}

// missing lists the dimension values no campaign of seeds draws.
func missing(t *testing.T, seeds []uint64) []string {
	got := map[string]bool{}
	for _, s := range seeds {
		for k := range covered(dryRun(t, s)) {
			got[k] = true
		}
	}
	var miss []string
	for dim, vals := range dimensions() {
		for _, v := range vals {
			if !got[dim+"="+v] {
				miss = append(miss, dim+"="+v)
			}
		}
	}
	sort.Strings(miss)
	return miss
}

// notInCI are the dimension values the CI seeds may leave out, and why:
// only while every seed that draws them fails on main (knownFailing).
var notInCI = map[string]string{}

// TestCISeedsCoverEveryDimension: the CI seed set draws every value of
// every dimension (dry runs: the draws without the servers).
func TestCISeedsCoverEveryDimension(t *testing.T) {
	var miss []string
	for _, m := range missing(t, ciSeeds) {
		if why, ok := notInCI[m]; ok {
			t.Logf("%s: not in the CI seeds: %s", m, why)
			continue
		}
		miss = append(miss, m)
	}
	if len(miss) > 0 {
		t.Fatalf("the CI seeds %v draw none of: %s (choose seeds with NEMESIS_CHOOSE=1 go test -run TestChooseSeeds -v ./integration/nemesis/)", ciSeeds, strings.Join(miss, ", "))
	}
}

// TestDrawsAreReproducible: the same seed draws the same campaign.
func TestDrawsAreReproducible(t *testing.T) {
	a, b := dryRun(t, 42), dryRun(t, 42)
	if strings.Join(a.draws, " ") != strings.Join(b.draws, " ") {
		t.Fatal("seed 42 drew two different campaigns")
	}
	if c := dryRun(t, 43); strings.Join(a.draws, " ") == strings.Join(c.draws, " ") {
		t.Fatal("seeds 42 and 43 drew the same campaign")
	}
}

// TestChooseSeeds (NEMESIS_CHOOSE=1) picks a small, cheap seed set that
// covers every dimension, greedily from seeds 1..NEMESIS_CHOOSE_N, leaving
// out the seeds whose draws hit a known finding (NEMESIS_AVOID: a
// comma-separated list of regular expressions on the plan's draws).
func TestChooseSeeds(t *testing.T) {
	if os.Getenv("NEMESIS_CHOOSE") == "" {
		t.Skip("a tool: NEMESIS_CHOOSE=1 go test -run TestChooseSeeds -v ./integration/nemesis/")
	}
	n := 3000
	if s := os.Getenv("NEMESIS_CHOOSE_N"); s != "" {
		n = atoi(s)
	}
	var avoid []*regexp.Regexp
	for _, a := range strings.Split(os.Getenv("NEMESIS_AVOID"), ",") {
		if a != "" {
			avoid = append(avoid, regexp.MustCompile(a))
		}
	}
	// NEMESIS_MATCH lists the seeds whose draws match a regular expression
	// (to find campaigns that reach a given combination).
	var match *regexp.Regexp
	if m := os.Getenv("NEMESIS_MATCH"); m != "" {
		match = regexp.MustCompile(m)
	}
	var matched []uint64
	type cand struct {
		seed uint64
		cov  map[string]bool
		cost int
	}
	var cands []cand
	for s := uint64(1); s <= uint64(n); s++ {
		c := dryRun(t, s)
		plan := strings.Join(c.draws, " ")
		skip := false
		for _, re := range avoid {
			if re.MatchString(plan) {
				skip = true
			}
		}
		if !skip {
			cands = append(cands, cand{s, covered(c), cost(c)})
		}
		if match != nil && !skip && match.MatchString(plan) {
			matched = append(matched, s)
		}
	}
	need := map[string]bool{}
	for dim, vals := range dimensions() {
		for _, v := range vals {
			need[dim+"="+v] = true
		}
	}
	var chosen []uint64
	total := 0
	// NEMESIS_HAVE: seeds already chosen (their coverage is not needed again).
	for _, f := range strings.Split(os.Getenv("NEMESIS_HAVE"), ",") {
		if f != "" {
			for k := range covered(dryRun(t, uint64(atoi(f)))) {
				delete(need, k)
			}
		}
	}
	for len(need) > 0 {
		best, bestScore := -1, 0.0
		for i, c := range cands {
			gain := 0
			for k := range c.cov {
				if need[k] {
					gain++
				}
			}
			if score := float64(gain) / float64(c.cost+200); gain > 0 && score > bestScore {
				best, bestScore = i, score
			}
		}
		if best < 0 {
			break
		}
		for k := range cands[best].cov {
			delete(need, k)
		}
		chosen = append(chosen, cands[best].seed)
		total += cands[best].cost
	}
	var left []string
	for k := range need {
		left = append(left, k)
	}
	sort.Strings(left)
	if match != nil {
		t.Logf("seeds matching %s: %v", match, matched)
	}
	t.Logf("chosen %d seeds (cost %d): %s; not covered: %v", len(chosen), total, strings.Trim(fmt.Sprint(chosen), "[]"), left)
}
