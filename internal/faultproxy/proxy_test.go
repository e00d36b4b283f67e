package faultproxy_test

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/faultproxy"
)

// echo serves a line echo on loopback until the test ends.
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
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					c.Write([]byte("echo " + line))
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func dial(t *testing.T, p *faultproxy.Proxy) (net.Conn, *bufio.Reader) {
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}

func TestLoseReplyCutsBeforeTheReply(t *testing.T) {
	p, err := faultproxy.New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, r := dial(t, p)
	c.Write([]byte("one\n"))
	if got, err := r.ReadString('\n'); err != nil || got != "echo one\n" {
		t.Fatalf("before the fault: %q, %v", got, err)
	}
	fired := p.LoseReply([]byte("two"))
	c.Write([]byte("two\n"))
	if got, err := r.ReadString('\n'); err == nil {
		t.Fatalf("the reply to the armed request arrived: %q", got)
	}
	<-fired
	c2, r2 := dial(t, p)
	c2.Write([]byte("two\n"))
	if got, err := r2.ReadString('\n'); err != nil || got != "echo two\n" {
		t.Fatalf("a one-shot fault fired twice: %q, %v", got, err)
	}
}

func TestRefuseAndHold(t *testing.T) {
	p, err := faultproxy.New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Refuse(true)
	_, r := dial(t, p)
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("a refused connection stayed open")
	}
	p.Refuse(false)

	c, r := dial(t, p)
	p.Hold(true)
	c.Write([]byte("held\n"))
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("bytes crossed a held proxy")
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	p.Hold(false)
	if got, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(got, "echo held") {
		t.Fatalf("after the hold: %q, %v", got, err)
	}
	p.CutAll()
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("CutAll left a connection open")
	}
}

// TestBarCutsBySender: Bar cuts an open connection whose opening bytes
// name the barred sender, and each new one as soon as they arrive; other
// senders' connections forward; Bar() lets the sender through again.
func TestBarCutsBySender(t *testing.T) {
	p, err := faultproxy.New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	roundTrip := func(c net.Conn, r *bufio.Reader, line string) error {
		if _, err := c.Write([]byte(line + "\n")); err != nil {
			return err
		}
		got, err := r.ReadString('\n')
		if err == nil && got != "echo "+line+"\n" {
			t.Fatalf("got %q for %q", got, line)
		}
		return err
	}
	open, openR := dial(t, p)
	if err := roundTrip(open, openR, "X-Server-From: a"); err != nil {
		t.Fatal(err)
	}
	other, otherR := dial(t, p)
	if err := roundTrip(other, otherR, "X-Server-From: b"); err != nil {
		t.Fatal(err)
	}
	p.Bar([]byte("X-Server-From: a"))
	if err := roundTrip(open, openR, "more"); err == nil {
		t.Fatal("a's open connection still forwards after Bar")
	}
	fresh, freshR := dial(t, p)
	if err := roundTrip(fresh, freshR, "X-Server-From: a"); err == nil {
		t.Fatal("a's new connection forwards while barred")
	}
	if err := roundTrip(other, otherR, "still b"); err != nil {
		t.Fatalf("b's connection after a was barred: %v", err)
	}
	p.Bar()
	again, againR := dial(t, p)
	if err := roundTrip(again, againR, "X-Server-From: a"); err != nil {
		t.Fatalf("a's connection after Bar(): %v", err)
	}
}
