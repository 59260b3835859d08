package integration

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"tidemark/integration/harness"
)

// setSourceOption rewrites a config file written by configYAML with an
// extra source option (e.g. "version: filepos"), replacing an earlier one.
func setSourceOption(t *testing.T, path, key, value string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "  "+key+":") {
			continue
		}
		out = append(out, line)
		if strings.HasPrefix(line, "  heartbeat:") {
			out = append(out, "  "+key+": "+value)
		}
	}
	if err := os.WriteFile(path, []byte(strings.Join(out, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestVersionSchemeSwitch is finding 1 of issue 13 (the scheme-switch case):
// versions of the filepos scheme (fileIndex<<40 | offset) are far above
// GTID sequence numbers, so after switching the config to version: gtid
// every later change lost to the rows already in the target and was
// counted as skipped — a healthy-looking daemon that changed nothing.
// Now the switch is recorded with the checkpoint's source identity and the
// next epoch makes the new scheme's versions win; switching back does the
// same.
func TestVersionSchemeSwitch(t *testing.T) {
	f := newFixture(t)
	db, start, w := f.newWorkload(t, "it_scheme_", harness.Workload{Zone: "UTC", Rand: rand.New(rand.NewPCG(13, 1)), BigTxRows: 20})
	if err := w.Run(60); err != nil {
		t.Fatal(err)
	}
	cfg := f.configYAML(t, db, db, db, "UTC", start)
	spec := harness.TableSpec{Database: db, Table: "orders", SourceZone: "UTC"}
	for i, scheme := range []string{"filepos", "gtid", "filepos"} {
		setSourceOption(t, cfg, "version", scheme)
		if i > 0 {
			// Updates of rows the target already has (written under the
			// previous scheme's versions) and new rows; no deletes, so
			// that nothing may be skipped.
			for j := 0; j < 20; j++ {
				if err := harness.Exec(f.my,
					"UPDATE orders SET note = 'after switch "+scheme+"', amount = amount + 1 WHERE order_id = 1",
					fmt.Sprintf("UPDATE orders SET amount = amount + 1 WHERE order_id = %d", 2+j),
					fmt.Sprintf("INSERT INTO orders VALUES (%d, 1, 'new', 1.00, 'new', NULL, NOW(6), NULL)", 100000*(i+1)+j)); err != nil {
					t.Fatal(err)
				}
			}
		}
		d := f.startDaemon(t, cfg)
		f.waitCaughtUp(t, db, d)
		if code := d.stop(t); code != 0 {
			t.Fatalf("%s: exit %d\n%s", scheme, code, d.stderr.String())
		}
		f.compare(t, spec)
		log := d.stderr.String()
		if i > 0 && !strings.Contains(log, "version scheme") {
			t.Fatalf("%s: the switch is not in the log:\n%s", scheme, log)
		}
		if i > 0 && !strings.Contains(log, "skipped=0 ") {
			t.Fatalf("%s: changes after the switch were skipped:\n%s", scheme, tail(log, 20))
		}
		pos, _, err := harness.StoredCheckpoint(f.ctx, f.pg, "", db)
		if err != nil {
			t.Fatal(err)
		}
		if pos.Epoch != uint32(i) || pos.Source.Scheme != scheme {
			t.Fatalf("checkpoint %s after run %d: want epoch %d, scheme %s", pos, i, i, scheme)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
