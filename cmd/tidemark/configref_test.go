package main

import (
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/binlog"
	"tidemark/checkpoint"
	"tidemark/dedupe"
	"tidemark/fallback"
	"tidemark/sink/kafka"
	"tidemark/sink/postgres"
	"tidemark/verify"
)

// refMinimal is the smallest config the daemon accepts: every default the
// test reads is what this config is given by the code.
const refMinimal = `
source: {name: s, addr: "127.0.0.1:3306", user: u, password: p, server_id: 1, time_zone: UTC}
target:
  postgres: {dsn: "postgres://u@127.0.0.1/db"}
`

// yamlKeys walks t's yaml tags; a struct (or pointer to one) is walked
// into, anything else (maps included) is a leaf key.
func yamlKeys(t reflect.Type, prefix string, out *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if tag == "" || tag == "-" {
			continue
		}
		key := prefix + tag
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && ft != reflect.TypeOf(time.Duration(0)) {
			yamlKeys(ft, key+".", out)
			continue
		}
		*out = append(*out, key)
	}
}

type refRow struct {
	keys     []string // full paths; a "prefix.*" key covers a subtree
	defaults map[string]string
	meaning  string
}

var backticked = regexp.MustCompile("`([^`]*)`")

// readmeTable parses README's Configuration table. The first key of a row
// is a full path; the others are relative to its parent. Key groups are
// separated by commas, alternatives within a group by "/"; the default
// column holds one default for all groups or one per group (", ").
func readmeTable(t *testing.T, known map[string]bool) []refRow {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(data), "| key | default | meaning |")
	if !ok {
		t.Fatal("README.md: no configuration table (| key | default | meaning |)")
	}
	var rows []refRow
	for _, line := range strings.Split(after, "\n")[2:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) < 3 || !strings.Contains(cells[0], "`") {
			continue // (NUL bytes) and the like: behaviour, not a key
		}
		row := refRow{defaults: map[string]string{}, meaning: strings.Join(cells[2:], " | ")}
		var parent string
		groups := strings.Split(cells[0], ",")
		defs := strings.Split(strings.TrimSpace(cells[1]), ", ")
		for gi, g := range groups {
			for _, m := range backticked.FindAllStringSubmatch(g, -1) {
				k := m[1]
				if parent == "" {
					if i := strings.LastIndex(k, "."); i >= 0 {
						parent = k[:i+1]
					}
				} else {
					// relative to the deepest prefix of the first key's
					// parent that makes it a key of Config
					for p := parent; ; {
						if known[p+k] || p == "" {
							k = p + k
							break
						}
						p = p[:strings.LastIndex(strings.TrimSuffix(p, "."), ".")+1]
					}
				}
				row.keys = append(row.keys, k)
				switch {
				case len(groups) == 1:
					row.defaults[k] = strings.TrimSpace(cells[1])
				case len(defs) == 1:
					row.defaults[k] = defs[0]
				case len(defs) == len(groups):
					row.defaults[k] = strings.TrimSpace(defs[gi])
				default:
					t.Errorf("README.md: row %s: %d key groups but %d defaults", cells[0], len(groups), len(defs))
				}
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// codeDefaults are the values the code applies to refMinimal, read through
// the same accessors the daemon uses (or the constant the package applies).
func codeDefaults(t *testing.T) map[string]any {
	cfg, err := ParseConfig([]byte(refMinimal), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	dd, on, err := cfg.DedupeSettings()
	if err != nil {
		t.Fatal(err)
	}
	// The control schema is the checkpoint store's (its one setting).
	store, err := checkpoint.New(checkpoint.Config{Schema: cfg.Target.Postgres.ControlSchema})
	if err != nil {
		t.Fatal(err)
	}
	m := cfg.Metrics.withDefaults()
	pc := cfg.PostgresSinkConfig()
	kc := (&KafkaConfig{Brokers: []string{"127.0.0.1:9092"}}).SinkConfig("s", nil)
	return map[string]any{
		"target.postgres.mirror.indexes":      !pc.SkipIndexes,
		"target.postgres.mirror.not_null":     !pc.SkipNotNull,
		"target.kafka.tombstones":             kc.Tombstones,
		"target.kafka.exactly_once":           kc.ExactlyOnce,
		"target.kafka.create_topics":          kc.CreateTopics,
		"target.kafka.control_records":        kc.ControlRecords,
		"source.lag_budget":                   cfg.lagBudget(),
		"target.postgres.control_schema":      store.Schema(),
		"target.postgres.schema":              cfg.Target.Postgres.Schema,
		"source.start_position":               cfg.Source.StartPosition,
		"dedupe.enabled":                      on,
		"dedupe.delay":                        dedupe.DefaultDelay,
		"dedupe.tolerance":                    dd.Tolerance,
		"dedupe.max_keys":                     dedupe.DefaultMaxKeys,
		"fallback.enabled":                    cfg.FallbackOn(),
		"snapshot.parallelism":                cfg.snapshotParallelism(),
		"snapshot.progress_every":             cfg.snapshotProgressEvery(),
		"metrics.listen":                      m.Listen,
		"verify.chunk_rows":                   verify.DefaultChunkRows,
		"verify.examples":                     verify.DefaultExamples,
		"verify.assert.interval":              verify.DefaultAssertInterval,
		"target.kafka.client_id":              kafka.DefaultClientID,
		"target.kafka.topic_prefix":           kafka.DefaultTopicPrefix,
		"target.kafka.max_record_bytes":       kafka.DefaultMaxRecordBytes,
		"target.kafka.topic_template":         kafka.DefaultTopicTemplate,
		"target.kafka.transaction_timeout":    kafka.DefaultTransactionTimeout,
		"target.kafka.commit_resolve_timeout": kafka.DefaultCommitResolveTimeout,
		"target.kafka.max_buffered_records":   kafka.DefaultMaxBufferedRecords,
		"target.kafka.max_buffered_bytes":     kafka.DefaultMaxBufferedBytes,
		"batch.max_changes":                   tidemark.DefaultMaxBatchChanges,
		"batch.max_bytes":                     tidemark.DefaultMaxBatchBytes,
		"batch.max_delay":                     tidemark.DefaultMaxDelay,
		"fallback.lookback":                   fallback.DefaultLookback,
		"fallback.chunk_rows":                 fallback.DefaultChunkRows,
		"fallback.future_tolerance":           fallback.DefaultFutureTolerance,
		"target.postgres.apply_timeout":       postgres.DefaultApplyTimeout,
		"source.heartbeat":                    binlog.DefaultHeartbeat,
		"source.query_timeout":                binlog.DefaultQueryTimeout,
		"log.level":                           cfg.Log.level(),
		"log.format":                          DefaultLogFormat,
		"metrics.retention_interval":          m.RetentionInterval,
		"batch.flush_when_idle":               cfg.Batch.flushWhenIdle(),
		"apply.partition_change_wait":         kafka.DefaultPartitionChangeWait,
	}
}

// sameDefault says whether a README default states the code's value.
func sameDefault(stated string, code any) bool {
	s := strings.TrimSpace(strings.ReplaceAll(stated, "`", ""))
	switch v := code.(type) {
	case time.Duration:
		d, err := time.ParseDuration(s)
		if s == "0" {
			d, err = 0, nil
		}
		return err == nil && d == v
	case bool:
		return (v && (s == "true" || s == "on")) || (!v && (s == "false" || s == "off"))
	case string:
		return s == v || (v == "" && s == `""`)
	default:
		n, err := strconv.ParseInt(fmt.Sprint(v), 10, 64)
		if err != nil {
			return false
		}
		mult := int64(1)
		for suf, m := range map[string]int64{" MiB": 1 << 20, " KiB": 1 << 10} {
			if strings.HasSuffix(s, suf) {
				s, mult = strings.TrimSuffix(s, suf), m
			}
		}
		got, err := strconv.ParseInt(strings.NewReplacer(",", "", " ", "").Replace(s), 10, 64)
		return err == nil && got*mult == n
	}
}

// TestConfigReference: every key of Config is in README's Configuration
// table (a "prefix.*" row covers its subtree when the doc it names mentions
// the key), and every default the table states is the one the code applies.
func TestConfigReference(t *testing.T) {
	var keys []string
	yamlKeys(reflect.TypeOf(Config{}), "", &keys)
	known := map[string]bool{}
	for _, k := range keys {
		known[k] = true
		for i := range k {
			if k[i] == '.' {
				known[k[:i]] = true
			}
		}
	}
	rows := readmeTable(t, known)
	documented := map[string]string{}
	for _, r := range rows {
		for _, k := range r.keys {
			documented[k] = r.defaults[k]
		}
	}
	covered := func(key string) bool {
		for k := range documented {
			if k == key || strings.HasPrefix(k, key+".") {
				return true
			}
		}
		for _, r := range rows {
			for _, k := range r.keys {
				p, ok := strings.CutSuffix(k, "*")
				if !ok || !strings.HasPrefix(key, p) {
					continue
				}
				doc := regexp.MustCompile(`docs/[A-Za-z-]+\.md`).FindString(r.meaning)
				if doc == "" {
					return false
				}
				text, err := os.ReadFile("../../" + doc)
				leaf := key[strings.LastIndex(key, ".")+1:]
				return err == nil && strings.Contains(string(text), "`"+leaf+"`")
			}
		}
		return false
	}
	for _, k := range keys {
		if !covered(k) {
			t.Errorf("README.md configuration table: key %s is not documented", k)
		}
	}
	code := codeDefaults(t)
	for k, v := range code {
		stated, ok := documented[k]
		if !ok {
			t.Errorf("README.md configuration table: %s: no default stated; the code's is %v", k, v)
			continue
		}
		if !sameDefault(stated, v) {
			t.Errorf("README.md configuration table: %s: states default %q, the code's is %v", k, stated, v)
		}
	}
	// A default the table states that the test cannot read from the code
	// fails (it would go stale unseen) unless it is one of describedDefaults,
	// word for word.
	for k, stated := range documented {
		if !known[k] && !strings.ContainsAny(k, "*<") {
			t.Errorf("README.md configuration table: %s is not a key of the config", k)
		}
		if _, ok := code[k]; ok {
			continue
		}
		want, ok := describedDefaults[k]
		switch {
		case !ok:
			t.Errorf("README.md configuration table: %s: states default %q, which the test cannot map to the code: add the code's value to codeDefaults (or, for a rule in words, to describedDefaults)", k, stated)
		case want != stated:
			t.Errorf("README.md configuration table: %s: states default %q, describedDefaults has %q", k, stated, want)
		}
	}
	for k := range describedDefaults {
		if _, ok := documented[k]; !ok {
			t.Errorf("describedDefaults: %s is not in README.md's configuration table", k)
		}
	}
	checkExample(t, known, code, documented)
}

// describedDefaults are the README defaults the test cannot read from the
// code: rules in words, "required" and "none", and values the product
// packages apply inside an unexported default (the binlog source's flavor,
// capture, DST and zero-date policies, the PostgreSQL sink's delete mode and
// DDL policies, verify's violation action). Each must be the README's
// text exactly, so a changed default shows up here.
var describedDefaults = map[string]string{
	"source.name": "required", "source.addr": "required", "source.user": "required",
	"source.password": "required", "source.password_file": "required", "source.server_id": "required",
	"source.time_zone": "required", "target.postgres.dsn": "required", "target.postgres.dsn_file": "required",
	"source.flavor":                   "`mariadb`",
	"source.capture":                  "`log_status`",
	"source.tls.mode":                 "`verify-full` with a `ca_file`; else `require`, but `disable` to a loopback address",
	"source.tls.ca_file":              "system roots",
	"source.tls.cert_file":            "none",
	"source.tls.key_file":             "none",
	"source.tls.server_name":          "the host of `addr`",
	"source.version":                  "`gtid` (MariaDB), `filepos` (MySQL)",
	"source.fold":                     "`later`",
	"source.gap":                      "`later`",
	"source.zones":                    "none",
	"source.zero_dates":               "`null`",
	"source.include":                  "all but system schemas",
	"source.exclude":                  "all but system schemas",
	"source.business_keys":            "primary key",
	"source.read_timeout":             "3 × heartbeat",
	"source.exclude_columns":          "none",
	"target.postgres.delete_mode":     "`hard`",
	"target.postgres.max_conns":       "pgx's (the larger of 4 and the CPUs)",
	"target.postgres.drop_columns":    "`keep`",
	"target.postgres.ddl.drop_table":  "`refuse`",
	"target.postgres.ddl.truncate":    "`apply`",
	"dedupe.event_time_columns":       "none",
	"fallback.tables.<db.t>":          "full re-read",
	"apply.group":                     "`tidemark-apply-<source.name>`",
	"apply.topics":                    "`^<target.kafka.topic_prefix>\\.`",
	"apply.max_records":               "5000",
	"target.kafka.brokers":            "off",
	"target.kafka.checkpoint_topic":   "`<topic_prefix>.checkpoints`",
	"target.kafka.transactional_id":   "`tidemark-<source.name>`",
	"target.kafka.partitions":         "the broker's",
	"target.kafka.replication_factor": "the broker's",
	"target.kafka.topic_configs":      "none",
	"target.kafka.source_server_id":   "none",
	"target.kafka.tls.mode":           "no TLS; with a `tls` section `verify-full`",
	"target.kafka.tls.ca_file":        "system roots",
	"target.kafka.tls.cert_file":      "none",
	"target.kafka.tls.key_file":       "none",
	"target.kafka.tls.server_name":    "each broker's host",
	"target.kafka.sasl.mechanism":     "none",
	"target.kafka.sasl.user":          "none",
	"target.kafka.sasl.password":      "none",
	"target.kafka.sasl.password_file": "none",
	"verify.tables.<db.t>":            "none",
	"verify.assert.on_violation":      "`stop`",
	"metrics.web_config_file":         "none (plain HTTP, no authentication)",
}

// exampleLine is a key line of tidemark.example.yaml, set or commented out
// ("# key: value", which a reader uncomments).
var exampleLine = regexp.MustCompile(`^( *)(# ?)?( *)([a-z_]+):(?: +([^#]*?))?\s*(?:#\s*(.*))?$`)

// defaultAfter and defaultBefore find a default stated in a comment:
// "X (default)", "X (default; …)", "X (MariaDB default)", or "default X",
// "(default: X)".
var (
	defaultAfter  = regexp.MustCompile(`([^\s(|]+) \((?:[A-Za-z]+ )?default[;)]`)
	defaultBefore = regexp.MustCompile(`\bdefault:? ([^,;:)]+)`)
)

// checkExample: every key of tidemark.example.yaml, set or commented out,
// is a key of Config; a default its comments state is the code's (or, for
// the defaults of describedDefaults, the README's words); a value set
// without such a comment is the code's default when the code has one (an
// example that differs from the default says so: "default 0").
func checkExample(t *testing.T, known map[string]bool, code map[string]any, documented map[string]string) {
	data, err := os.ReadFile("../../tidemark.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type level struct {
		indent int
		key    string
	}
	var stack []level
	seen := 0
	for i, line := range strings.Split(string(data), "\n") {
		m := exampleLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		indent := len(m[1]) + len(m[3])
		if m[2] != "" && len(m[3]) > 0 {
			indent = len(m[1]) + len(m[3]) - 1 // "#   mode:" under "# tls:"
		}
		for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
			stack = stack[:len(stack)-1]
		}
		var path []string
		for _, l := range stack {
			path = append(path, l.key)
		}
		parent := strings.Join(path, ".")
		if parent != "" && !known[parent] {
			continue // under a map key (zones, tables, ...): user names
		}
		if parent != "" && !hasChildren(known, parent) {
			continue // a map-valued key's entries
		}
		key := strings.TrimPrefix(parent+"."+m[4], ".")
		stack = append(stack, level{indent, m[4]})
		if !known[key] {
			if m[2] != "" && parent == "" {
				continue // a comment that reads like a key ("Scale-out (…): …" does not; be lenient at the top)
			}
			t.Errorf("tidemark.example.yaml:%d: %s is not a key of the config", i+1, key)
			continue
		}
		seen++
		value, comment := strings.Trim(m[5], `"`), m[6]
		if m[5] == `""` {
			value = `""`
		}
		var stated string
		if d := defaultAfter.FindStringSubmatch(comment); d != nil {
			stated = d[1]
		} else if d := defaultBefore.FindStringSubmatch(comment); d != nil {
			stated = strings.TrimSpace(d[1])
		}
		want, mapped := code[key]
		switch {
		case stated != "" && mapped:
			if !sameDefault(stated, want) {
				t.Errorf("tidemark.example.yaml:%d: %s: the comment states default %q, the code's is %v", i+1, key, stated, want)
			}
		case stated != "":
			words, ok := describedDefaults[key]
			if !ok {
				t.Errorf("tidemark.example.yaml:%d: %s: the comment states default %q, which the test cannot map to the code or to README.md", i+1, key, stated)
			} else if !strings.Contains(strings.ReplaceAll(words, "`", ""), stated) && !strings.Contains(stated, strings.ReplaceAll(words, "`", "")) {
				t.Errorf("tidemark.example.yaml:%d: %s: the comment states default %q, README.md %q", i+1, key, stated, documented[key])
			}
		case mapped && value != "" && !strings.HasPrefix(value, "{") && m[2] == "":
			if !sameDefault(value, want) {
				t.Errorf("tidemark.example.yaml:%d: %s: %q is not the default (%v) and the comment does not say so (\"default …\")", i+1, key, value, want)
			}
		}
	}
	if seen < 50 {
		t.Errorf("tidemark.example.yaml: read only %d keys", seen)
	}
}

// hasChildren reports whether key is a section (has keys under it) rather
// than a leaf, maps included.
func hasChildren(known map[string]bool, key string) bool {
	for k := range known {
		if strings.HasPrefix(k, key+".") {
			return true
		}
	}
	return false
}
