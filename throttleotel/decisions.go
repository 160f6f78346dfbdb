package throttleotel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jobthrottle/jobthrottle/throttle"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

var _ throttle.Observer = (*Instrumentation)(nil)

// ObserveDecision records one decision of a limiter: in the metrics, and,
// when ctx carries a recording span, as an event "throttle.decision" on it,
// or, for the sleep of a Wait (throttle.OpWait), as a child span
// "throttle.wait" covering the sleep. It makes an Instrumentation a
// throttle.Observer: give it to throttle.New with throttle.WithObserver. It
// is safe for concurrent use.
func (i *Instrumentation) ObserveDecision(ctx context.Context, d throttle.Decision) {
	limiter := valid(d.Limiter)
	sets := i.sets.decision(decisionAttrs{limiter: limiter, op: string(d.Op), outcome: d.Outcome.String(),
		source: string(d.PolicySource), policy: valid(d.Policy)})
	if d.Op == throttle.OpWait {
		i.m.waitDuration.Record(ctx, d.Latency.Seconds(), sets.wait...)
		i.waitSpan(ctx, d.Latency, d.Err, func() []attribute.KeyValue {
			return i.withKey([]attribute.KeyValue{attrLimiter.String(limiter), attrUnits.Int(d.N)}, d.Key)
		})
		return
	}
	i.m.decisions.Add(ctx, 1, sets.decision...)
	if d.Policy != "" && d.Op != throttle.OpAcquire { // a cap's policy never changes
		i.m.policyDecisions.Add(ctx, 1, sets.policy...)
	}
	i.m.decisionDuration.Record(ctx, d.Latency.Seconds(), sets.duration...)
	if d.RedisFailed() {
		i.m.redisErrors.Add(ctx, 1, sets.limiter...)
	}
	if d.Cached {
		i.m.denyCacheHits.Add(ctx, 1, sets.limiter...)
	}
	if d.Leased {
		i.m.leasedDecisions.Add(ctx, 1, sets.limiter...)
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs, attrLimiter.String(limiter), attrOperation.String(string(d.Op)),
		attrOutcome.String(d.Outcome.String()), attrUnits.Int(d.N))
	if d.Policy != "" {
		attrs = append(attrs, attrPolicy.String(valid(d.Policy)), attrPolicySource.String(string(d.PolicySource)))
	}
	if d.RetryAfter > 0 {
		attrs = append(attrs, attrRetryAfter.Float64(d.RetryAfter.Seconds()))
	}
	if d.Cached {
		attrs = append(attrs, attrCached.Bool(true))
	}
	if d.Err != nil {
		et := errorType(d.Err)
		if d.Outcome == throttle.Degraded && et == otherError {
			et = "unavailable" // the Redis failure itself, unwrapped
		}
		attrs = append(attrs, attrErrorType.String(et))
	}
	span.AddEvent("throttle.decision", trace.WithAttributes(i.withKey(attrs, d.Key)...))
}

// waitSpan adds to the span in ctx, if it records, a child span
// "throttle.wait" for a sleep of d that ended now with err.
func (i *Instrumentation) waitSpan(ctx context.Context, d time.Duration, err error, attrs func() []attribute.KeyValue) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return
	}
	end := time.Now()
	_, span := i.tracer.Start(ctx, "throttle.wait", trace.WithTimestamp(end.Add(-d)),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs()...))
	if err != nil {
		span.SetAttributes(attrErrorType.String(errorType(err)))
		span.SetStatus(codes.Error, err.Error())
	}
	span.End(trace.WithTimestamp(end))
}

// withKey appends key to attrs as the Instrumentation's KeyMode says.
func (i *Instrumentation) withKey(attrs []attribute.KeyValue, key string) []attribute.KeyValue {
	if key == "" {
		return attrs
	}
	switch i.keys {
	case KeysRaw:
		return append(attrs, attrKey.String(valid(key)))
	case KeysHashed:
		sum := sha256.Sum256([]byte(key))
		return append(attrs, attrKeyHash.String(hex.EncodeToString(sum[:8])))
	}
	return attrs
}

// errorType names err's kind in a few words, for the error.type attribute:
// a bounded set, never the message.
func errorType(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, throttle.ErrRefused):
		return "refused"
	case errors.Is(err, throttle.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, throttle.ErrInvalidKey), errors.Is(err, throttle.ErrInvalidN),
		errors.Is(err, throttle.ErrExceedsLimit), errors.Is(err, throttle.ErrInvalidDelay):
		return "invalid_request"
	}
	return otherError
}

// otherError is error.type for an error of no known kind, as OpenTelemetry's
// semantic conventions name it.
const otherError = "_OTHER"

// valid returns s as valid UTF-8, as exporters require: a task type, being
// bytes from the queue, may not be.
func valid(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
