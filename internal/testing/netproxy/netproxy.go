package netproxy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strings"
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

	mu       sync.Mutex
	onCommit func(serverPort int) (after func()) // armed by OnCommit, one-shot
	marker   string                              // of the armed OnCommit
	state    proxyState
	gate     chan struct{} // closed while the proxy is open
	links    map[*link]struct{}
	closed   bool
	wg       sync.WaitGroup
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

// OnCommit arms the proxy for the next COMMIT a client sends through it
// (a simple query with a COMMIT statement) of a transaction that ran a
// statement containing marker in its first bytes ("": any): fn is called
// with the local port of that link's server side (pg_stat_activity's
// client_port) before the bytes holding the COMMIT are forwarded, and the
// function it returns, if not nil, right after. fn may Cut the proxy: a
// blackhole then holds the COMMIT until Heal, as a network that stalls
// exactly as a commit is sent. It fires once; a new call replaces an
// armed fn, and a nil fn disarms.
func (p *Proxy) OnCommit(marker string, fn func(serverPort int) (after func())) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onCommit, p.marker = fn, marker
}

// commitHook disarms and returns the armed OnCommit function, if the
// transaction that ran statements ran is the one it waits for.
func (p *Proxy) commitHook(ran []string) func(int) func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.onCommit == nil || (p.marker != "" && !slices.ContainsFunc(ran, func(q string) bool { return strings.Contains(q, p.marker) })) {
		return nil
	}
	fn := p.onCommit
	p.onCommit = nil
	return fn
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
	port := s.LocalAddr().(*net.TCPAddr).Port
	go func() {
		defer wg.Done()
		p.copy(l, s, l.client, &scanner{startup: true, prepared: map[string]string{}}, port)
	}()
	go func() { defer wg.Done(); p.copy(l, l.client, s, nil, 0) }()
	wg.Wait()
}

// copy forwards src to dst, holding every chunk while blackholed. The
// client's side is scanned (sc) for COMMITs (OnCommit), port being the
// link's server-side port.
func (p *Proxy) copy(l *link, dst io.Writer, src io.Reader, sc *scanner, port int) {
	defer l.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			var after func()
			if ran, ok := sc.scan(buf[:n]); ok {
				if fn := p.commitHook(ran); fn != nil {
					after = fn(port)
				}
			}
			if !p.waitOpen(l) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if after != nil {
				after()
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

// scanner follows the messages of a client's side of the PostgreSQL
// protocol, to tell COMMITs and what their transactions ran: after the
// untyped start-up packets (an SSLRequest or GSSENCRequest is followed by
// another), each message is a type byte, a length that counts itself, and
// a body. A nil scanner scans nothing.
type scanner struct {
	startup  bool
	hdr      []byte // the header read so far
	typ      byte
	left     int               // body bytes to come
	head     []byte            // the first bytes of a Query, Parse or Bind body
	prepared map[string]string // the first bytes of each prepared statement's text
	ran      []string          // the first bytes of the statements run since BEGIN
}

// Start-up codes followed by another start-up packet.
const (
	sslRequest    = 80877103
	gssencRequest = 80877104
)

// headLen is how much of a statement the scanner keeps.
const headLen = 160

// maxRan bounds the statements kept per transaction.
const maxRan = 64

// scan consumes chunk and reports whether a COMMIT message began in it,
// and what the last such COMMIT's transaction ran.
func (s *scanner) scan(chunk []byte) (ran []string, commit bool) {
	if s == nil {
		return nil, false
	}
	for len(chunk) > 0 {
		if s.left == 0 && len(s.hdr) < s.hdrLen() {
			k := min(s.hdrLen()-len(s.hdr), len(chunk))
			s.hdr = append(s.hdr, chunk[:k]...)
			chunk = chunk[k:]
			if len(s.hdr) < s.hdrLen() {
				return ran, commit
			}
			n := int(binary.BigEndian.Uint32(s.hdr[len(s.hdr)-4:])) - 4
			if s.startup {
				s.typ = 0
			} else {
				s.typ = s.hdr[0]
			}
			s.left, s.head = max(n, 0), s.head[:0]
			if s.left == 0 {
				s.hdr = s.hdr[:0]
			}
			continue
		}
		k := min(s.left, len(chunk))
		s.head = append(s.head, chunk[:min(k, headLen-len(s.head))]...)
		chunk, s.left = chunk[k:], s.left-k
		if s.left == 0 {
			if s.ended() {
				ran, commit, s.ran = s.ran, true, nil
			}
			s.hdr = s.hdr[:0]
		}
	}
	return ran, commit
}

func (s *scanner) hdrLen() int {
	if s.startup {
		return 4
	}
	return 5
}

// ended notes the message just read, and reports whether it is a COMMIT.
func (s *scanner) ended() bool {
	fields := bytes.SplitN(s.head, []byte{0}, 3)
	switch s.typ {
	case 0:
		if len(s.head) < 4 || !slices.Contains([]uint32{sslRequest, gssencRequest}, binary.BigEndian.Uint32(s.head)) {
			s.startup = false
		}
	case 'Q':
		q := string(fields[0])
		if isCommit(q) {
			return true
		}
		if strings.HasPrefix(strings.ToUpper(strings.TrimSpace(q)), "BEGIN") {
			s.ran = nil
			return false
		}
		s.run(q)
	case 'P': // statement name, query
		if len(fields) > 1 {
			s.prepared[string(fields[0])] = string(fields[1])
		}
	case 'B': // portal, statement name
		if len(fields) > 1 {
			s.run(s.prepared[string(fields[1])])
		}
	}
	return false
}

func (s *scanner) run(q string) {
	if len(s.ran) < maxRan {
		s.ran = append(s.ran, q)
	}
}

// isCommit reports whether simple query q holds a COMMIT statement
// ("RELEASE SAVEPOINT x; COMMIT" too).
func isCommit(q string) bool {
	for part := range strings.SplitSeq(q, ";") {
		if part = strings.TrimSpace(part); len(part) >= 6 && strings.EqualFold(part[:6], "COMMIT") {
			return true
		}
	}
	return false
}
