package main

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
)

func TestMetricsConfig(t *testing.T) {
	if c := (MetricsConfig{}).withDefaults(); c.Listen != DefaultMetricsListen || !strings.HasPrefix(c.Listen, "127.0.0.1:") {
		t.Fatalf("default listen %q must be loopback", c.Listen)
	}
	if err := (MetricsConfig{Listen: "9650"}).Validate(); err == nil || !strings.Contains(err.Error(), "metrics.listen") {
		t.Fatalf("bad listen accepted: %v", err)
	}
	if err := (MetricsConfig{Listen: "off"}).Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := NewMetrics().Serve(ctx, MetricsConfig{Listen: "off"}, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	// A listen error is returned, not logged and ignored.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	if err := NewMetrics().Serve(context.Background(), MetricsConfig{Listen: ln.Addr().String()}, slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("listening on a busy port succeeded")
	}
}
