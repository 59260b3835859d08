package testenv

import (
	"strings"
	"testing"
	"time"
)

// TestDaemonYAML: the builder renders the config's sections in order,
// leaves zero fields out, quotes "off" (YAML 1.1 would read it as false)
// and writes durations as the daemon parses them.
func TestDaemonYAML(t *testing.T) {
	y, err := Daemon{
		Source: Source{Name: "s", Addr: "127.0.0.1:3306", User: "u", Password: "${PW}", ServerID: 7,
			TimeZone: "UTC", Include: []string{"db.*"}, StartPosition: "0-1-5", Heartbeat: time.Second,
			More: map[string]any{"fold": "later"}},
		Target: Target{Postgres: &Postgres{DSN: "${DSN}", Schema: "db"}},
		Batch:  &Batch{MaxDelay: 50 * time.Millisecond},
		Dedupe: &Toggle{},
		Log:    &Log{Level: "info"},
		Extra:  "verify:\n  examples: 3\n",
	}.YAML()
	if err != nil {
		t.Fatal(err)
	}
	want := `source:
  name: s
  addr: 127.0.0.1:3306
  user: u
  password: ${PW}
  server_id: 7
  time_zone: UTC
  include: [db.*]
  start_position: 0-1-5
  heartbeat: 1s
  fold: later
target:
  postgres:
    dsn: ${DSN}
    schema: db
batch:
  max_delay: 50ms
dedupe:
  enabled: false
log:
  level: info
metrics:
  listen: "off"
verify:
  examples: 3
`
	if y != want {
		t.Fatalf("got:\n%s\nwant:\n%s", y, want)
	}
	// Extra with its own metrics section: no second one.
	y, err = Daemon{Source: Source{Name: "s"}, Extra: "metrics:\n  listen: 127.0.0.1:1\n"}.YAML()
	if err != nil || strings.Count(y, "metrics:") != 1 {
		t.Fatalf("Extra with metrics: %v\n%s", err, y)
	}
}
