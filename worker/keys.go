package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/hibiken/asynq"
)

// KeyFunc returns the key a rule throttles a task under: the tenant, the
// partner account, the task type, the queue. ctx is the handler's context
// (see Matcher). An error fails the task (see ErrNoKey).
type KeyFunc func(ctx context.Context, t *asynq.Task) (string, error)

// ByType keys a task by its type: one limit per task type.
func ByType() KeyFunc {
	return func(_ context.Context, t *asynq.Task) (string, error) { return t.Type(), nil }
}

// Constant keys every task the same: one limit shared by all the rule's
// tasks.
func Constant(key string) KeyFunc {
	return func(context.Context, *asynq.Task) (string, error) { return key, nil }
}

// ByQueue keys a task by its asynq queue (see QueueOf): one limit per
// queue.
func ByQueue() KeyFunc {
	return func(ctx context.Context, _ *asynq.Task) (string, error) { return QueueOf(ctx), nil }
}

// ByHeader keys a task by one of its asynq headers.
func ByHeader(name string) KeyFunc {
	return func(_ context.Context, t *asynq.Task) (string, error) {
		v, ok := t.Headers()[name]
		if !ok || v == "" {
			return "", fmt.Errorf("%w: header %q is missing", ErrNoKey, name)
		}
		return v, nil
	}
}

// ByPayloadField keys a task by a top-level field of its JSON payload, a
// string or a number: ByPayloadField("tenant_id").
func ByPayloadField(field string) KeyFunc {
	return func(_ context.Context, t *asynq.Task) (string, error) {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(t.Payload(), &fields); err != nil {
			return "", fmt.Errorf("%w: payload is not a JSON object: %w", ErrNoKey, err)
		}
		raw, ok := fields[field]
		if !ok {
			return "", fmt.Errorf("%w: payload has no field %q", ErrNoKey, field)
		}
		var s string
		if err := json.Unmarshal(raw, &s); err == nil && s != "" {
			return s, nil
		}
		var n json.Number
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&n); err == nil {
			return n.String(), nil
		}
		return "", fmt.Errorf("%w: payload field %q is %s, want a string or a number", ErrNoKey, field, raw)
	}
}
