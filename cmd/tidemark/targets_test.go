package main

import (
	"strings"
	"testing"

	"tidemark"
)

// TestNeedNamesTargetAndCapability: a capability a command needs and the
// target lacks is one error naming the command, the target's config
// section and the root interface; one it has is returned.
func TestNeedNamesTargetAndCapability(t *testing.T) {
	bare := stateTarget{name: "clickhouse", sink: &stubSink{}}
	_, err := need[tidemark.TableRegistry](bare, "tidemark resync")
	if err == nil {
		t.Fatal("a sink without table states passed as a tidemark.TableRegistry")
	}
	for _, want := range []string{"tidemark resync", "target.clickhouse", "tidemark.TableRegistry"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if _, err := need[tidemark.TableRegistry](stateTarget{}, "tidemark status"); err == nil || !strings.Contains(err.Error(), "target.postgres") {
		t.Errorf("no state target: error %v, want one naming target.postgres", err)
	}
	s, err := need[tidemark.Sink](bare, "tidemark checkpoint")
	if err != nil || s != bare.sink {
		t.Fatalf("need of a capability the target has: %v, %v", s, err)
	}
}

// TestNeedCatchUp: a daemon wired without a catch-up (its target stores no
// watermarks and the fallback is off) refuses a command that needs one,
// naming the target.
func TestNeedCatchUp(t *testing.T) {
	d := &daemon{targetName: "target.kafka"}
	_, err := d.needCatchUp("tidemark catchup")
	if err == nil || !strings.Contains(err.Error(), "target.kafka") || !strings.Contains(err.Error(), "tidemark.WatermarkStore") {
		t.Fatalf("error %v, want one naming target.kafka and tidemark.WatermarkStore", err)
	}
}
