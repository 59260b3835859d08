package nemesis

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"tidemark/integration/harness"
)

// ciSeeds is the fixed seed set of make test: together they draw every
// dimension the runner has (TestCISeedsCoverEveryDimension checks it).
// A seed that fails on main is not here but in knownFailing, until its fix
// lands.
var ciSeeds = []uint64{139, 233, 135, 247, 38, 6, 273, 274, 279, 262, 60, 15, 11, 49, 19, 9, 121, 219, 294, 31, 52, 3825, 34, 16, 793466660073}

// knownFailing maps seeds that fail on main to their finding (issue 22's
// numbers where it is one of them). They are replayed by
// `make nemesis SEED=…`, and move to ciSeeds when the fix lands.
var knownFailing = map[uint64]string{
	543902467764: "soak 2026-12-02 07:56 (4b19a1e; replayed on main at 08:12, fails again): apply topology, a first-run snapshot of a 36,808-row t0 while the campaign renames its column c4_text: the snapshot's chunk reads name the columns read before the rename and the tailer stops, exit 1: 'initial snapshot …: catch up ….t0: read ….t0: query source: ERROR 1054 (42S22): Unknown column 'c4_text' in 'SELECT''. A layout change of a table during its catch-up read (not a DROP or RENAME of the table, which are handled) is not followed",
	813317063702: "soak 2026-12-02 04:26 (main before f8a0fb2; failed 1 time, replays pass: 2 of 2 before, 2 of 2 on b4ba1ce, 33-57 s): scale-out, 2 appliers, 6 partitions, max_records 500, pg_restart then a resync of t0; the 150 s settle ended with t0 missing 8340 rows (t2 1644 and t3 17 missing, 6 t3 rows older, neither resynced), no error. Suspected: the appliers were still behind, not lost rows: ~50 changes/s from 04:23:30 on (one 500-record batch per ~10 s, both members), lag_records 999 and 1168 at stop, t0 partition 5's snapshot_end never applied, and partition 0's snapshot_end had removed 10293 rows that the lagging partitions' snapshot rows were still to bring back. Not ruled out: 8340 is more than one partition's ~2080 snapshot rows though partitions 1-4 had ended (their snapshot rows lost?). On f8a0fb2 it failed on the resync quarantine 'takes no snapshot boundaries' (fixed by b4ba1ce)",
	373601440737: "soak 2026-12-02 04:26 (main 7df0ef9): as 5's I5 part: checkpoint_delete after a MODIFY (run → PostgreSQL, hard deletes, version: filepos): the tables end equal and the replay writes t1's older layout into the widened table (no quarantine), but the I5 monitor saw 10 'insert after newer delete' (rows deleted before the newest checkpoint, tombstones pruned, re-inserted by the replay until the replayed delete)",
}

var binPath string

func TestMain(m *testing.M) {
	bin, cleanup, err := harness.BuildTidemark("tidemark-nemesis-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = bin
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// TestNemesis runs campaigns: the seeds of NEMESIS_SEEDS (comma-separated;
// make nemesis SEED=…), fresh random seeds for NEMESIS_SOAK (a duration;
// make soak DURATION=…), or else the CI seed set.
func TestNemesis(t *testing.T) {
	var tally soakTally
	defer func() { t.Log("\n" + tally.table()) }()
	if d := os.Getenv("NEMESIS_SOAK"); d != "" {
		dur, err := time.ParseDuration(d)
		if err != nil {
			t.Fatalf("NEMESIS_SOAK=%q: %v", d, err)
		}
		end := time.Now().Add(dur)
		src := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 23))
		for time.Now().Before(end) {
			seed := 1000 + src.Uint64N(1<<40)
			runSeed(t, seed, &tally)
		}
		return
	}
	seeds := ciSeeds
	if s := os.Getenv("NEMESIS_SEEDS"); s != "" {
		seeds = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil {
				t.Fatalf("NEMESIS_SEEDS=%q: %v", s, err)
			}
			seeds = append(seeds, n)
		}
	}
	for _, seed := range seeds {
		runSeed(t, seed, &tally)
	}
}

func runSeed(t *testing.T, seed uint64, tally *soakTally) {
	var res *result
	began := time.Now()
	ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
		res = runCampaign(t, seed)
	})
	tally.add(seed, ok, res, time.Since(began))
	verdict := "PASS"
	if !ok {
		verdict = "FAIL"
	}
	t.Logf("campaign seed=%d: %s in %s", seed, verdict, time.Since(began).Round(time.Second))
}

// soakTally is the figures of a run of campaigns.
type soakTally struct {
	mu                   sync.Mutex
	campaigns, ddl, rows int
	quarantines          int
	faults               map[string]int
	topologies           map[string]int
	failures             []string
	wall                 time.Duration
}

func (s *soakTally) add(seed uint64, ok bool, r *result, wall time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.faults == nil {
		s.faults, s.topologies = map[string]int{}, map[string]int{}
	}
	s.campaigns++
	s.wall += wall
	if r != nil {
		s.ddl += r.ddl
		s.rows += r.rows
		s.quarantines += r.quarantines
		for k, n := range r.faults {
			s.faults[k] += n
		}
		s.topologies[r.topology]++
	}
	if !ok {
		what := "failed"
		if r != nil && r.failure != "" {
			what = r.failure
		}
		if f, known := knownFailing[seed]; known {
			what += " (known: " + f + ")"
		}
		s.failures = append(s.failures, fmt.Sprintf("seed %d: %s", seed, what))
	}
}

func (s *soakTally) table() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "nemesis: %d campaigns in %s, %d failed\n", s.campaigns, s.wall.Round(time.Second), len(s.failures))
	fmt.Fprintf(&b, "  %-28s %d\n", "DDL statements", s.ddl)
	fmt.Fprintf(&b, "  %-28s %d\n", "rows compared", s.rows)
	fmt.Fprintf(&b, "  %-28s %d\n", "loud quarantines (expected)", s.quarantines)
	for _, m := range []map[string]int{s.topologies, s.faults} {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "  %-28s %d\n", k, m[k])
		}
	}
	for _, f := range s.failures {
		fmt.Fprintf(&b, "  FAIL %s\n", f)
	}
	return b.String()
}
