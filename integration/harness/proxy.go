package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// FaultProxy is an in-process TCP fault proxy (Shopify's toxiproxy, used as
// a library) between tidemark and one database. Point the daemon at Addr;
// add and remove toxics while it runs. Toxics apply to open connections and
// to new ones alike.
type FaultProxy struct {
	// Addr is the proxy's listening address (127.0.0.1, a random port).
	Addr string
	// Upstream is the database's address.
	Upstream string

	proxy *toxiproxy.Proxy
	mu    sync.Mutex
	names map[string]bool
}

var (
	toxiServerOnce sync.Once
	toxiServer     *toxiproxy.ApiServer
)

// NewFaultProxy starts a proxy to upstream on a random loopback port. Stop
// it with Close.
func NewFaultProxy(name, upstream string) (*FaultProxy, error) {
	toxiServerOnce.Do(func() {
		// No HTTP API is started: the server only carries the logger and
		// (disabled) metrics the proxies need. Some toxics log through
		// zerolog's global logger: silence it.
		zerolog.SetGlobalLevel(zerolog.Disabled)
		toxiServer = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	})
	p := toxiproxy.NewProxy(toxiServer, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("start fault proxy %s to %s: %w", name, upstream, err)
	}
	return &FaultProxy{Addr: p.Listen, Upstream: upstream, proxy: p, names: map[string]bool{}}, nil
}

// Close stops the proxy and closes every connection through it.
func (f *FaultProxy) Close() { f.proxy.Stop() }

// Toxic is one fault: Type is a toxiproxy toxic ("latency", "bandwidth",
// "timeout", "reset_peer", "slicer", "limit_data", "slow_close"), Stream is
// "downstream" (database → tidemark, the default) or "upstream".
type Toxic struct {
	Name       string
	Type       string
	Stream     string
	Attributes map[string]any
}

// Add installs a toxic (on existing and new connections).
func (f *FaultProxy) Add(t Toxic) error {
	if t.Stream == "" {
		t.Stream = "downstream"
	}
	if t.Name == "" {
		t.Name = t.Type + "_" + t.Stream
	}
	body, err := json.Marshal(map[string]any{"name": t.Name, "type": t.Type, "stream": t.Stream, "toxicity": 1.0, "attributes": t.Attributes})
	if err != nil {
		return err
	}
	if _, err := f.proxy.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
		return fmt.Errorf("add toxic %s to proxy %s: %w", t.Name, f.proxy.Name, err)
	}
	f.mu.Lock()
	f.names[t.Name] = true
	f.mu.Unlock()
	return nil
}

// Remove removes a toxic by name.
func (f *FaultProxy) Remove(name string) error {
	f.mu.Lock()
	delete(f.names, name)
	f.mu.Unlock()
	if err := f.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
		return fmt.Errorf("remove toxic %s from proxy %s: %w", name, f.proxy.Name, err)
	}
	return nil
}

// RemoveAll removes every toxic this FaultProxy added.
func (f *FaultProxy) RemoveAll() {
	f.mu.Lock()
	names := make([]string, 0, len(f.names))
	for n := range f.names {
		names = append(names, n)
	}
	f.names = map[string]bool{}
	f.mu.Unlock()
	for _, n := range names {
		_ = f.proxy.Toxics.RemoveToxic(context.Background(), n)
	}
}

// ResetAll closes every connection through the proxy at once (both
// directions), as a network reset would; new connections are accepted.
func (f *FaultProxy) ResetAll() error {
	// Disabling and re-enabling a proxy closes all of its links; the
	// listening address is kept.
	listen := f.proxy.Listen
	if err := f.proxy.Update(&toxiproxy.Proxy{Listen: listen, Upstream: f.Upstream, Enabled: false}); err != nil {
		return err
	}
	return f.proxy.Update(&toxiproxy.Proxy{Listen: listen, Upstream: f.Upstream, Enabled: true})
}

// Retarget points the proxy at another upstream (a failover behind a fixed
// address): it stops the proxy, which closes every open connection, and
// starts it again on the same address.
func (f *FaultProxy) Retarget(upstream string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.proxy.Stop()
	f.proxy.Upstream = upstream
	f.Upstream = upstream
	if err := f.proxy.Start(); err != nil {
		return fmt.Errorf("restart fault proxy %s to %s: %w", f.proxy.Name, upstream, err)
	}
	return nil
}
