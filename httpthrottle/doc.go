// Package httpthrottle applies fleet-wide rate limits to HTTP: a
// [Transport] that paces outbound calls to partner APIs and backs off
// together when one of them answers 429, and a [Middleware] that limits
// inbound requests per client with the standard headers.
//
// Outbound, every process that calls a partner through a Transport on the
// same Redis shares one limit per host (or per key of your choosing):
//
//	limiter, _ := throttle.New(rdb, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
//	transport, _ := httpthrottle.NewTransport(limiter, httpthrottle.WithRetries(2))
//	client := &http.Client{Transport: transport}
//
// A 429 or 503 with Retry-After (seconds or an HTTP date) blocks the key in
// Redis until then (throttle.Limiter.BlockFor): the other processes see the
// block on their next turn, and a request that was waiting for a booked
// slot checks for one when it wakes. Request bodies are never read before
// the request is sent.
//
// Inbound:
//
//	limiter, _ := throttle.New(rdb, "inbound", throttle.SlidingLog{Limit: 100, Window: time.Minute})
//	limit, _ := httpthrottle.NewMiddleware(limiter)
//	http.ListenAndServe(":8080", limit.Handler(mux))
//
// Clients are keyed by the connection's peer address; X-Forwarded-For is
// read only behind proxies named with WithTrustedProxies. Every decided
// response carries
//
//	RateLimit-Policy: "default";q=<quota>;w=<window seconds>
//	RateLimit: "default";r=<remaining>;t=<seconds until full again>
//	X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset (seconds)
//
// and a refused one 429 with Retry-After, the wait rounded up to whole
// seconds. When Redis cannot decide, a fail-closed limiter makes it 503 and
// a fail-open one lets the request through without the fields.
package httpthrottle
