// Package throttleotel reports jobthrottle's limits to OpenTelemetry:
// traces and metrics, for teams that export to whatever backend they run
// rather than scrape Prometheus (package metrics does that).
//
// It is a module of its own (github.com/jobthrottle/jobthrottle/throttleotel),
// so that a program that does not import it has no OpenTelemetry package
// in its module graph.
//
// One [Instrumentation] serves every entry point, each wired in one line:
//
//	inst, err := throttleotel.New() // the global TracerProvider and MeterProvider
//	limiter, err := throttle.New(rdb, "partner-api", policy, throttle.WithObserver(inst))
//	th, err := worker.New(rdb, rules, worker.WithObserver(inst))
//	transport, err := httpthrottle.NewTransport(limiter, inst.TransportOption())
//	limit, err := httpthrottle.NewMiddleware(inbound, inst.MiddlewareOption())
//
// # Traces
//
// Nothing here starts a trace: what it reports goes into the span the
// caller's context carries (an HTTP request's, a task handler's), and
// nothing is reported when the context carries no recording span.
//
//   - Every decision of a limiter is an event "throttle.decision" on that
//     span: the limiter's name, the call, the policy and where it came from,
//     the outcome, the units, and the retry-after of a rejection.
//   - A call that slept for its turn (Wait, WaitN, Reservation.Wait, and the
//     worker's inline wait) has a child span "throttle.wait" covering the
//     sleep.
//   - What the worker did with a task is an event "throttle.task" on the
//     handler's span: admitted, waited, or sent back to asynq, with the rule
//     that held it back and why ("throttled", or "undecided" when Redis could
//     not answer).
//   - The Transport adds "throttle.turn" (its wait before each send) and
//     "throttle.backoff" (an upstream's 429 or 503 and the block it set) to
//     the request's span; the Middleware adds "throttle.request" (its
//     answer).
//
// Caller keys are left out by default: they can be tenant data and are
// unbounded. [WithKeys] adds them, raw or hashed.
//
// # Metrics
//
// Through a Meter, with the meaning of package metrics' Prometheus series
// (see docs/metrics.md for the correspondence): decisions by limiter,
// call, outcome and policy source; decision latency; waits; the worker's
// tasks by event (reschedules among them), its waits and the leases held;
// Redis errors and answers of the deny cache. Names follow OpenTelemetry's
// semantic conventions for a system's own metrics (jobthrottle.*, units
// in UCUM, no _total).
package throttleotel
