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
	m := cfg.Metrics.withDefaults()
	return map[string]any{
		"source.lag_budget":                 cfg.lagBudget(),
		"target.postgres.control_schema":    cfg.controlSchema(),
		"target.postgres.schema":            cfg.Target.Postgres.Schema,
		"source.start_position":             cfg.Source.StartPosition,
		"dedupe.enabled":                    on,
		"dedupe.delay":                      dedupe.DefaultDelay,
		"dedupe.tolerance":                  dd.Tolerance,
		"dedupe.max_keys":                   dedupe.DefaultMaxKeys,
		"fallback.enabled":                  cfg.FallbackOn(),
		"metrics.listen":                    m.Listen,
		"verify.chunk_rows":                 verify.DefaultChunkRows,
		"verify.examples":                   verify.DefaultExamples,
		"verify.assert.interval":            verify.DefaultAssertInterval,
		"target.kafka.client_id":            kafka.DefaultClientID,
		"target.kafka.topic_prefix":         kafka.DefaultTopicPrefix,
		"target.kafka.max_record_bytes":     kafka.DefaultMaxRecordBytes,
		"target.kafka.topic_template":       kafka.DefaultTopicTemplate,
		"target.kafka.transaction_timeout":  kafka.DefaultTransactionTimeout,
		"target.kafka.max_buffered_records": kafka.DefaultMaxBufferedRecords,
		"target.kafka.max_buffered_bytes":   kafka.DefaultMaxBufferedBytes,
		"batch.max_changes":                 tidemark.DefaultMaxBatchChanges,
		"batch.max_bytes":                   tidemark.DefaultMaxBatchBytes,
		"batch.max_delay":                   tidemark.DefaultMaxDelay,
		"fallback.lookback":                 fallback.DefaultLookback,
		"fallback.chunk_rows":               fallback.DefaultChunkRows,
		"fallback.future_tolerance":         fallback.DefaultFutureTolerance,
		"target.postgres.apply_timeout":     postgres.DefaultApplyTimeout,
		"source.heartbeat":                  binlog.DefaultHeartbeat,
		"source.query_timeout":              binlog.DefaultQueryTimeout,
		"log.level":                         cfg.Log.level(),
		"log.format":                        DefaultLogFormat,
		"metrics.retention_interval":        m.RetentionInterval,
		"batch.flush_when_idle":             cfg.Batch.flushWhenIdle(),
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
	for k, v := range codeDefaults(t) {
		stated, ok := documented[k]
		if !ok || strings.HasPrefix(k, "_") {
			continue
		}
		if !sameDefault(stated, v) {
			t.Errorf("README.md configuration table: %s: states default %q, the code's is %v", k, stated, v)
		}
	}
}
