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
		hop, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
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

func isTrusted(ip netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
