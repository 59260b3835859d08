package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"sync"
	"syscall"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// FaultProxy is an in-process TCP fault proxy between tidemark and one
// database: Shopify's toxiproxy, used as a library, behind a plain
// forwarder that owns the listening address. Point the daemon at Addr; add
// and remove toxics while it runs. Toxics apply to open connections and to
// new ones alike.
//
// Why the forwarder: toxiproxy 2.5.0 (the newest the module proxy serves)
// can deadlock when a toxic is added or removed while a connection is
// closing (Shopify/toxiproxy#558, #427): the collection's lock is held
// while a stub is interrupted, the stub is blocked handing a chunk to a
// link whose writer has stopped, and that writer waits for the same lock
// to unregister itself. Nothing ever returns: every later toxic change and
// every new connection hangs (a CI run lost 17 minutes to it, then the
// package's timeout). So each change runs under a watchdog; a change that
// does not finish within toxicChangeTimeout replaces the wedged toxiproxy
// with a new one carrying the intended toxics, and closes every connection
// through the old one (what a client sees is a network reset, which is a
// fault these tests already inject). The replacement is logged, and
// counted by Replaced.
type FaultProxy struct {
	// Addr is the proxy's listening address (127.0.0.1, a random port).
	Addr string

	name string
	ln   net.Listener
	// ops makes toxic changes one at a time, so the intended set and the
	// toxiproxy's agree.
	ops sync.Mutex

	mu       sync.Mutex
	upstream string
	cur      *toxiproxy.Proxy
	toxics   []Toxic // the intended set, in the order added
	conns    map[*splice]bool
	replaced int
	closed   bool
}

var (
	toxiServerOnce sync.Once
	toxiServer     *toxiproxy.ApiServer
	// toxicChangeTimeout bounds one toxic change. A healthy change takes
	// at most about 5 s (toxiproxy flushes a removed toxic's queue with a
	// 5 s bound per link, the links in parallel).
	toxicChangeTimeout = 15 * time.Second
	errWedged          = errors.New("toxiproxy wedged")
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
	cur, err := startToxiproxy(name, upstream, nil)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		go cur.Stop()
		return nil, fmt.Errorf("listen for fault proxy %s: %w", name, err)
	}
	f := &FaultProxy{Addr: ln.Addr().String(), name: name, ln: ln, upstream: upstream, cur: cur, conns: map[*splice]bool{}}
	go f.serve()
	return f, nil
}

// startToxiproxy starts a toxiproxy to upstream on a random loopback port
// with toxics installed. It has no connection yet, so installing cannot
// wedge.
func startToxiproxy(name, upstream string, toxics []Toxic) (*toxiproxy.Proxy, error) {
	p := toxiproxy.NewProxy(toxiServer, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("start fault proxy %s to %s: %w", name, upstream, err)
	}
	for _, t := range toxics {
		if _, err := p.Toxics.AddToxicJson(bytes.NewReader(t.json())); err != nil {
			go p.Stop()
			return nil, fmt.Errorf("add toxic %s to proxy %s: %w", t.Name, name, err)
		}
	}
	return p, nil
}

// Close stops the proxy and closes every connection through it.
func (f *FaultProxy) Close() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	cur, conns := f.cur, f.takeConns()
	f.mu.Unlock()
	_ = f.ln.Close()
	closeAll(conns)
	stopWithin(cur, 5*time.Second)
}

// Replaced is how many times a wedged toxiproxy was replaced.
func (f *FaultProxy) Replaced() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.replaced
}

// Toxic is one fault: Type is a toxiproxy toxic ("latency", "bandwidth",
// "timeout", "reset_peer", "slicer", "limit_data", "slow_close"), Stream is
// "downstream" (database → tidemark, the default) or "upstream".
type Toxic struct {
	Name       string
	Type       string
	Stream     string
	Attributes map[string]any
}

func (t Toxic) json() []byte {
	// A map of strings and JSON values: Marshal cannot fail on it unless an
	// attribute is not JSON, which toxiproxy would refuse anyway.
	b, _ := json.Marshal(map[string]any{"name": t.Name, "type": t.Type, "stream": t.Stream, "toxicity": 1.0, "attributes": t.Attributes})
	return b
}

// Add installs a toxic (on existing and new connections).
func (f *FaultProxy) Add(t Toxic) error {
	if t.Stream == "" {
		t.Stream = "downstream"
	}
	if t.Name == "" {
		t.Name = t.Type + "_" + t.Stream
	}
	if _, err := json.Marshal(t.Attributes); err != nil {
		return fmt.Errorf("add toxic %s to proxy %s: %w", t.Name, f.name, err)
	}
	f.ops.Lock()
	defer f.ops.Unlock()
	f.mu.Lock()
	cur, at := f.cur, f.find(t.Name)
	f.mu.Unlock()
	if at >= 0 {
		return fmt.Errorf("add toxic %s to proxy %s: %w", t.Name, f.name, toxiproxy.ErrToxicAlreadyExists)
	}
	err := f.within("add toxic "+t.Name, func() error {
		_, err := cur.Toxics.AddToxicJson(bytes.NewReader(t.json()))
		return err
	})
	if err != nil && !errors.Is(err, errWedged) {
		return fmt.Errorf("add toxic %s to proxy %s: %w", t.Name, f.name, err)
	}
	f.mu.Lock()
	f.toxics = append(f.toxics, t)
	f.mu.Unlock()
	if err != nil {
		return f.replace("add toxic " + t.Name)
	}
	return nil
}

// Remove removes a toxic by name.
func (f *FaultProxy) Remove(name string) error {
	f.ops.Lock()
	defer f.ops.Unlock()
	f.mu.Lock()
	cur, at := f.cur, f.find(name)
	f.mu.Unlock()
	if at < 0 {
		return fmt.Errorf("remove toxic %s from proxy %s: %w", name, f.name, toxiproxy.ErrToxicNotFound)
	}
	err := f.within("remove toxic "+name, func() error { return cur.Toxics.RemoveToxic(context.Background(), name) })
	if err != nil && !errors.Is(err, errWedged) {
		return fmt.Errorf("remove toxic %s from proxy %s: %w", name, f.name, err)
	}
	f.mu.Lock()
	f.toxics = append(f.toxics[:at:at], f.toxics[at+1:]...)
	f.mu.Unlock()
	if err != nil {
		return f.replace("remove toxic " + name)
	}
	return nil
}

// RemoveAll removes every toxic this FaultProxy added.
func (f *FaultProxy) RemoveAll() {
	f.mu.Lock()
	names := make([]string, 0, len(f.toxics))
	for _, t := range f.toxics {
		names = append(names, t.Name)
	}
	f.mu.Unlock()
	for _, n := range names {
		_ = f.Remove(n)
	}
}

// ResetAll closes every connection through the proxy at once (both
// directions), as a network reset would; new connections are accepted.
func (f *FaultProxy) ResetAll() error {
	f.mu.Lock()
	conns := f.takeConns()
	f.mu.Unlock()
	closeAll(conns)
	return nil
}

// Retarget points the proxy at another upstream (a failover behind a fixed
// address): every open connection is closed, new ones go to upstream.
func (f *FaultProxy) Retarget(upstream string) error {
	f.ops.Lock()
	defer f.ops.Unlock()
	return f.swap(upstream, true)
}

// within runs one toxic change, giving up on it after toxicChangeTimeout
// (it is then left blocked for good, with the toxiproxy it wedged).
func (f *FaultProxy) within(what string, change func() error) error {
	done := make(chan error, 1)
	go func() { done <- change() }()
	t := time.NewTimer(toxicChangeTimeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		log.Printf("fault proxy %s: %s did not finish within %s: toxiproxy is wedged (Shopify/toxiproxy#558); replacing it, which closes every open connection through it",
			f.name, what, toxicChangeTimeout)
		return errWedged
	}
}

// replace swaps the wedged toxiproxy for a new one with the intended
// toxics. The caller holds ops.
func (f *FaultProxy) replace(what string) error {
	f.mu.Lock()
	f.replaced++
	upstream := f.upstream
	f.mu.Unlock()
	if err := f.swap(upstream, false); err != nil {
		return fmt.Errorf("%s on proxy %s: replace the wedged toxiproxy: %w", what, f.name, err)
	}
	return nil
}

// swap starts a new toxiproxy to upstream with the intended toxics, sends
// new connections to it, and closes every connection through the old one.
// wait: wait (a while) for the old one to stop. The caller holds ops.
func (f *FaultProxy) swap(upstream string, wait bool) error {
	f.mu.Lock()
	toxics := append([]Toxic(nil), f.toxics...)
	f.mu.Unlock()
	next, err := startToxiproxy(f.name, upstream, toxics)
	if err != nil {
		return err
	}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		go next.Stop()
		return fmt.Errorf("retarget fault proxy %s: closed", f.name)
	}
	old, conns := f.cur, f.takeConns()
	f.cur, f.upstream = next, upstream
	f.mu.Unlock()
	closeAll(conns)
	// A wedged toxiproxy never finishes stopping (its accept loop may wait
	// for the lock); its listener is closed all the same.
	if wait {
		stopWithin(old, 5*time.Second)
	} else {
		go old.Stop()
	}
	return nil
}

func (f *FaultProxy) find(name string) int {
	for i, t := range f.toxics {
		if t.Name == name {
			return i
		}
	}
	return -1
}

// takeConns empties the set of open connections. The caller holds mu.
func (f *FaultProxy) takeConns() []*splice {
	conns := make([]*splice, 0, len(f.conns))
	for s := range f.conns {
		conns = append(conns, s)
	}
	f.conns = map[*splice]bool{}
	return conns
}

func closeAll(conns []*splice) {
	for _, s := range conns {
		s.close(false)
	}
}

func stopWithin(p *toxiproxy.Proxy, d time.Duration) {
	done := make(chan struct{})
	go func() { p.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
}

func (f *FaultProxy) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return // closed
		}
		go f.forward(c)
	}
}

// splice is one client connection and its connection to the toxiproxy.
type splice struct {
	client, up net.Conn
	once       sync.Once
}

// close closes both sides; reset sends an RST to the client (the
// toxiproxy reset its side: a reset_peer toxic).
func (s *splice) close(reset bool) {
	s.once.Do(func() {
		if reset {
			for _, c := range []net.Conn{s.client, s.up} {
				if tc, ok := c.(*net.TCPConn); ok {
					_ = tc.SetLinger(0)
				}
			}
		}
		_ = s.client.Close()
		_ = s.up.Close()
	})
}

// forward carries one client connection through the current toxiproxy
// until either side ends; then both are closed, as toxiproxy closes both
// sides of a link.
func (f *FaultProxy) forward(client net.Conn) {
	f.mu.Lock()
	cur := f.cur
	f.mu.Unlock()
	up, err := net.DialTimeout("tcp", cur.Listen, 5*time.Second)
	if err != nil {
		_ = client.Close()
		return
	}
	s := &splice{client: client, up: up}
	f.mu.Lock()
	if f.closed || f.cur != cur { // closed or replaced while dialing
		f.mu.Unlock()
		s.close(false)
		return
	}
	f.conns[s] = true
	f.mu.Unlock()
	done := make(chan bool, 2)
	go func() { done <- copyReset(up, client) }()
	go func() { done <- copyReset(client, up) }()
	s.close(<-done)
	<-done
	f.mu.Lock()
	delete(f.conns, s)
	f.mu.Unlock()
}

// copyReset copies src to dst and says whether it ended on a reset.
func copyReset(dst, src net.Conn) bool {
	_, err := io.Copy(dst, src)
	return errors.Is(err, syscall.ECONNRESET)
}
