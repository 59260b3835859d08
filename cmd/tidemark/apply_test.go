package main

import (
	"regexp"
	"strings"
	"testing"
)

// TestApplyConfig checks the apply section: it needs target.postgres and
// target.kafka (the error names the section), a bad topics pattern is named,
// and the applier's defaults consume the prefix's topics but not the
// checkpoint topic.
func TestApplyConfig(t *testing.T) {
	pw := env(map[string]string{"TM_PW": "pw"})
	if _, err := ParseConfig([]byte(goodConfig+"apply:\n  group: g\n"), pw); err == nil || !strings.Contains(err.Error(), "config: apply: needs target.postgres") {
		t.Fatalf("apply without target.kafka: %v", err)
	}
	withKafka := strings.Replace(goodConfig, "    delete_mode: soft\n", "    delete_mode: soft\n  kafka:\n    brokers: [127.0.0.1:9092]\n    topic_prefix: shop.v1\n    exactly_once: true\n", 1)
	if _, err := ParseConfig([]byte(withKafka+"apply:\n  topics: '^shop(['\n"), pw); err == nil || !strings.Contains(err.Error(), "config: apply.topics") {
		t.Fatalf("bad topics pattern: %v", err)
	}
	cfg, err := ParseConfig([]byte(withKafka+"apply: {}\n"), pw)
	if err != nil {
		t.Fatal(err)
	}
	ac := cfg.applierConfig(nil)
	if ac.Group != "tidemark-apply-shop" || ac.MaxRecords != 0 {
		t.Errorf("group %q, max records %d", ac.Group, ac.MaxRecords)
	}
	topics, exclude := regexp.MustCompile(ac.Topics), regexp.MustCompile(ac.Exclude)
	for topic, want := range map[string]bool{"shop.v1.shop.orders": true, "shop.v1.checkpoints": false, "shopXv1.shop.orders": false, "other.shop.orders": false} {
		if got := topics.MatchString(topic) && !exclude.MatchString(topic); got != want {
			t.Errorf("topic %s consumed: %v, want %v", topic, got, want)
		}
	}
}

// TestApplyConfigRefusesUnsafeTopology checks that the scale-out topology
// refuses, naming the field, what cannot work or is not safe: an apply
// section without target.kafka.exactly_once (no fencing of a second live
// tailer, review finding 12), and compacted change topics with control
// records (their null-key records are refused by a compacted topic, and
// compaction removes the records the appliers replay, finding 17).
func TestApplyConfigRefusesUnsafeTopology(t *testing.T) {
	pw := env(map[string]string{"TM_PW": "pw"})
	kafka := func(extra string) string {
		return strings.Replace(goodConfig, "    delete_mode: soft\n", "    delete_mode: soft\n  kafka:\n    brokers: [127.0.0.1:9092]\n    topic_prefix: shop.v1\n"+extra, 1)
	}
	for _, tt := range []struct{ name, cfg, want string }{
		{"apply without exactly_once", kafka("") + "apply: {}\n", "config: target.kafka.exactly_once: must be true with an apply section"},
		{"apply with compacted topics", kafka("    exactly_once: true\n    topic_configs: {cleanup.policy: compact}\n") + "apply: {}\n",
			"config: target.kafka.topic_configs: cleanup.policy compact"},
		{"control records with compacted topics", kafka("    control_records: true\n    topic_configs: {cleanup.policy: \"compact,delete\"}\n"),
			"config: target.kafka.topic_configs: cleanup.policy compact"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := ParseConfig([]byte(tt.cfg), pw); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseConfig = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if _, err := ParseConfig([]byte(kafka("    exactly_once: true\n    topic_configs: {cleanup.policy: delete}\n")+"apply: {}\n"), pw); err != nil {
		t.Fatalf("apply with exactly_once and delete-policy topics: %v", err)
	}
}
