package httpthrottle

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// clientIP returns the address of the client of r: the peer of the
// connection, or, when that peer is a trusted proxy, the rightmost address
// in X-Forwarded-For that is not a trusted proxy. Without trusted proxies,
// no header the client could write is believed.
func clientIP(r *http.Request, trusted []netip.Prefix) (netip.Addr, error) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	peer, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: remote address %q", ErrNoKey, r.RemoteAddr)
	}
	peer = peer.Unmap()
	if !isTrusted(peer, trusted) {
		return peer, nil
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		hop, err := parseHop(strings.TrimSpace(hops[i]))
		if err != nil {
			// A malformed entry: what lies left of it cannot be trusted.
			return peer, nil
		}
		hop = hop.Unmap()
		if !isTrusted(hop, trusted) {
			return hop, nil
		}
		peer = hop
	}
	return peer, nil
}

// parseHop reads an X-Forwarded-For entry: an address, or an address and
// port as some proxies write it ("198.51.100.7:4711", "[2001:db8::7]:443").
func parseHop(s string) (netip.Addr, error) {
	if ip, err := netip.ParseAddr(s); err == nil {
		return ip, nil
	}
	ap, err := netip.ParseAddrPort(s)
	return ap.Addr(), err
}

func isTrusted(ip netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
