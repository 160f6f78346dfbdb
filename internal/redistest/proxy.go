package redistest

import (
	"net"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Proxy forwards TCP connections to a Redis and can hold everything it
// forwards: a Redis that hangs without closing its connections. It is safe
// for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	paused bool
	resume *sync.Cond
	conns  map[net.Conn]bool
}

// NewProxy listens on a loopback port and forwards each connection to
// target, until the test ends.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.resume = sync.NewCond(&p.mu)
	go p.serve()
	tb.Cleanup(func() {
		ln.Close()
		p.Resume()
		p.DropConnections()
	})
	return p
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Pause holds every byte in both directions until Resume.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
}

// Resume lets the held bytes go on.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = false
	p.resume.Broadcast()
}

// DropConnections closes every forwarded connection, as a crashed server
// would.
func (p *Proxy) DropConnections() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

func (p *Proxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close() // the server is down: refuse, as it would
			continue
		}
		p.mu.Lock()
		p.conns[client], p.conns[server] = true, true
		p.mu.Unlock()
		go p.pipe(server, client)
		go p.pipe(client, server)
	}
}

// pipe copies from src to dst, waiting while the proxy is paused, and
// closes both when either side ends.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer func() {
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.paused {
				p.resume.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Hangable returns an embedded Redis, a Proxy in front of it, and a client
// with go-redis's default options (3 s reads, retried: 5 s and more before
// it gives up on a hung server) that talks to it through the proxy, closed
// when the test ends: Pause the proxy to make Redis hang.
func Hangable(tb testing.TB) (*Target, *Proxy, *redis.Client) {
	tb.Helper()
	QuietRedisLog()
	tg := Embedded(tb)
	proxy := NewProxy(tb, tg.Mini.Addr())
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	tb.Cleanup(func() { client.Close() })
	return tg, proxy, client
}
