package harness

import (
	"bytes"
	"sync"

	"github.com/Shopify/toxiproxy/v2/toxics"
)

// Capture records the bytes that cross a FaultProxy in one direction (a
// toxiproxy toxic that copies each chunk and passes it on unchanged), so a
// test can look at what a connection carries on the wire.
type Capture struct {
	proxy *FaultProxy
	name  string
}

var (
	capMu   sync.Mutex
	capBufs = map[string]*bytes.Buffer{}
	capOnce sync.Once
)

// captureToxic is the toxic behind Capture; Tap names its buffer.
type captureToxic struct {
	Tap string `json:"tap"`
}

func (c *captureToxic) Pipe(stub *toxics.ToxicStub) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case chunk := <-stub.Input:
			if chunk == nil {
				stub.Close()
				return
			}
			capMu.Lock()
			if b := capBufs[c.Tap]; b != nil {
				b.Write(chunk.Data)
			}
			capMu.Unlock()
			stub.Output <- chunk
		}
	}
}

// Capture starts recording stream ("downstream": database → client, or
// "upstream") of every connection through the proxy.
func (f *FaultProxy) Capture(stream string) (*Capture, error) {
	capOnce.Do(func() { toxics.Register("tm_capture", new(captureToxic)) })
	name := "capture_" + f.name + "_" + stream
	capMu.Lock()
	capBufs[name] = &bytes.Buffer{}
	capMu.Unlock()
	if err := f.Add(Toxic{Name: name, Type: "tm_capture", Stream: stream, Attributes: map[string]any{"tap": name}}); err != nil {
		return nil, err
	}
	return &Capture{proxy: f, name: name}, nil
}

// Bytes returns a copy of what was recorded so far.
func (c *Capture) Bytes() []byte {
	capMu.Lock()
	defer capMu.Unlock()
	return bytes.Clone(capBufs[c.name].Bytes())
}

// Stop removes the toxic and forgets the recording.
func (c *Capture) Stop() {
	_ = c.proxy.Remove(c.name)
	capMu.Lock()
	delete(capBufs, c.name)
	capMu.Unlock()
}
