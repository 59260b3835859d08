package main

import (
	"strings"
	"testing"

	"tidemark"
)

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

func TestTableStateMetric(t *testing.T) {
	m := NewMetrics()
	set := tableStateMetric(m)
	id := tidemark.TableID{Database: "shop", Name: "orders"}
	set(tidemark.TableState{Table: id, Mode: tidemark.TableQuarantined})
	set(tidemark.TableState{Table: id, Mode: tidemark.TableStreaming})
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "tidemark_table_state" {
			continue
		}
		for _, mt := range f.GetMetric() {
			var state string
			for _, l := range mt.GetLabel() {
				if l.GetName() == "state" {
					state = l.GetValue()
				}
			}
			got[state] = mt.GetGauge().GetValue()
		}
	}
	if got["streaming"] != 1 || got["quarantined"] != 0 || len(got) != 4 {
		t.Fatalf("tidemark_table_state %v", got)
	}
}
