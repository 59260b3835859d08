package nemesis

import (
	"testing"

	"tidemark/integration/harness"
)

// TestJudgeAcceptsLockHandover: a `run` that stopped because another `run`
// took its source's lock over (lost the lock, or fenced by the broker) is
// not a finding while the one that took over still runs; any other stop,
// an applier's, or a handover to nobody is.
func TestJudgeAcceptsLockHandover(t *testing.T) {
	mk := func(role string, exited bool, log string, args ...string) *proc {
		p := &proc{role: role, args: args, log: &harness.LockedBuffer{}, waited: make(chan struct{})}
		_, _ = p.log.Write([]byte(log))
		if exited {
			close(p.waited)
		}
		return p
	}
	lost := "level=INFO msg=starting\nlevel=ERROR msg=\"source lock lost\" source=s err=\"lost the source lock of s: check lock of source s: lost the source lock: not held by this process; stopping, so that the process that holds it is the only writer\"\n"
	fenced := "level=ERROR msg=\"run failed\" err=\"apply batch: sink/kafka: fenced by another instance with transactional id tm-s: PRODUCER_FENCED\"\n"
	other := "level=ERROR msg=\"run failed\" err=\"apply batch: connection refused\"\n"
	for _, tc := range []struct {
		name string
		p    *proc
		rest []*proc
		want string
	}{
		{"lost, standby runs", mk("tailer", true, lost, "run"), []*proc{mk("standby", false, "", "run")}, "standby"},
		{"fenced, new tailer runs", mk("standby", true, fenced, "run"), []*proc{mk("tailer", false, "", "run")}, "tailer"},
		{"lost, nobody runs", mk("tailer", true, lost, "run"), []*proc{mk("standby", true, lost, "run"), mk("applier 0", false, "", "apply")}, ""},
		{"another error", mk("tailer", true, other, "run"), []*proc{mk("standby", false, "", "run")}, ""},
		{"an applier fenced", mk("applier 0", true, fenced, "apply"), []*proc{mk("applier 1", false, "", "apply"), mk("tailer", false, "", "run")}, ""},
	} {
		got := ""
		if by := handedOverTo(tc.p, append([]*proc{tc.p}, tc.rest...)); by != nil {
			got = by.role
		}
		if got != tc.want {
			t.Errorf("%s: handed over to %q, want %q", tc.name, got, tc.want)
		}
	}
}
