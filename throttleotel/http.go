package throttleotel

import (
	"context"

	"github.com/jobthrottle/jobthrottle/httpthrottle"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// TransportOption returns the option that has an httpthrottle.Transport
// report to the Instrumentation: on the request's span (the one its
// context carries; an otelhttp Transport wrapping this one makes it), an
// event "throttle.turn" for each wait for the request's turn
// (jobthrottle.delay, the attempt, error.type when it failed) and an event
// "throttle.backoff" for each 429 or 503 with a Retry-After
// (http.response.status_code, the block set as jobthrottle.delay, whether
// the request is sent again). The limiter's own decisions and the span of
// its sleep come from giving the Instrumentation to the limiter
// (throttle.WithObserver).
func (i *Instrumentation) TransportOption() httpthrottle.TransportOption {
	return httpthrottle.WithTransportObserver(i.observeHTTP)
}

// MiddlewareOption returns the option that has an httpthrottle.Middleware
// report to the Instrumentation: an event "throttle.request" on the
// request's span with the Middleware's answer (jobthrottle.http.event:
// admitted, rejected, unavailable or degraded; http.response.status_code
// of a 429 or 503; the Retry-After of a 429 as jobthrottle.retry_after).
func (i *Instrumentation) MiddlewareOption() httpthrottle.MiddlewareOption {
	return httpthrottle.WithMiddlewareObserver(i.observeHTTP)
}

// observeHTTP adds an event of a Transport or a Middleware to the span in
// ctx.
func (i *Instrumentation) observeHTTP(ctx context.Context, e httpthrottle.Event) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 8)
	attrs = append(attrs, attrLimiter.String(valid(e.Limiter)))
	name := "throttle.request"
	switch e.Kind {
	case httpthrottle.Waited, httpthrottle.BackedOff:
		name = "throttle.turn"
		attrs = append(attrs, attrAttempt.Int(e.Attempt), attrDelay.Float64(e.Delay.Seconds()))
		if e.Kind == httpthrottle.BackedOff {
			name = "throttle.backoff"
			attrs = append(attrs, attrRetrying.Bool(e.Retrying))
		}
	default:
		attrs = append(attrs, attrHTTPEvent.String(e.Kind.String()))
		if e.Kind == httpthrottle.Rejected {
			attrs = append(attrs, attrRetryAfter.Float64(e.Delay.Seconds()))
		}
	}
	if e.Status != 0 {
		attrs = append(attrs, attrStatusCode.Int(e.Status))
	}
	if e.Err != nil {
		attrs = append(attrs, attrErrorType.String(errorType(e.Err)))
	}
	span.AddEvent(name, trace.WithAttributes(i.withKey(attrs, e.Key)...))
}
