// Package jobthrottle is the root of a library that throttles background
// work across a fleet of machines through one shared Redis: asynq task
// handlers, outbound API calls and batch jobs respect a rate limit
// together, not each process on its own. The root holds no code; the
// packages are:
//
//   - throttle: the limiters (fixed window, sliding log, sliding window,
//     token bucket, leaky bucket, GCRA), Wait, Reserve and a concurrency
//     limiter, each decision one atomic Lua script on the Redis clock.
//   - worker: asynq middleware that throttles handlers by rules and
//     reschedules throttled tasks without burning their retries.
//   - scheduler: cron entries fired once per tick across replicas, with
//     batches paced onto the workers' limits.
//   - httpthrottle: a pacing http.RoundTripper that backs off fleet-wide on
//     429, and inbound middleware with the standard headers.
//   - metrics: a Prometheus collector of the limiters' and workers'
//     decisions.
//
// cmd/worker-demo runs a small fleet on an embedded Redis; cmd/throttlectl
// shows and resets throttle state. See README.md, and docs/ for the
// details (docs/reliability.md, docs/benchmarks.md).
package jobthrottle
