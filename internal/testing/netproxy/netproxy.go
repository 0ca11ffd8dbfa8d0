package netproxy

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// Proxy is a TCP proxy from a local port to one 127.0.0.1 address, which
// the harness can cut to partition one worker from the database.
//
// Cut(false) resets: live connections are closed and new ones are closed on
// accept, as if the peer sent RSTs. Cut(true) blackholes: connections stay
// open but no byte is forwarded (and new connections are not dialed) until
// Heal, when the queued bytes flow again, as after a healed partition.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	state  proxyState
	gate   chan struct{} // closed while the proxy is open
	links  map[*link]struct{}
	closed bool
	wg     sync.WaitGroup
}

type proxyState int

const (
	proxyOpen proxyState = iota
	proxyReset
	proxyBlackhole
)

// link is one proxied connection.
type link struct {
	client net.Conn
	done   chan struct{}

	mu     sync.Mutex
	server net.Conn
	closed bool
}

func (l *link) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	close(l.done)
	l.client.Close()
	if l.server != nil {
		l.server.Close()
	}
}

// setServer attaches the dialed server side; it reports false (and closes
// s) if the link was closed meanwhile.
func (l *link) setServer(s net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		s.Close()
		return false
	}
	l.server = s
	return true
}

// New listens on a free 127.0.0.1 port and forwards to target, which
// must be a 127.0.0.1 address.
func New(target string) (*Proxy, error) {
	host, _, err := net.SplitHostPort(target)
	if err != nil || host != "127.0.0.1" {
		return nil, fmt.Errorf("netproxy: target %q is not on 127.0.0.1", target)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	gate := make(chan struct{})
	close(gate)
	p := &Proxy{ln: ln, target: target, gate: gate, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// ForDSN returns a proxy to the server of dsn (a URL on 127.0.0.1),
// closed when t ends, and dsn through it. It skips t if the server cannot
// be proxied (it is not on 127.0.0.1).
func ForDSN(t testing.TB, dsn string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("netproxy: DSN is not a URL: %v", err)
	}
	p, err := New(u.Host)
	if err != nil {
		t.Skipf("cannot proxy the test server: %v", err)
	}
	t.Cleanup(p.Close)
	u.Host = p.Addr()
	return p, u.String()
}

// Addr returns the proxy's listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut partitions the proxy: blackhole or reset (see Proxy).
func (p *Proxy) Cut(blackhole bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if blackhole {
		p.state = proxyBlackhole
		select {
		case <-p.gate: // open: close it; a gate already shut stays the one waiters hold
			p.gate = make(chan struct{})
		default:
		}
		return
	}
	p.state = proxyReset
	for l := range p.links {
		l.close()
	}
}

// Heal ends a partition.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
	p.state = proxyOpen
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.ln.Close()
	for l := range p.links {
		l.close()
	}
	p.mu.Unlock()
	p.Heal()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		l := &link{client: c, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed || p.state == proxyReset {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(l)
	}
}

// serve dials the target (once the proxy is open) and copies both ways.
func (p *Proxy) serve(l *link) {
	defer p.wg.Done()
	defer func() {
		l.close()
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	if !p.waitOpen(l) {
		return
	}
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !l.setServer(s) {
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.copy(l, s, l.client) }()
	go func() { defer wg.Done(); p.copy(l, l.client, s) }()
	wg.Wait()
}

// copy forwards src to dst, holding every chunk while blackholed.
func (p *Proxy) copy(l *link, dst io.Writer, src io.Reader) {
	defer l.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitOpen(l) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// waitOpen blocks while the proxy is blackholed; it reports false if the
// link was closed meanwhile.
func (p *Proxy) waitOpen(l *link) bool {
	p.mu.Lock()
	gate := p.gate
	p.mu.Unlock()
	select {
	case <-gate:
	case <-l.done:
		return false
	}
	select {
	case <-l.done:
		return false
	default:
		return true
	}
}
