package kafka

import (
	"strings"
	"testing"

	"tidemark"
)

// TestCheckpointPartitionCounts: the partition counts of a checkpoint
// record survive the round trip, an empty list is still a list (counted),
// and a record without the field (an older tidemark) leaves the counts
// unknown.
func TestCheckpointPartitionCounts(t *testing.T) {
	pos, err := tidemark.ParsePosition("gtid=0-1-5")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		st    sourceState
		want  string
		parts map[string]int32
	}{
		{"counts", sourceState{pos: pos, counted: true, parts: map[string]int32{"t.b": 4, "t.a": 12}},
			`"partitions":[{"topic":"t.a","count":12},{"topic":"t.b","count":4}]}`, map[string]int32{"t.a": 12, "t.b": 4}},
		{"none yet", sourceState{pos: pos, counted: true}, `"partitions":[]}`, nil},
	} {
		v, err := newCheckpoint(tc.st, "b-1").append(nil)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(string(v), tc.want) {
			t.Errorf("%s: record %s, want it to end with %s", tc.name, v, tc.want)
		}
		_, st, err := parseCheckpoint("s", v)
		if err != nil {
			t.Fatal(err)
		}
		if !st.counted || len(st.parts) != len(tc.parts) {
			t.Errorf("%s: parsed counted=%v parts=%v, want %v", tc.name, st.counted, st.parts, tc.parts)
		}
		for k, n := range tc.parts {
			if st.parts[k] != n {
				t.Errorf("%s: parsed %s=%d, want %d", tc.name, k, st.parts[k], n)
			}
		}
	}
	_, st, err := parseCheckpoint("s", []byte(`{"position":"gtid=0-1-5","batch":"old"}`))
	if err != nil {
		t.Fatal(err)
	}
	if st.counted {
		t.Errorf("a record without partitions parsed as counted: %v", st.parts)
	}
	v, err := newCheckpoint(sourceState{pos: pos}, "b-2").append(nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(v), "partitions") {
		t.Errorf("a sink without control records wrote counts: %s", v)
	}
}
