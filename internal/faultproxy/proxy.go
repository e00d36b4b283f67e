// Package faultproxy is a TCP proxy on loopback that tests put between a
// client and a real server (Redis, etcd) to break the connection at a chosen
// moment: cut every connection, lose the reply to one request, refuse new
// connections, hold all traffic (a partition), or delay it.
//
// Faults are injected by what crosses the wire, not by hooks in the code
// under test, so the client library's own retries and reconnects run as
// they would in production.
package faultproxy

import (
	"bytes"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections accepted on Addr to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	links   map[*link]struct{}
	refuse  bool
	hold    bool
	latency time.Duration
	rules   []*rule
	barred  [][]byte      // cut a connection whose opening bytes contain one
	changed chan struct{} // closed and replaced when hold or latency changes
	closed  bool

	wg sync.WaitGroup
}

// rule loses the reply to the next request whose bytes contain pattern.
type rule struct {
	pattern []byte
	refuse  bool // refuse new connections once it fired
	fired   chan struct{}
}

// New listens on a free loopback port and forwards to target.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, links: map[*link]struct{}{}, changed: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port; point the client here.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops accepting, cuts every connection and waits for the proxy's
// goroutines. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.signalLocked()
	p.mu.Unlock()
	err := p.ln.Close()
	p.CutAll()
	p.wg.Wait()
	return err
}

// SetTarget sends new connections to target from now on, as when a name
// starts to resolve to a replaced server. Open connections keep theirs.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// CutAll closes every open connection, both sides, as a network failure
// would. New connections are still accepted unless Refuse says otherwise.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.cut()
	}
}

// Refuse makes the proxy close new connections as soon as it accepts them
// (on) or forward them again (off). Open connections are not touched.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
}

// Hold stops forwarding in both directions on every connection (on), as a
// partition that drops nothing but delivers nothing does, until it is
// turned off. Connections stay open; bytes wait in the proxy.
func (p *Proxy) Hold(on bool) {
	p.mu.Lock()
	p.hold = on
	p.signalLocked()
	p.mu.Unlock()
}

// Bar cuts every connection whose opening bytes (its first
// openingBytes) contain one of patterns, open ones now and new ones as
// their bytes arrive, until Bar is called again without it. A proxy in
// front of an etcd member's peer port bars one sender by its
// "X-Server-From" header: with that member's own port refused too, it
// is cut off from its peers both ways while its clients still reach it.
func (p *Proxy) Bar(patterns ...[]byte) {
	p.mu.Lock()
	p.barred = nil
	for _, b := range patterns {
		p.barred = append(p.barred, bytes.Clone(b))
	}
	var cut []*link
	for l := range p.links {
		l.mu.Lock()
		if p.barsLocked(l.opening) {
			cut = append(cut, l)
		}
		l.mu.Unlock()
	}
	p.mu.Unlock()
	for _, l := range cut {
		l.cut()
	}
}

// openingBytes is how much of a connection Bar looks at: an HTTP
// request's line and headers.
const openingBytes = 4 << 10

func (p *Proxy) barsLocked(opening []byte) bool {
	for _, b := range p.barred {
		if bytes.Contains(opening, b) {
			return true
		}
	}
	return false
}

// SetLatency delays every chunk forwarded in either direction by d.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.signalLocked()
	p.mu.Unlock()
}

// LoseReply arms a one-shot fault: the next request whose bytes contain
// pattern reaches the server, and its connection is cut before the
// server's reply reaches the client, as when a reply is lost in the
// network. The returned channel is closed when the fault fired.
func (p *Proxy) LoseReply(pattern []byte) <-chan struct{} {
	return p.addRule(pattern, false)
}

// LoseReplyAndRefuse is LoseReply, and from then on new connections are
// refused until Refuse(false): the client cannot reconnect at once.
func (p *Proxy) LoseReplyAndRefuse(pattern []byte) <-chan struct{} {
	return p.addRule(pattern, true)
}

func (p *Proxy) addRule(pattern []byte, refuse bool) <-chan struct{} {
	r := &rule{pattern: bytes.Clone(pattern), refuse: refuse, fired: make(chan struct{})}
	p.mu.Lock()
	p.rules = append(p.rules, r)
	p.mu.Unlock()
	return r.fired
}

// match takes the first armed rule whose pattern is in b.
func (p *Proxy) match(b []byte) *rule {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, r := range p.rules {
		if bytes.Contains(b, r.pattern) {
			p.rules = append(p.rules[:i], p.rules[i+1:]...)
			if r.refuse {
				p.refuse = true
			}
			return r
		}
	}
	return nil
}

func (p *Proxy) signalLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// gate blocks while traffic is held and then waits out the latency. It
// returns false when the proxy or the link closed meanwhile.
func (p *Proxy) gate(l *link) bool {
	for {
		p.mu.Lock()
		hold, lat, changed, closed := p.hold, p.latency, p.changed, p.closed
		p.mu.Unlock()
		if closed {
			return false
		}
		if hold {
			select {
			case <-changed:
				continue
			case <-l.done:
				return false
			}
		}
		if lat > 0 {
			t := time.NewTimer(lat)
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
				return false
			}
		}
		return true
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse, closed, target := p.refuse, p.closed, p.target
		p.mu.Unlock()
		if refuse || closed {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		l := &link{client: c, server: s, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.cut()
			continue
		}
		p.links[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pump(l, true)
		go p.pump(l, false)
	}
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	done           chan struct{}
	once           sync.Once

	mu       sync.Mutex
	loseNext *rule  // cut instead of forwarding the server's next bytes
	opening  []byte // the client's first openingBytes, for Bar
}

func (l *link) cut() {
	l.once.Do(func() {
		close(l.done)
		l.client.Close()
		l.server.Close()
	})
}

// barOpening records the client's opening bytes and reports whether Bar
// cuts the link for them.
func (p *Proxy) barOpening(l *link, chunk []byte) bool {
	l.mu.Lock()
	if len(l.opening) >= openingBytes {
		l.mu.Unlock()
		return false
	}
	l.opening = append(l.opening, chunk[:min(len(chunk), openingBytes-len(l.opening))]...)
	opening := l.opening
	l.mu.Unlock()
	p.mu.Lock()
	barred := p.barsLocked(opening)
	p.mu.Unlock()
	return barred
}

// pump copies one direction of a link until either side closes.
func (p *Proxy) pump(l *link, up bool) {
	defer p.wg.Done()
	defer func() {
		l.cut()
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	src, dst := l.server, l.client
	if up {
		src, dst = l.client, l.server
	}
	buf := make([]byte, 32<<10)
	var tail []byte // the end of the previous chunk, so a pattern split across reads matches
	for {
		n, err := src.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if !p.gate(l) {
				return
			}
			if up && p.barOpening(l, chunk) {
				return
			}
			if up {
				if r := p.match(append(tail, chunk...)); r != nil {
					l.mu.Lock()
					l.loseNext = r
					l.mu.Unlock()
				}
				tail = append(tail[:0], chunk[max(0, n-256):]...)
			} else {
				l.mu.Lock()
				r := l.loseNext
				l.mu.Unlock()
				if r != nil {
					l.cut()
					close(r.fired)
					return
				}
			}
			if _, werr := dst.Write(chunk); werr != nil {
				return
			}
		}
		if err != nil { // EOF or a cut: the link is over either way
			return
		}
	}
}
