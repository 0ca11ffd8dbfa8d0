package netproxy

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// echo serves an echo server on 127.0.0.1 until the test ends.
func echo(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

// roundTrip writes a line and reads it back within d.
func roundTrip(c net.Conn, d time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	_, err := bufio.NewReader(c).ReadString('\n')
	return err
}

func TestProxy(t *testing.T) {
	if _, err := New("10.0.0.1:5432"); err == nil {
		t.Fatal("proxy to a non-127.0.0.1 target accepted")
	}
	p, err := New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(c, time.Second); err != nil {
		t.Fatalf("open proxy: %v", err)
	}

	// Blackhole: nothing passes, then the held bytes flow after Heal.
	p.Cut(true)
	if err := roundTrip(c, 200*time.Millisecond); err == nil {
		t.Fatal("bytes passed a blackholed proxy")
	}
	p.Heal()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		t.Fatalf("held bytes not delivered after heal: %v", err)
	}

	// Reset: the live connection and new ones are closed.
	p.Cut(false)
	if err := roundTrip(c, time.Second); err == nil {
		t.Fatal("connection survived a reset")
	}
	if c2, err := net.Dial("tcp", p.Addr()); err == nil {
		if roundTrip(c2, time.Second) == nil {
			t.Fatal("new connection passed a reset proxy")
		}
		c2.Close()
	}
	p.Heal()
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if err := roundTrip(c3, time.Second); err != nil {
		t.Fatalf("healed proxy: %v", err)
	}
}

// The scanner tells COMMITs in a client's stream, split anywhere, and what
// their transactions ran, prepared statements included.
func TestScannerFindsCommits(t *testing.T) {
	msg := func(typ byte, body string) []byte {
		b := []byte{typ, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], uint32(len(body)+4))
		return append(b, body...)
	}
	untyped := func(code uint32, rest string) []byte {
		b := make([]byte, 8)
		binary.BigEndian.PutUint32(b, uint32(8+len(rest)))
		binary.BigEndian.PutUint32(b[4:], code)
		return append(b, rest...)
	}
	stream := func(msgs ...[]byte) []byte {
		b := append(untyped(sslRequest, ""), untyped(196608, "user\x00chaos\x00\x00")...)
		for _, m := range msgs {
			b = append(b, m...)
		}
		return b
	}
	insert := append(append(msg('P', "s1\x00INSERT INTO effect VALUES ($1)\x00\x00\x00"), msg('S', "")...), msg('B', "\x00s1\x00\x00\x00")...)
	for _, tc := range []struct {
		name   string
		stream []byte
		want   string // what the last COMMIT's transaction ran; "-": no COMMIT
	}{
		{"none", stream(msg('Q', "SELECT 1\x00")), "-"},
		{"simple", stream(msg('Q', "BEGIN\x00"), msg('Q', "SELECT 1\x00"), msg('Q', "COMMIT\x00")), "SELECT 1"},
		{"cockroach", stream(msg('Q', "BEGIN\x00"), msg('Q', "RELEASE SAVEPOINT cockroach_restart; COMMIT\x00")), ""},
		{"prepared", stream(msg('Q', "BEGIN\x00"), insert, msg('Q', "COMMIT\x00")), "INSERT INTO effect VALUES ($1)"},
	} {
		for split := 1; split <= len(tc.stream); split++ {
			sc := &scanner{startup: true, prepared: map[string]string{}}
			got := "-"
			for i := 0; i < len(tc.stream); i += split {
				if ran, ok := sc.scan(tc.stream[i:min(i+split, len(tc.stream))]); ok {
					got = strings.Join(ran, "; ")
				}
			}
			if got != tc.want {
				t.Errorf("%s, chunks of %d: %q, want %q", tc.name, split, got, tc.want)
			}
		}
	}
}
