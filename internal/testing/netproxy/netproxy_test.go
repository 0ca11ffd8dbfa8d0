package netproxy

import (
	"bufio"
	"io"
	"net"
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
