package tidemark_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"tidemark"
)

// funcSink is a Sink made of function fields (house style for fakes).
type funcSink struct {
	apply      func(ctx context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error)
	checkpoint func(ctx context.Context, source string) (tidemark.Position, bool, error)
	close      func() error
}

func (f *funcSink) Apply(ctx context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error) {
	return f.apply(ctx, b)
}

func (f *funcSink) Checkpoint(ctx context.Context, source string) (tidemark.Position, bool, error) {
	return f.checkpoint(ctx, source)
}

func (f *funcSink) Close() error {
	if f.close == nil {
		return nil
	}
	return f.close()
}

// at returns a sink whose checkpoint is pos (none when pos is zero).
func at(pos tidemark.Position) *funcSink {
	return &funcSink{checkpoint: func(context.Context, string) (tidemark.Position, bool, error) {
		return pos, !pos.IsZero(), nil
	}}
}

func TestFanoutCheckpointIsTheOldest(t *testing.T) {
	broken := &funcSink{checkpoint: func(context.Context, string) (tidemark.Position, bool, error) {
		return tidemark.Position{}, false, errors.New("connection refused")
	}}
	tests := []struct {
		name    string
		sinks   []tidemark.Sink
		want    tidemark.Position
		wantOK  bool
		wantErr string
	}{
		{"first older", []tidemark.Sink{at(pos(3)), at(pos(5))}, pos(3), true, ""},
		{"second older", []tidemark.Sink{at(pos(7)), at(pos(5))}, pos(5), true, ""},
		{"equal", []tidemark.Sink{at(pos(5)), at(pos(5))}, pos(5), true, ""},
		{"one has none: start from the configured start", []tidemark.Sink{at(pos(5)), at(tidemark.Position{})}, tidemark.Position{}, false, ""},
		{"first has none", []tidemark.Sink{at(tidemark.Position{}), at(pos(5))}, tidemark.Position{}, false, ""},
		{"three", []tidemark.Sink{at(pos(9)), at(pos(4)), at(pos(6))}, pos(4), true, ""},
		{"error names the sink", []tidemark.Sink{at(pos(5)), broken}, tidemark.Position{}, false, "from s1: connection refused"},
		// After a MariaDB failover: the sink still at the old primary's
		// position (higher file number, lower GTID) is the older one.
		{"failover: GTID, not file number", []tidemark.Sink{
			at(tidemark.Position{GTID: "0-2-120", File: "mysql-bin.000002", Offset: 400}),
			at(tidemark.Position{GTID: "0-1-100", File: "mysql-bin.000009", Offset: 9000})},
			tidemark.Position{GTID: "0-1-100", File: "mysql-bin.000009", Offset: 9000}, true, ""},
		{"failover: epoch first", []tidemark.Sink{
			at(tidemark.Position{GTID: "0-2-90", Epoch: 1}),
			at(tidemark.Position{GTID: "0-1-100"})},
			tidemark.Position{GTID: "0-1-100"}, true, ""},
		{"incomparable", []tidemark.Sink{at(tidemark.Position{GTID: "0-1-5,1-1-1"}), at(tidemark.Position{GTID: "0-1-4,1-1-2"})}, tidemark.Position{}, false, "in s1 (gtid=0-1-4,1-1-2) and s0 (gtid=0-1-5,1-1-1)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var targets []tidemark.FanoutTarget
			for i, s := range tt.sinks {
				targets = append(targets, tidemark.FanoutTarget{Name: fmt.Sprintf("s%d", i), Sink: s})
			}
			f, err := tidemark.NewFanout(targets...)
			if err != nil {
				t.Fatal(err)
			}
			got, ok, err := f.Checkpoint(context.Background(), "src")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				if strings.Contains(tt.name, "incomparable") && !errors.Is(err, tidemark.ErrIncomparable) {
					t.Errorf("err = %v, want ErrIncomparable", err)
				}
				return
			}
			if err != nil || got != tt.want || ok != tt.wantOK {
				t.Fatalf("Checkpoint = %s, %v, %v; want %s, %v", got, ok, err, tt.want, tt.wantOK)
			}
		})
	}
}

// watermarkSink is a funcSink that also stores watermarks.
type watermarkSink struct {
	*funcSink
	watermark func(ctx context.Context, source string, table tidemark.TableID) (time.Time, bool, error)
}

func (w *watermarkSink) Watermark(ctx context.Context, source string, table tidemark.TableID) (time.Time, bool, error) {
	return w.watermark(ctx, source, table)
}

func marked(t time.Time) *watermarkSink {
	return &watermarkSink{funcSink: at(pos(1)), watermark: func(context.Context, string, tidemark.TableID) (time.Time, bool, error) {
		return t, !t.IsZero(), nil
	}}
}

func TestFanoutWatermarkIsTheOldest(t *testing.T) {
	t1 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		sinks  []tidemark.Sink
		want   time.Time
		wantOK bool
	}{
		{"oldest", []tidemark.Sink{marked(t1.Add(time.Hour)), marked(t1)}, t1, true},
		{"one has none", []tidemark.Sink{marked(t1), marked(time.Time{})}, time.Time{}, false},
		{"one stores none", []tidemark.Sink{marked(t1), at(pos(1))}, time.Time{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var targets []tidemark.FanoutTarget
			for i, s := range tt.sinks {
				targets = append(targets, tidemark.FanoutTarget{Name: fmt.Sprint(i), Sink: s})
			}
			f, _ := tidemark.NewFanout(targets...)
			got, ok, err := f.Watermark(context.Background(), "src", tidemark.TableID{Database: "d", Name: "t"})
			if err != nil || ok != tt.wantOK || !got.Equal(tt.want) {
				t.Errorf("Watermark = %s, %v, %v; want %s, %v", got, ok, err, tt.want, tt.wantOK)
			}
		})
	}
}

func TestNewFanoutValidates(t *testing.T) {
	s := at(pos(1))
	for _, tt := range []struct {
		targets []tidemark.FanoutTarget
		want    string
	}{
		{nil, "no sinks"},
		{[]tidemark.FanoutTarget{{Name: "", Sink: s}}, "name: required"},
		{[]tidemark.FanoutTarget{{Name: "a", Sink: s}, {Name: "a", Sink: s}}, `"a" used twice`},
		{[]tidemark.FanoutTarget{{Name: "a"}}, "sink a: nil"},
	} {
		if _, err := tidemark.NewFanout(tt.targets...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewFanout(%v) = %v, want %q", tt.targets, err, tt.want)
		}
	}
}

func TestFanoutApply(t *testing.T) {
	var calls []string
	target := func(name string, stats tidemark.ApplyStats, err error) tidemark.FanoutTarget {
		return tidemark.FanoutTarget{Name: name, Sink: &funcSink{apply: func(_ context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error) {
			calls = append(calls, name)
			return stats, err
		}}}
	}
	b := &tidemark.Batch{Source: "src", Changes: changes(1, 3), Checkpoint: pos(1)}
	tests := []struct {
		name      string
		targets   []tidemark.FanoutTarget
		wantStats tidemark.ApplyStats
		wantCalls string
		wantErr   string
		wantIs    error
	}{
		{"returns the first sink's stats", []tidemark.FanoutTarget{
			target("pg", tidemark.ApplyStats{Inserted: 1, Skipped: 2}, nil),
			target("kafka", tidemark.ApplyStats{Inserted: 3}, nil),
		}, tidemark.ApplyStats{Inserted: 1, Skipped: 2}, "pg,kafka", "", nil},
		{"stops at the failing sink", []tidemark.FanoutTarget{
			target("pg", tidemark.ApplyStats{Inserted: 3}, errors.New("deadlock")),
			target("kafka", tidemark.ApplyStats{Inserted: 3}, nil),
		}, tidemark.ApplyStats{}, "pg", "apply batch to pg: deadlock", nil},
		{"second fails after the first committed", []tidemark.FanoutTarget{
			target("pg", tidemark.ApplyStats{Inserted: 3}, nil),
			target("kafka", tidemark.ApplyStats{}, errors.New("fenced")),
		}, tidemark.ApplyStats{}, "pg,kafka", "apply batch to kafka: fenced", nil},
		{"a miscount in any sink is an error", []tidemark.FanoutTarget{
			target("pg", tidemark.ApplyStats{Inserted: 3}, nil),
			target("kafka", tidemark.ApplyStats{Inserted: 2}, nil),
		}, tidemark.ApplyStats{}, "pg,kafka", "apply batch to kafka: 2 counted for 3 changes", tidemark.ErrStatsMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls = nil
			f, err := tidemark.NewFanout(tt.targets...)
			if err != nil {
				t.Fatal(err)
			}
			got, err := f.Apply(context.Background(), b)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("err = %v, want %v", err, tt.wantIs)
			}
			if got != tt.wantStats {
				t.Errorf("stats %+v, want %+v", got, tt.wantStats)
			}
			if strings.Join(calls, ",") != tt.wantCalls {
				t.Errorf("calls %v, want %s", calls, tt.wantCalls)
			}
		})
	}
}

func TestFanoutCloseClosesAll(t *testing.T) {
	var closed []string
	mk := func(name string, err error) *funcSink {
		return &funcSink{close: func() error { closed = append(closed, name); return err }}
	}
	f, _ := tidemark.NewFanout(tidemark.FanoutTarget{Name: "a", Sink: mk("a", errors.New("boom"))}, tidemark.FanoutTarget{Name: "b", Sink: mk("b", nil)})
	if err := f.Close(); err == nil || !strings.Contains(err.Error(), "close a: boom") {
		t.Errorf("Close = %v", err)
	}
	if strings.Join(closed, ",") != "a,b" {
		t.Errorf("closed %v", closed)
	}
}

// memTarget models a sink in memory: its stored checkpoint, and how often
// each change reached it. guarded models PostgreSQL (a replayed change is a
// no-op counted Skipped); otherwise it models Kafka (a batch whose
// checkpoint is not newer than the stored one is skipped whole; anything
// else is published, replays included).
type memTarget struct {
	guarded bool
	fail    func() error // called before each commit: an error is a crash

	mu        sync.Mutex
	stored    tidemark.Position
	rowVer    map[tidemark.Key]tidemark.Version
	delivered map[tidemark.Version]int
}

func (m *memTarget) sink() *funcSink {
	return &funcSink{
		apply: func(_ context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error) {
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.fail != nil {
				if err := m.fail(); err != nil {
					return tidemark.ApplyStats{}, err
				}
			}
			var st tidemark.ApplyStats
			if !m.guarded && !b.Checkpoint.IsZero() && !m.stored.IsZero() {
				if c, err := b.Checkpoint.Compare(m.stored); err == nil && c <= 0 {
					return tidemark.ApplyStats{Skipped: len(b.Changes)}, nil
				}
			}
			for _, ch := range b.Changes {
				k := ch.Key()
				if m.guarded && ch.Version.Compare(m.rowVer[k]) <= 0 {
					st.Skipped++
					continue
				}
				m.rowVer[k] = ch.Version
				m.delivered[ch.Version]++
				st.Inserted++
			}
			if !b.Checkpoint.IsZero() {
				m.stored = b.Checkpoint
			}
			return st, nil
		},
		checkpoint: func(context.Context, string) (tidemark.Position, bool, error) {
			m.mu.Lock()
			defer m.mu.Unlock()
			return m.stored, !m.stored.IsZero(), nil
		},
	}
}

// TestFanoutNeitherSinkMissesAChange runs the real Pipeline over a Fanout
// of two in-memory sinks, crashes it between the two sinks' commits several
// times, restarts it from Fanout.Checkpoint with different batch sizes, and
// checks that each sink got every change; with the replay-absorbing sink
// first and the Kafka-like sink last, the Kafka-like sink gets each exactly
// once.
func TestFanoutNeitherSinkMissesAChange(t *testing.T) {
	const txns = 120
	var all []tidemark.Chunk
	for i := 1; i <= txns; i++ {
		chs := changes(uint64(i), 1+i%3)
		for j := range chs {
			chs[j].After = []any{int64((i + j) % 7)} // keys change again and again
		}
		all = append(all, tidemark.Chunk{Changes: chs, Commit: pos(i)})
	}
	src := &fakeSource{stream: func(ctx context.Context, from tidemark.Position, out chan<- tidemark.Chunk) error {
		start := 0
		if !from.IsZero() {
			set, err := tidemark.ParseMariaDBGTIDSet(from.GTID)
			if err != nil {
				return err
			}
			start = int(set[0].Seq)
		}
		for _, c := range all[start:] {
			select {
			case out <- c:
			case <-ctx.Done():
				return nil
			}
		}
		<-ctx.Done()
		return nil
	}}

	for _, order := range []string{"postgres,kafka", "kafka,postgres"} {
		t.Run(order, func(t *testing.T) {
			pg := &memTarget{guarded: true, rowVer: map[tidemark.Key]tidemark.Version{}, delivered: map[tidemark.Version]int{}}
			kafka := &memTarget{rowVer: map[tidemark.Key]tidemark.Version{}, delivered: map[tidemark.Version]int{}}
			byName := map[string]*memTarget{"postgres": pg, "kafka": kafka}
			names := strings.Split(order, ",")
			second := byName[names[1]]
			var targets []tidemark.FanoutTarget
			for _, n := range names {
				targets = append(targets, tidemark.FanoutTarget{Name: n, Sink: byName[n].sink()})
			}
			f, err := tidemark.NewFanout(targets...)
			if err != nil {
				t.Fatal(err)
			}
			// Crash the second sink at its 3rd, 2nd and 4th commit of
			// three runs; the fourth run finishes.
			crashes := []int{3, 2, 4, 0}
			sizes := []int{7, 3, 11, 5}
			for run, crashAt := range crashes {
				n := 0
				second.fail = func() error {
					n++
					if n == crashAt {
						return errors.New("crash between the two commits")
					}
					return nil
				}
				p, err := tidemark.NewPipeline(tidemark.PipelineConfig{Source: "src", MaxBatchChanges: sizes[run], MaxDelay: 5 * time.Millisecond}, src, nil, f)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				errc := make(chan error, 1)
				go func() { errc <- p.Run(ctx, tidemark.Position{}) }()
				deadline := time.After(10 * time.Second)
			wait:
				for {
					select {
					case err := <-errc:
						cancel()
						if crashAt == 0 || err == nil || !strings.Contains(err.Error(), "crash between") {
							t.Fatalf("run %d: %v", run, err)
						}
						break wait
					case <-deadline:
						cancel()
						t.Fatalf("run %d: timed out", run)
					case <-time.After(2 * time.Millisecond):
						if c, _, _ := f.Checkpoint(context.Background(), "src"); crashAt == 0 && c == pos(txns) {
							cancel()
							if err := <-errc; err != nil {
								t.Fatalf("final run: %v", err)
							}
							break wait
						}
					}
				}
			}
			for name, m := range byName {
				var missing, dups int
				for _, c := range all {
					for _, ch := range c.Changes {
						switch d := m.delivered[ch.Version]; {
						case d == 0:
							missing++
						case d > 1:
							dups++
						}
					}
				}
				if missing > 0 {
					t.Errorf("%s missed %d changes", name, missing)
				}
				if name == "postgres" {
					// Every key holds its newest version.
					want := map[tidemark.Key]tidemark.Version{}
					for _, c := range all {
						for _, ch := range c.Changes {
							want[ch.Key()] = ch.Version
						}
					}
					for k, v := range want {
						if pg.rowVer[k] != v {
							t.Errorf("postgres: key %q at %s, want %s", k, pg.rowVer[k], v)
						}
					}
				}
				if name == "kafka" {
					t.Logf("order %s: kafka got %d duplicates", order, dups)
					if order == "postgres,kafka" && dups != 0 {
						t.Errorf("kafka last: %d duplicates, want none", dups)
					}
				}
			}
		})
	}
}
