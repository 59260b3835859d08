package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// Daemon is a tidemark daemon config (tidemark.example.yaml documents every
// key) as a typed value: tests fill in what they need and render it with
// YAML or Write, instead of writing YAML by hand. The fields mirror the
// config's sections and keep their order; zero fields are left out, so the
// daemon's defaults apply. Sections a test needs that have no field here
// go in Extra as YAML text, appended after the typed sections.
type Daemon struct {
	Source   Source    `yaml:"source"`
	Target   Target    `yaml:"target"`
	Batch    *Batch    `yaml:"batch,omitempty"`
	Fallback *Fallback `yaml:"fallback,omitempty"`
	Dedupe   *Toggle   `yaml:"dedupe,omitempty"`
	Log      *Log      `yaml:"log,omitempty"`
	// Metrics is the ops endpoint's section. Nil renders `listen: "off"`
	// (daemons of tests that run at once must not fight over the default
	// port), unless Extra has its own metrics section.
	Metrics *Metrics `yaml:"metrics,omitempty"`
	// Extra is more top-level YAML, appended as it is.
	Extra string `yaml:"-"`
}

// Source is the config's source section.
type Source struct {
	Name          string        `yaml:"name"`
	Flavor        string        `yaml:"flavor,omitempty"`
	Capture       string        `yaml:"capture,omitempty"`
	Addr          string        `yaml:"addr"`
	User          string        `yaml:"user"`
	Password      string        `yaml:"password,omitempty"`
	PasswordFile  string        `yaml:"password_file,omitempty"`
	ServerID      uint32        `yaml:"server_id"`
	TLS           *TLSConfig    `yaml:"tls,omitempty"`
	Version       string        `yaml:"version,omitempty"`
	TimeZone      string        `yaml:"time_zone,omitempty"`
	Include       []string      `yaml:"include,flow,omitempty"`
	Exclude       []string      `yaml:"exclude,flow,omitempty"`
	StartPosition string        `yaml:"start_position,omitempty"`
	Heartbeat     time.Duration `yaml:"heartbeat,omitempty"`
	ReadTimeout   time.Duration `yaml:"read_timeout,omitempty"`
	LagBudget     time.Duration `yaml:"lag_budget,omitempty"`
	// More are further source keys (key → value), rendered after the
	// typed ones.
	More map[string]any `yaml:",inline"`
}

// TLSConfig is a tls section (source.tls, target.kafka.tls).
type TLSConfig struct {
	Mode       string `yaml:"mode,omitempty"`
	CAFile     string `yaml:"ca_file,omitempty"`
	CertFile   string `yaml:"cert_file,omitempty"`
	KeyFile    string `yaml:"key_file,omitempty"`
	ServerName string `yaml:"server_name,omitempty"`
}

// Target is the config's target section: PostgreSQL or Kafka.
type Target struct {
	Postgres *Postgres    `yaml:"postgres,omitempty"`
	Kafka    *KafkaTarget `yaml:"kafka,omitempty"`
}

// Postgres is target.postgres.
type Postgres struct {
	DSN           string `yaml:"dsn,omitempty"`
	DSNFile       string `yaml:"dsn_file,omitempty"`
	Schema        string `yaml:"schema,omitempty"`
	ControlSchema string `yaml:"control_schema,omitempty"`
	DeleteMode    string `yaml:"delete_mode,omitempty"`
	// More are further target.postgres keys, rendered after the typed
	// ones.
	More map[string]any `yaml:",inline"`
}

// KafkaTarget is target.kafka.
type KafkaTarget struct {
	Brokers     []string   `yaml:"brokers,flow"`
	TopicPrefix string     `yaml:"topic_prefix,omitempty"`
	ExactlyOnce bool       `yaml:"exactly_once,omitempty"`
	Tombstones  bool       `yaml:"tombstones,omitempty"`
	Partitions  int32      `yaml:"partitions,omitempty"`
	TLS         *TLSConfig `yaml:"tls,omitempty"`
	SASL        *SASL      `yaml:"sasl,omitempty"`
}

// SASL is target.kafka.sasl.
type SASL struct {
	Mechanism    string `yaml:"mechanism"`
	User         string `yaml:"user"`
	Password     string `yaml:"password,omitempty"`
	PasswordFile string `yaml:"password_file,omitempty"`
}

// Batch is the batch section.
type Batch struct {
	MaxChanges int           `yaml:"max_changes,omitempty"`
	MaxDelay   time.Duration `yaml:"max_delay,omitempty"`
}

// Fallback is the fallback section's switch and per-table columns
// (table → the updated-at column).
type Fallback struct {
	Enabled *bool                    `yaml:"enabled,omitempty"`
	Tables  map[string]FallbackTable `yaml:"tables,omitempty"`
}

// FallbackTable is one fallback.tables entry.
type FallbackTable struct {
	Column string `yaml:"column"`
}

// Toggle is a section with only its enabled switch set (dedupe).
type Toggle struct {
	Enabled bool `yaml:"enabled"`
}

// Log is the log section.
type Log struct {
	Level  string `yaml:"level,omitempty"`
	Format string `yaml:"format,omitempty"`
}

// Metrics is the metrics section.
type Metrics struct {
	Listen        string `yaml:"listen"`
	WebConfigFile string `yaml:"web_config_file,omitempty"`
}

// Off is a pointer to false, for the *bool switches.
func Off() *bool { b := false; return &b }

var topMetrics = regexp.MustCompile(`(?m)^metrics:`)

// YAML renders the config.
func (d Daemon) YAML() (string, error) {
	if d.Metrics == nil && !topMetrics.MatchString(d.Extra) {
		d.Metrics = &Metrics{Listen: "off"}
	}
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(d); err != nil {
		return "", fmt.Errorf("render daemon config: %w", err)
	}
	if err := enc.Close(); err != nil {
		return "", fmt.Errorf("render daemon config: %w", err)
	}
	return b.String() + d.Extra, nil
}

// Write renders the config into tidemark.yaml in a fresh temporary
// directory of t and returns its path.
func (d Daemon) Write(t testing.TB) string {
	t.Helper()
	y, err := d.YAML()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "tidemark.yaml")
	if err := os.WriteFile(p, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
