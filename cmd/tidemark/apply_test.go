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
	withKafka := strings.Replace(goodConfig, "    delete_mode: soft\n", "    delete_mode: soft\n  kafka:\n    brokers: [127.0.0.1:9092]\n    topic_prefix: shop.v1\n", 1)
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
