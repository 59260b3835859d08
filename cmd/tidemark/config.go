package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"tidemark"
	"tidemark/binlog"
	"tidemark/sink/postgres"
)

// Config is the YAML configuration file (see docs/configuration.md and
// tidemark.example.yaml). Unknown keys are rejected; ${NAME} in any value is
// replaced by the environment variable NAME (an unset variable is an error).
type Config struct {
	Source SourceConfig `yaml:"source"`
	Target TargetConfig `yaml:"target"`
	Batch  BatchConfig  `yaml:"batch"`
	Log    LogConfig    `yaml:"log"`
}

// SourceConfig is the MySQL/MariaDB source.
type SourceConfig struct {
	Name      string `yaml:"name"`
	Flavor    string `yaml:"flavor"`
	Addr      string `yaml:"addr"`
	User      string `yaml:"user"`
	Password  string `yaml:"password"`
	ServerID  uint32 `yaml:"server_id"`
	Version   string `yaml:"version"`
	TimeZone  string `yaml:"time_zone"`
	Fold      string `yaml:"fold"`
	Gap       string `yaml:"gap"`
	ZeroDates string `yaml:"zero_dates"`
	// Zones overrides the zone per "db.table" or "db.table.column".
	Zones         map[string]ZoneConfig `yaml:"zones"`
	Include       []string              `yaml:"include"`
	Exclude       []string              `yaml:"exclude"`
	BusinessKeys  map[string][]string   `yaml:"business_keys"`
	StartPosition string                `yaml:"start_position"`
	Heartbeat     time.Duration         `yaml:"heartbeat"`
	ReadTimeout   time.Duration         `yaml:"read_timeout"`
}

// ZoneConfig is a time-zone override.
type ZoneConfig struct {
	TimeZone string `yaml:"time_zone"`
	Fold     string `yaml:"fold"`
	Gap      string `yaml:"gap"`
}

// TargetConfig chooses the sinks.
type TargetConfig struct {
	Postgres *PostgresConfig `yaml:"postgres"`
}

// PostgresConfig is the PostgreSQL sink.
type PostgresConfig struct {
	DSN           string `yaml:"dsn"`
	Schema        string `yaml:"schema"`
	ControlSchema string `yaml:"control_schema"`
	DeleteMode    string `yaml:"delete_mode"`
	MaxConns      int    `yaml:"max_conns"`
}

// BatchConfig bounds batches.
type BatchConfig struct {
	MaxChanges int           `yaml:"max_changes"`
	MaxBytes   int           `yaml:"max_bytes"`
	MaxDelay   time.Duration `yaml:"max_delay"`
}

// LogConfig configures logging.
type LogConfig struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// expandEnv replaces ${NAME} in every scalar value of the document.
func expandEnv(n *yaml.Node, getenv func(string) (string, bool)) error {
	var errs []error
	if n.Kind == yaml.ScalarNode && strings.Contains(n.Value, "${") {
		n.Value = envRef.ReplaceAllStringFunc(n.Value, func(m string) string {
			name := envRef.FindStringSubmatch(m)[1]
			v, ok := getenv(name)
			if !ok {
				errs = append(errs, fmt.Errorf("config line %d: environment variable %s is not set", n.Line, name))
			}
			return v
		})
		if n.Tag != "!!str" && n.Style == 0 {
			// An expanded value is always a string unless the field
			// wants a number; let the decoder resolve it as written.
			n.Tag = ""
		}
	}
	for _, c := range n.Content {
		if err := expandEnv(c, getenv); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ParseConfig parses and validates a YAML config. Errors name the field or
// line; they never contain a secret value.
func ParseConfig(data []byte, getenv func(string) (string, bool)) (*Config, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("parse config: %w", err)
	}
	if err := expandEnv(&doc, getenv); err != nil {
		return nil, fmt.Errorf("parse config: %w", err)
	}
	expanded, err := yaml.Marshal(&doc)
	if err != nil {
		return nil, fmt.Errorf("parse config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(expanded))
	dec.KnownFields(true)
	var cfg Config
	if err := dec.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("parse config: %s", scrub(err.Error(), &cfg))
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// scrub removes secrets a decoder error might quote.
func scrub(msg string, cfg *Config) string {
	for _, s := range []string{cfg.Source.Password} {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "***")
		}
	}
	return msg
}

// LoadConfig reads a config file.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return ParseConfig(data, os.LookupEnv)
}

// Validate checks fields that the components do not (they validate their
// own configs when built).
func (c *Config) Validate() error {
	var errs []error
	if c.Target.Postgres == nil {
		errs = append(errs, errors.New("config: target.postgres: required (the only sink so far)"))
	} else if c.Target.Postgres.DSN == "" {
		errs = append(errs, errors.New("config: target.postgres.dsn: required"))
	}
	if c.Batch.MaxChanges < 0 {
		errs = append(errs, errors.New("config: batch.max_changes: must be ≥ 0"))
	}
	if c.Batch.MaxBytes < 0 {
		errs = append(errs, errors.New("config: batch.max_bytes: must be ≥ 0"))
	}
	if c.Batch.MaxDelay < 0 {
		errs = append(errs, errors.New("config: batch.max_delay: must be ≥ 0"))
	}
	switch c.Log.Level {
	case "", "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("config: log.level: must be debug, info, warn or error, got %q", c.Log.Level))
	}
	switch c.Log.Format {
	case "", "text", "json":
	default:
		errs = append(errs, fmt.Errorf("config: log.format: must be text or json, got %q", c.Log.Format))
	}
	if c.Source.StartPosition != "" {
		if _, err := tidemark.ParsePosition(c.Source.StartPosition); err != nil {
			errs = append(errs, fmt.Errorf("config: source.start_position: %w", err))
		}
	}
	if _, err := c.BinlogConfig(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func zonePolicy(field string, z ZoneConfig) (tidemark.ZonePolicy, error) {
	var p tidemark.ZonePolicy
	if z.TimeZone != "" {
		loc, err := time.LoadLocation(z.TimeZone)
		if err != nil {
			return p, fmt.Errorf("config: %s.time_zone: unknown IANA zone %q", field, z.TimeZone)
		}
		p.Location = loc
	}
	p.Fold, p.Gap = tidemark.Resolve(z.Fold), tidemark.Resolve(z.Gap)
	if p.Fold != "" && !p.Fold.Valid() {
		return p, fmt.Errorf("config: %s.fold: must be earlier, later or error, got %q", field, z.Fold)
	}
	if p.Gap != "" && !p.Gap.Valid() {
		return p, fmt.Errorf("config: %s.gap: must be earlier, later or error, got %q", field, z.Gap)
	}
	return p, nil
}

// BinlogConfig builds the tailer's config.
func (c *Config) BinlogConfig() (binlog.Config, error) {
	s := c.Source
	zone, err := zonePolicy("source", ZoneConfig{TimeZone: s.TimeZone, Fold: s.Fold, Gap: s.Gap})
	if err != nil {
		return binlog.Config{}, err
	}
	if s.TimeZone == "" {
		return binlog.Config{}, errors.New("config: source.time_zone: required (the IANA zone DATETIME values are written in, e.g. Asia/Kolkata or UTC)")
	}
	overrides := map[string]tidemark.ZonePolicy{}
	for k, z := range s.Zones {
		p, err := zonePolicy("source.zones."+k, z)
		if err != nil {
			return binlog.Config{}, err
		}
		overrides[k] = p
	}
	bc := binlog.Config{
		Name: s.Name, Flavor: s.Flavor, Addr: s.Addr, User: s.User, Password: s.Password,
		ServerID: s.ServerID, Version: s.Version, Zone: zone, ZoneOverrides: overrides,
		ZeroDates: s.ZeroDates, Include: s.Include, Exclude: s.Exclude, BusinessKeys: s.BusinessKeys,
		Heartbeat: s.Heartbeat, ReadTimeout: s.ReadTimeout,
	}
	if err := bc.Validate(); err != nil {
		return binlog.Config{}, err
	}
	return bc, nil
}

// PostgresConfig builds the sink's config (checkpoints and logger are
// filled in by the caller).
func (c *Config) PostgresSinkConfig() postgres.Config {
	p := c.Target.Postgres
	return postgres.Config{DSN: p.DSN, TargetSchema: p.Schema, DeleteMode: postgres.DeleteMode(p.DeleteMode), MaxConns: p.MaxConns}
}
