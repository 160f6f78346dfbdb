package redistest

import (
	"net"
	"sync"
	"testing"
)

// DeadAddr returns a loopback address nothing listens on: a Redis that is
// down. It quiets go-redis's own logger (see QuietRedisLog).
func DeadAddr(tb testing.TB) string {
	tb.Helper()
	QuietRedisLog()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// SilentAddr returns the address of a server that accepts connections and
// never answers, until the test ends: a Redis that hangs. It quiets
// go-redis's own logger (see QuietRedisLog).
func SilentAddr(tb testing.TB) string {
	tb.Helper()
	QuietRedisLog()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
	}()
	tb.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, conn := range conns {
			conn.Close()
		}
	})
	return ln.Addr().String()
}
