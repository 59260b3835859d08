package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

const goodConfig = `
source:
  name: shop
  addr: 127.0.0.1:33061
  user: tidemark
  password: ${TM_PW}
  server_id: 4242
  time_zone: Asia/Kolkata
  business_keys:
    shop.orders: [order_id, line_item_id]
  zones:
    shop.events.created_at: {time_zone: UTC}
target:
  postgres:
    dsn: postgres://tidemark:${TM_PW}@127.0.0.1:54329/tidemark?sslmode=disable
    delete_mode: soft
batch:
  max_changes: 1000
  max_delay: 50ms
log:
  level: debug
`

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestParseConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(goodConfig), env(map[string]string{"TM_PW": "p@ss: #word"}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Source.Password != "p@ss: #word" || !strings.Contains(cfg.Target.Postgres.DSN, "p@ss: #word") {
		t.Fatalf("env not expanded literally: %q", cfg.Source.Password)
	}
	if cfg.Batch.MaxDelay.Milliseconds() != 50 || cfg.Source.ServerID != 4242 {
		t.Fatalf("decoded %+v", cfg.Batch)
	}
	bc, err := cfg.BinlogConfig()
	if err != nil {
		t.Fatal(err)
	}
	if bc.Zone.Location.String() != "Asia/Kolkata" || bc.ZoneOverrides["shop.events.created_at"].Location.String() != "UTC" {
		t.Fatalf("zones %v %v", bc.Zone.Location, bc.ZoneOverrides)
	}
}

func TestParseConfigErrorsNameTheField(t *testing.T) {
	secret := "hunter2-secret"
	tests := []struct {
		name, yaml, want string
	}{
		{"unknown key", strings.Replace(goodConfig, "server_id:", "serverid:", 1), "serverid"},
		{"missing env", strings.Replace(goodConfig, "${TM_PW}", "${NOPE}", 1), "NOPE"},
		{"bad zone", strings.Replace(goodConfig, "Asia/Kolkata", "Asia/Atlantis", 1), "source.time_zone"},
		{"no zone", strings.Replace(goodConfig, "time_zone: Asia/Kolkata", "", 1), "source.time_zone"},
		{"bad fold", strings.Replace(goodConfig, "time_zone: Asia/Kolkata", "time_zone: Asia/Kolkata\n  fold: sideways", 1), "source.fold"},
		{"bad override zone", strings.Replace(goodConfig, "{time_zone: UTC}", "{time_zone: Mars/Base}", 1), "source.zones.shop.events.created_at.time_zone"},
		{"no server id", strings.Replace(goodConfig, "server_id: 4242", "", 1), "server_id"},
		{"bad addr", strings.Replace(goodConfig, "127.0.0.1:33061", "localhost", 1), "addr"},
		{"bad level", strings.Replace(goodConfig, "level: debug", "level: loud", 1), "log.level"},
		{"no target", goodConfig[:strings.Index(goodConfig, "target:")], "target: set postgres, kafka or both"},
		{"bad start", strings.Replace(goodConfig, "server_id: 4242", "server_id: 4242\n  start_position: nonsense", 1), "source.start_position"},
		{"bad type", strings.Replace(goodConfig, "server_id: 4242", "server_id: many", 1), "server_id"},
		{"secret in a number field", strings.Replace(goodConfig, "server_id: 4242", "server_id: ${TM_PW}", 1), "source.server_id"},
		{"unknown nested key", strings.Replace(goodConfig, "delete_mode: soft", "delete_mode: soft\n    sslmode: off", 1), "sslmode"},
		{"bad business key", strings.Replace(goodConfig, "shop.orders:", "orders:", 1), "business_keys"},
		{"negative snapshot parallelism", goodConfig + "snapshot:\n  parallelism: -1\n", "config: snapshot.parallelism: must be between 1 and 64"},
		{"too many snapshot readers", goodConfig + "snapshot:\n  parallelism: 65\n", "config: snapshot.parallelism: must be between 1 and 64"},
		{"negative snapshot progress interval", goodConfig + "snapshot:\n  progress_every: -1s\n", "config: snapshot.progress_every: must be between 1ns and 1h"},
		{"snapshot progress interval too long", goodConfig + "snapshot:\n  progress_every: 2h\n", "config: snapshot.progress_every: must be between 1ns and 1h"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml), env(map[string]string{"TM_PW": secret}))
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not name %q", err, tc.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("secret in error: %q", err)
			}
		})
	}
}

func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	canary := "canary-Pa55-7781"
	pw := dir + "/pw"
	if err := os.WriteFile(pw, []byte(canary+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	y := strings.Replace(goodConfig, "password: ${TM_PW}", "password_file: "+pw, 1)
	cfg, err := ParseConfig([]byte(y), env(map[string]string{"TM_PW": "x"}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Source.Password != canary {
		t.Fatalf("password %q", cfg.Source.Password)
	}
	for name, yy := range map[string]string{
		"missing file": strings.Replace(goodConfig, "password: ${TM_PW}", "password_file: "+dir+"/nope", 1),
		"unreadable":   strings.Replace(goodConfig, "password: ${TM_PW}", "password_file: "+dir, 1),
		"both":         strings.Replace(goodConfig, "password: ${TM_PW}", "password: ${TM_PW}\n  password_file: "+pw, 1),
	} {
		_, err := ParseConfig([]byte(yy), env(map[string]string{"TM_PW": canary}))
		if err == nil || !strings.Contains(err.Error(), "source.password_file") {
			t.Fatalf("%s: err %v", name, err)
		}
		if strings.Contains(err.Error(), canary) {
			t.Fatalf("%s: canary in error", name)
		}
	}
}

func TestExampleConfigParses(t *testing.T) {
	data, err := os.ReadFile("../../tidemark.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseConfig(data, env(map[string]string{"TIDEMARK_MYSQL_PASSWORD": "x", "TIDEMARK_PG_DSN": "postgres://u:p@127.0.0.1:5432/d?sslmode=disable"}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Source.Name != "shop" || !cfg.FallbackOn() || cfg.Fallback.Tables["shop.orders"].DeleteDetection != "keydiff" {
		t.Fatalf("parsed %+v", cfg)
	}
}

func TestEmptyPasswordDoesNotGarbleErrors(t *testing.T) {
	y := strings.Replace(goodConfig, "password: ${TM_PW}", "password: \"\"", 1)
	y = strings.Replace(y, "level: debug", "level: loud", 1)
	_, err := ParseConfig([]byte(y), env(map[string]string{"TM_PW": "x"}))
	if err == nil || !strings.Contains(err.Error(), "log.level") || strings.Contains(err.Error(), "***") {
		t.Fatalf("err = %v", err)
	}
}

func TestKafkaOnlyConfig(t *testing.T) {
	y := goodConfig[:strings.Index(goodConfig, "target:")] + "target:\n  kafka:\n    brokers: [\"127.0.0.1:9092\"]\n    exactly_once: true\n"
	cfg, err := ParseConfig([]byte(y), env(map[string]string{"TM_PW": "x"}))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.needPostgres("verify"); err == nil || !strings.Contains(err.Error(), "target.postgres") {
		t.Fatalf("verify without PostgreSQL: %v", err)
	}
}

const schemaConfig = `
source:
  name: shop
  addr: 127.0.0.1:33061
  user: tidemark
  password: pw
  server_id: 4242
  time_zone: UTC
  include: ["shop.*"]
  exclude_columns:
    shop.users: [ssn, email]
    "*.audit": [ip]
target:
  postgres:
    dsn: postgres://x@127.0.0.1:1/x
    drop_columns: drop
    ddl: {drop_table: apply, truncate: refuse}
`

func TestSchemaConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(schemaConfig), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	bc, err := cfg.BinlogConfig()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(bc.ExcludeColumns["shop.users"], ",") != "ssn,email" || len(bc.ExcludeColumns["*.audit"]) != 1 {
		t.Fatalf("exclude_columns %v", bc.ExcludeColumns)
	}
	pc := cfg.PostgresSinkConfig()
	if pc.Schema.DropColumns != "drop" || pc.Schema.DropTable != "apply" || pc.Schema.Truncate != "refuse" {
		t.Fatalf("schema policy %+v", pc.Schema)
	}
	for _, c := range []struct{ from, to, want string }{
		{"drop_columns: drop", "drop_columns: delete", "target.postgres.drop_columns"},
		{"truncate: refuse", "truncate: ignore", "target.postgres.ddl.truncate"},
		{"shop.users: [ssn, email]", "shop.users: [id, 'a\"b']", "exclude_columns"},
	} {
		_, err := ParseConfig([]byte(strings.Replace(schemaConfig, c.from, c.to, 1)), env(nil))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one naming %s", c.to, err, c.want)
		}
	}
}

func TestKafkaConfigYAML(t *testing.T) {
	doc := `
kafka:
  brokers: ["127.0.0.1:9092"]
  topic_prefix: shop
  tombstones: true
  exactly_once: true
  transaction_timeout: 30s
  partitions: 6
  topic_configs: {cleanup.policy: compact}
  source_server_id: 1001
`
	var c struct {
		Kafka KafkaConfig `yaml:"kafka"`
	}
	dec := yaml.NewDecoder(bytes.NewReader([]byte(doc)))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatal(err)
	}
	got := c.Kafka.SinkConfig("main", nil)
	if !got.ExactlyOnce || got.TransactionalID != "tidemark-main" || !got.CreateTopics || !got.Tombstones ||
		got.TransactionTimeout != 30*time.Second || got.Partitions != 6 || got.TopicConfigs["cleanup.policy"] != "compact" ||
		got.SourceServerID != 1001 || got.TopicPrefix != "shop" {
		t.Errorf("SinkConfig = %+v", got)
	}
	if err := c.Kafka.Validate("main"); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

func TestKafkaConfigValidate(t *testing.T) {
	no := false
	tests := []struct {
		name string
		k    KafkaConfig
		want string
	}{
		{"ok", KafkaConfig{Brokers: []string{"k:9092"}, CreateTopics: &no}, ""},
		{"brokers", KafkaConfig{}, "config: target.kafka.brokers: required"},
		{"template", KafkaConfig{Brokers: []string{"k:9092"}, TopicTemplate: "{db}.{table}"}, "config: target.kafka.topic_template: unknown placeholder"},
		{"buffer", KafkaConfig{Brokers: []string{"k:9092"}, MaxBufferedBytes: 100}, "config: target.kafka.max_buffered_bytes: must be at least 1 MiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.k.Validate("main")
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("Validate = %v, want %q", err, tt.want)
			}
		})
	}
}
