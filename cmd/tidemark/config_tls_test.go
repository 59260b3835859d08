package main

import (
	"os"
	"strings"
	"testing"

	"tidemark/internal/testcerts"
)

// TestTLSAndSASLConfig: source.tls and target.kafka.tls/sasl parse into the
// components' configs (the SASL password from password_file or ${ENV}),
// and bad values are refused naming the field, never printing a password.
func TestTLSAndSASLConfig(t *testing.T) {
	dir := t.TempDir()
	canary := "sasl-canary-Pa55-991"
	pw := dir + "/kafka-pw"
	if err := os.WriteFile(pw, []byte(canary+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tca, err := testcerts.NewCA(dir, "cfg")
	if err != nil {
		t.Fatal(err)
	}
	ca := tca.File
	base := strings.Replace(goodConfig, "  server_id: 4242\n", "  server_id: 4242\n  tls: {mode: verify-ca, ca_file: "+ca+", server_name: db.internal}\n", 1)
	kafka := func(extra string) string {
		return strings.Replace(base, "batch:", "  kafka:\n    brokers: [\"k1:9093\"]\n"+extra+"batch:", 1)
	}
	y := kafka("    tls: {ca_file: " + ca + "}\n    sasl: {mechanism: SCRAM-SHA-512, user: tm, password_file: " + pw + "}\n")
	cfg, err := ParseConfig([]byte(y), env(map[string]string{"TM_PW": "x"}))
	if err != nil {
		t.Fatal(err)
	}
	bc, err := cfg.BinlogConfig()
	if err != nil {
		t.Fatal(err)
	}
	if bc.TLS.Mode != "verify-ca" || bc.TLS.CAFile != ca || bc.TLS.ServerName != "db.internal" {
		t.Fatalf("source TLS %+v", bc.TLS)
	}
	sec := cfg.Target.Kafka.SinkConfig("shop", nil).Security
	if sec.TLS == nil || sec.TLS.CAFile != ca || sec.SASL == nil || sec.SASL.Password != canary || sec.SASL.Mechanism != "SCRAM-SHA-512" {
		t.Fatalf("kafka security %+v %+v", sec.TLS, sec.SASL)
	}
	cfg.Apply = &ApplyConfig{}
	if ac := cfg.applierConfig(nil); ac.Security.SASL == nil || ac.Security.SASL.Password != canary {
		t.Fatalf("applier security %+v", ac.Security)
	}
	// ${ENV} works for the password too.
	if cfg, err := ParseConfig([]byte(kafka("    tls: {}\n    sasl: {mechanism: PLAIN, user: tm, password: '${TM_PW}'}\n")), env(map[string]string{"TM_PW": canary})); err != nil ||
		cfg.Target.Kafka.SASL.Password != canary {
		t.Fatalf("password from ${ENV}: %v", err)
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"source mode", strings.Replace(base, "mode: verify-ca", "mode: on", 1), "tls.mode: must be disable, require, verify-ca or verify-full"},
		{"source ca", strings.Replace(base, "ca_file: "+ca, "ca_file: "+dir+"/nope.pem", 1), "tls.ca_file: read " + dir + "/nope.pem"},
		{"kafka mechanism", kafka("    tls: {}\n    sasl: {mechanism: GSSAPI, user: tm, password: '${TM_PW}'}\n"), "config: target.kafka.sasl.mechanism: must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"},
		{"kafka user", kafka("    sasl: {mechanism: SCRAM-SHA-256, password: '${TM_PW}'}\n"), "config: target.kafka.sasl.user: required"},
		{"kafka password", kafka("    sasl: {mechanism: SCRAM-SHA-256, user: tm}\n"), "config: target.kafka.sasl.password: required"},
		{"kafka plain without tls", kafka("    sasl: {mechanism: PLAIN, user: tm, password: '${TM_PW}'}\n"), "config: target.kafka.sasl.mechanism: PLAIN sends the password in clear"},
		{"kafka password file", kafka("    sasl: {mechanism: PLAIN, user: tm, password_file: " + dir + "/nope}\n"), "config: target.kafka.sasl.password_file: read " + dir + "/nope"},
		{"kafka both", kafka("    sasl: {mechanism: PLAIN, user: tm, password: '${TM_PW}', password_file: " + pw + "}\n"), "target.kafka.sasl.password_file: set either it or the value it replaces"},
		{"kafka tls disable", kafka("    tls: {mode: disable}\n"), "config: target.kafka.tls.mode: disable: remove the tls section"},
		{"kafka tls ca", kafka("    tls: {ca_file: " + pw + "}\n"), "config: target.kafka.tls.ca_file: " + pw + " holds no PEM certificate"},
		{"web config file", base + "metrics:\n  web_config_file: " + pw + "\n", "config: metrics.web_config_file: web config " + pw + ": yaml:"},
		{"web config missing", base + "metrics:\n  web_config_file: " + dir + "/web.yml\n", "config: metrics.web_config_file: read web config: open " + dir + "/web.yml: no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml), env(map[string]string{"TM_PW": canary}))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), canary) {
				t.Fatalf("password in error: %v", err)
			}
		})
	}
}
