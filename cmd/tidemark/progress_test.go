package main

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestProgressLogsWhenNotATerminal(t *testing.T) {
	var logs bytes.Buffer
	var out bytes.Buffer // not a terminal: no bar
	p := NewProgress(&out, "verify shop.orders", 1000, slog.New(slog.NewTextHandler(&logs, nil)))
	if p.bar != nil {
		t.Fatal("a bar on a buffer")
	}
	clock := p.start
	var mu sync.Mutex
	p.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }

	p.Add(100)
	if logs.Len() != 0 {
		t.Fatalf("logged before the interval: %s", logs.String())
	}
	advance(11 * time.Second)
	p.Add(150)
	line := logs.String()
	if !strings.Contains(line, "msg=progress") || !strings.Contains(line, "rows=250") || !strings.Contains(line, "percent=25") || !strings.Contains(line, `step="verify shop.orders"`) {
		t.Fatalf("progress line: %s", line)
	}
	advance(time.Second)
	p.Add(1) // within the interval: no line
	if strings.Count(logs.String(), "msg=progress") != 1 {
		t.Fatalf("too many lines: %s", logs.String())
	}
	p.Finish()
	if !strings.Contains(logs.String(), "msg=done") || !strings.Contains(logs.String(), "rows=251") {
		t.Fatalf("final line: %s", logs.String())
	}
	if out.Len() != 0 {
		t.Fatalf("wrote to a non-terminal: %q", out.String())
	}
}

func TestProgressUnknownTotal(t *testing.T) {
	var logs bytes.Buffer
	p := NewProgress(nil, "snapshot", -1, slog.New(slog.NewTextHandler(&logs, nil)))
	p.Add(7)
	p.Finish()
	if !strings.Contains(logs.String(), "rows=7") || strings.Contains(logs.String(), "percent") {
		t.Fatalf("unknown total: %s", logs.String())
	}
}
