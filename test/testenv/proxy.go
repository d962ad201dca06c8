package testenv

import (
	"context"
	"io"
	"net"
	gosync "sync"
	"sync/atomic"

	"golang.org/x/time/rate"
)

// Proxy is a TCP proxy in front of the apiserver that can reset its
// connections, black-hole them (connections stay open, no bytes pass) or
// slow them down (a link of some bytes per second, shared by all).
type Proxy struct {
	ln        net.Listener // nil while refusing
	addr      string
	target    string
	blackHole atomic.Bool
	limit     atomic.Pointer[rate.Limiter]

	mu     gosync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     gosync.WaitGroup
}

// NewProxy listens on addr ("127.0.0.1:0" for any port) and forwards to
// target.
func NewProxy(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, addr: ln.Addr().String(), target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(func() { p.accept(ln) })
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.addr }

func (p *Proxy) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, up) {
			return
		}
		p.wg.Go(func() { p.pipe(up, c) })
		p.wg.Go(func() { p.pipe(c, up) })
	}
}

func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// pipe copies from src to dst, dropping the bytes while black-holed.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if l := p.limit.Load(); l != nil && n > 0 {
			for left := n; left > 0; left -= l.Burst() {
				_ = l.WaitN(context.Background(), min(left, l.Burst()))
			}
		}
		if n > 0 && !p.blackHole.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}

// Reset closes every open connection (clients see a reset or EOF).
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		c.Close()
		delete(p.conns, c)
	}
}

// Throttle makes the connections, open or new, pass at most bytesPerSecond
// in all, both ways together; 0 lifts the limit.
func (p *Proxy) Throttle(bytesPerSecond int) {
	if bytesPerSecond <= 0 {
		p.limit.Store(nil)
		return
	}
	p.limit.Store(rate.NewLimiter(rate.Limit(bytesPerSecond), min(bytesPerSecond, 16<<10)))
}

// BlackHole makes every connection, open or new, swallow all bytes while on.
func (p *Proxy) BlackHole(on bool) { p.blackHole.Store(on) }

// Refuse makes the proxy's address refuse connections while on (nothing
// listens there: clients get ECONNREFUSED, as from an apiserver that is
// down) and closes every open connection; off listens again on the same
// address.
func (p *Proxy) Refuse(on bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || on == (p.ln == nil) {
		return nil
	}
	if on {
		err := p.ln.Close()
		p.ln = nil
		for c := range p.conns {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			c.Close()
			delete(p.conns, c)
		}
		return err
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return err
	}
	p.ln = ln
	p.wg.Go(func() { p.accept(ln) })
	return nil
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	if p.ln != nil {
		p.ln.Close()
	}
	p.mu.Unlock()
	p.Reset()
	p.wg.Wait()
}
