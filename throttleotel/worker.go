package throttleotel

import (
	"context"

	"github.com/jobthrottle/jobthrottle/worker"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

var _ worker.Observer = (*Instrumentation)(nil)

// Observe records one event of a Throttler (worker.Observer: give the
// Instrumentation to worker.New with worker.WithObserver). In the metrics,
// LeaseTaken and LeaseReleased move jobthrottle.worker.lease.active of the
// event's rule up and down; every other kind counts in
// jobthrottle.worker.tasks by task type, rule and event, and WaitedInline
// and Rescheduled put their Delay in jobthrottle.worker.wait.duration.
//
// When ctx (the handler's) carries a recording span, the event is added to
// it as "throttle.task": what happened (jobthrottle.task.event), the rule
// and its limiter, the delay, the task's ID and type, and for a task sent
// back to asynq why (jobthrottle.reason: "throttled", or "undecided" when
// Redis could not answer). An inline wait is also a child span
// "throttle.wait" covering it. It is safe for concurrent use.
func (i *Instrumentation) Observe(ctx context.Context, e worker.Event) {
	rule := valid(e.Rule)
	switch e.Kind {
	case worker.LeaseTaken:
		i.m.leases.Add(ctx, 1, i.sets.lease(rule)...)
	case worker.LeaseReleased:
		i.m.leases.Add(ctx, -1, i.sets.lease(rule)...)
	default:
		sets := i.sets.task(taskAttrs{taskType: valid(e.TaskType), rule: rule, event: e.Kind.String()})
		i.m.tasks.Add(ctx, 1, sets.task...)
		if e.Kind == worker.WaitedInline || e.Kind == worker.Rescheduled {
			i.m.taskWait.Record(ctx, e.Delay.Seconds(), sets.wait...)
		}
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs, attrTaskEvent.String(e.Kind.String()), attrTaskType.String(valid(e.TaskType)),
		attrTaskID.String(valid(e.TaskID)))
	if e.Rule != "" {
		attrs = append(attrs, attrRule.String(rule), attrLimiter.String(valid(e.Limiter)))
	}
	if e.Delay > 0 {
		attrs = append(attrs, attrDelay.Float64(e.Delay.Seconds()))
	}
	if e.Throttles > 0 {
		attrs = append(attrs, attrThrottles.Int(e.Throttles))
	}
	switch {
	case e.Kind == worker.Rescheduled && e.Err != nil:
		attrs = append(attrs, attrReason.String("undecided"), attrErrorType.String(errorType(e.Err)))
	case e.Kind == worker.Rescheduled:
		attrs = append(attrs, attrReason.String("throttled"))
	case e.Err != nil:
		attrs = append(attrs, attrErrorType.String(errorType(e.Err)))
	}
	attrs = i.withKey(attrs, e.Key)
	span.AddEvent("throttle.task", trace.WithAttributes(attrs...))
	if e.Kind == worker.WaitedInline && e.Delay > 0 {
		i.waitSpan(ctx, e.Delay, nil, func() []attribute.KeyValue { return attrs })
	}
}
