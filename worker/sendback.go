package worker

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/gate"
)

// ticketGrace is how long after its slot a booking of the lead meter may
// still be claimed by the task that made it: a task coming back late (every
// worker busy) still finds it, and starts in the gap it left.
const ticketGrace = 5 * time.Minute

// roomFallback is added to a waiter's estimated wait for the time asynq
// itself brings it back if no dispatcher lets it out first.
const roomFallback = 10 * time.Second

// goBack returns a refused task to asynq, to be back at due: through the
// return lane, ahead of its queue's backlog, when lane is set (due is then
// its turn: asynq's own retry time is laneFallback later); as a
// *ThrottledError for asynq's retry set; as a *GaveUpError when the rule's
// give-up policy says so; or, for a task with no retries left, handed over
// to a copy of itself.
func (t *Throttler) goBack(ctx context.Context, tk *task, r *refusal, due time.Time, lane bool) error {
	if gave := t.giveUp(ctx, tk, r); gave != nil {
		return gave
	}
	lane = lane && tk.queue != "" && tk.id != ""
	retryAt := due
	if lane {
		retryAt = due.Add(laneFallback)
	}
	// Unless its decision joined its queue's lane in Redis (joinedLane),
	// this process's dispatcher moves the task to the head of its queue at
	// its turn. Nothing is written to Redis for it: if this process stops
	// first, asynq's own retry brings it back laneFallback later, at the
	// tail of its queue.
	if tk.last {
		if err := t.handOver(ctx, tk, r.rule.name, r.key, retryAt); err != nil {
			return err
		}
		if lane {
			t.at(turn{at: due, queue: tk.queue, id: tk.returnID()})
		}
		return nil
	}
	switch {
	case lane && r.lane.Joined:
		t.joinedLane(tk.queue, due, r.lane)
	case lane:
		t.at(turn{at: due, queue: tk.queue, id: tk.returnID()})
	}
	t.observe(ctx, Event{Kind: Rescheduled, TaskID: tk.id, TaskType: tk.Type(), Rule: r.rule.name, Key: r.key, Delay: time.Until(due), Err: r.err})
	return &ThrottledError{Rule: r.rule.name, Key: r.key, RetryAfter: time.Until(due), until: retryAt}
}

// wait puts a task refused by a meter's room in that room (unless its
// claim put it there already), to be let out by a dispatcher when its turn
// comes (see dispatch.go), and sends it back to asynq meanwhile, with a
// retry time well past its estimated turn, for the case that no
// dispatcher lets it out. The dispatcher books its slot on its along
// meters when it lets it out.
func (t *Throttler) wait(ctx context.Context, tk *task, r *refusal) error {
	if tk.queue == "" || tk.id == "" {
		// Outside an asynq server nothing could let it out: back later.
		r.how = waitOrRetry
		return t.goBack(ctx, tk, r, time.Now().Add(comeBackAfter(r)), false)
	}
	if !r.entered {
		if gave := t.giveUp(ctx, tk, r); gave != nil {
			return gave
		}
		rules := t.matching(ctx, tk.Task)
		entry, units, err := t.entryOf(ctx, tk, rules, meterRoles(rules), r.rule, r.key)
		if err != nil {
			return t.noKey(ctx, tk, r.rule, err)
		}
		size, lease, err := gate.EnterRoom(ctx, r.rule.limiter, r.key, tk.waiterID(), entry.Flow, entry.Weight, units, r.leadWait, entry.Payload)
		if err != nil {
			r.how, r.retryAfter, r.err = waitOrRetry, unavailableBackoff, err
			t.observe(ctx, Event{Kind: Failed, TaskID: tk.id, TaskType: tk.Type(), Rule: r.rule.name, Key: r.key, Err: err})
			return t.goBack(ctx, tk, r, time.Now().Add(comeBackAfter(r)), false)
		}
		r.entered, r.waiters, r.lease = true, size, lease
	}
	t.heardOfLease(r.rule, r.key, r.lease)
	eligible := time.Now().Add(r.leadWait)
	// A room's turn already queued less than a second later is kept (its
	// meter has no room before it, typically): only one far off (a flow
	// held back, a block) gives way.
	t.turnAt(time.Second, turn{at: eligible.Add(-t.roomLead()), rule: r.rule, key: r.key})
	fallback := eligible.Add(2*time.Duration(r.waiters)*r.rule.interval() + roomFallback)
	if tk.last {
		return t.handOver(ctx, tk, r.rule.name, r.key, fallback)
	}
	t.observe(ctx, Event{Kind: Rescheduled, TaskID: tk.id, TaskType: tk.Type(), Rule: r.rule.name, Key: r.key, Delay: time.Until(fallback)})
	return &ThrottledError{Rule: r.rule.name, Key: r.key, RetryAfter: time.Until(fallback), until: fallback}
}

// entryOf returns what a task enters rule's room with (rules are the
// task's, roles their meterRoles), and the units its start there takes: its flow is the rule's FairBy flow, or else its key in
// its first along meter (its tenant, typically), or else the room's key;
// its payload is its queue and ID (its hand-over copy's, for a task with no
// retries left), then rule, key and units of each along meter, for the
// dispatcher that lets it out.
func (t *Throttler) entryOf(ctx context.Context, tk *task, rules []*Rule, roles []int, rule *Rule, key string) (gate.Entry, int, error) {
	entry := gate.Entry{Weight: 1}
	parts := []string{tk.queue, tk.returnID()}
	units := 1
	for i, role := range roles {
		if rules[i] == rule {
			units = tk.costs[i]
		}
		if role == alongMeter {
			parts = append(parts, rules[i].name, tk.keys[i], strconv.Itoa(tk.costs[i]))
			if entry.Flow == "" {
				entry.Flow = tk.keys[i]
			}
		}
	}
	if entry.Flow == "" {
		entry.Flow = key
	}
	if rule.fair != nil {
		var err error
		if entry.Flow, entry.Weight, err = rule.fair.flowOf(ctx, tk.Task); err != nil {
			return gate.Entry{}, 0, err
		}
	}
	entry.Payload = strings.Join(parts, "\x1f")
	return entry, units, nil
}

// park leaves a task refused by a full concurrency cap in the cap's line,
// marked away, and sends it back to asynq: a release that frees a slot near
// its place calls it back, moving it to the head of its queue in the same
// call (or, when that release could not, see callBack), in time to wait
// inline for its turn. Its retry time is parkFallback away, for the case
// that nobody calls it; it keeps its place in line until a little after.
func (t *Throttler) park(ctx context.Context, tk *task, r *refusal) error {
	leave := func() {
		t.notGivenBack(ctx, "its place in the cap's line", r.rule, r.key, gate.CapLeave(ctx, r.rule.conc, r.key, tk.waiterID()))
	}
	if !r.parked {
		// Outside an asynq server (nothing could call it back), the line
		// did not park it: it leaves, and comes back by asynq's retry.
		leave()
		r.how = waitOrRetry
		return t.goBack(ctx, tk, r, time.Now().Add(comeBackAfter(r)), false)
	}
	if gave := t.giveUp(ctx, tk, r); gave != nil {
		leave()
		return gave
	}
	fallback := time.Now().Add(parkFallback)
	if tk.last {
		return t.handOver(ctx, tk, r.rule.name, r.key, fallback)
	}
	t.observe(ctx, Event{Kind: Rescheduled, TaskID: tk.id, TaskType: tk.Type(), Rule: r.rule.name, Key: r.key, Delay: parkFallback})
	return &ThrottledError{Rule: r.rule.name, Key: r.key, RetryAfter: parkFallback, until: fallback}
}

// parking is what a task refused by a cap needs to park in its line at
// once, in the call that refuses it (see gate.CapWait): its payload, its
// queue and the asynq ID it comes back as (a copy's, for a task on its
// last retry, see handOver); nil outside an asynq server, where nothing
// could call it back.
func (t *Throttler) parking(tk *task) *gate.CapParking {
	if tk.queue == "" || tk.id == "" {
		return nil
	}
	return &gate.CapParking{Payload: tk.queue + "\x1f" + tk.returnID(), TTL: parkFallback + parkMargin}
}

// parkedTask returns the asynq ID and keys of the task a parked waiter's
// payload names, so that the release that calls it back moves it to the
// head of its queue in the same call; ok is false when the caps decide on
// another Redis than asynq's.
func (t *Throttler) parkedTask(payload string) (id string, keys []string, ok bool) {
	queue, id, ok := strings.Cut(payload, "\x1f")
	if !ok || !t.sameRedis {
		return "", nil, false
	}
	return id, laneKeys(queue, []string{id}), true
}

// A task parked in a cap's line comes back by asynq's own retry after
// parkFallback if no release calls it back first; its place in line is
// kept parkMargin longer.
const (
	parkFallback = 10 * time.Second
	parkMargin   = 10 * time.Second
)

// callBack brings back the parked tasks a cap's release called: each
// payload is a task's queue and asynq ID. The dispatcher moves them to the
// head of their queues, those of one queue in one call.
func (t *Throttler) callBack(payloads []string) {
	tns := make([]turn, 0, len(payloads))
	now := time.Now()
	for _, payload := range payloads {
		if queue, id, ok := strings.Cut(payload, "\x1f"); ok {
			tns = append(tns, turn{at: now, queue: queue, id: id, gone: 1}) // it may be on its way to asynq
		}
	}
	t.turnAt(0, tns...) // together: due in one look, moved in one call
}

// giveUp counts a throttle of the task against its rule's give-up policy,
// and when the policy gives up, gives back what the task kept for its
// return and returns the *GaveUpError to end it with; nil otherwise.
func (t *Throttler) giveUp(ctx context.Context, tk *task, r *refusal) error {
	rule := r.rule
	if !rule.giveUp.enabled() || r.err != nil {
		return nil
	}
	n, since, err := t.countThrottle(ctx, rule, tk.origin)
	if err != nil {
		t.logger().LogAttrs(ctx, slog.LevelWarn, "worker: could not count the task's throttles; not given up on this time",
			slog.String("task_id", tk.id), slog.String("rule", rule.name), slog.String("key", r.key), slog.Any("error", err))
		return nil
	}
	if !rule.giveUp.givesUp(n, since) {
		return nil
	}
	t.forgetKept(ctx, tk)
	t.observe(ctx, Event{Kind: GaveUp, TaskID: tk.id, TaskType: tk.Type(), Rule: rule.name, Key: r.key, Throttles: n})
	return &GaveUpError{Rule: rule.name, Key: r.key, Throttles: n, ThrottledFor: since, drop: rule.giveUp.Action == GiveUpDrop}
}

// forgetKept gives back what a task given up on kept for its return: its
// bookings of meters, its places in rooms and in caps' lines.
func (t *Throttler) forgetKept(ctx context.Context, tk *task) {
	if tk.ticket == "" {
		return
	}
	rules := t.matching(ctx, tk.Task)
	roles := meterRoles(rules)
	for i, rule := range rules {
		if rule.conc != nil {
			err := gate.CapLeave(ctx, rule.conc, tk.keys[i], tk.waiterID())
			t.notGivenBack(ctx, "its place in the cap's line", rule, tk.keys[i], err)
			continue
		}
		switch roles[i] {
		case leadMeter, alongMeter:
			// Asked again with its ticket and no room to wait, the limiter
			// returns the standing booking (or, if there is none, books the
			// present if it can): either way, cancelling it gives it back.
			res, err := gate.ReserveFor(ctx, rule.limiter, tk.keys[i], gate.Ticket{ID: tk.ticket}, tk.costs[i], 0)
			if err == nil && res.OK {
				err = res.Cancel(ctx)
			}
			t.notGivenBack(ctx, "its booking", rule, tk.keys[i], err)
		case roomMeter:
			err := gate.LeaveRoom(ctx, rule.limiter, tk.keys[i], tk.waiterID())
			t.notGivenBack(ctx, "its place in the waiting room", rule, tk.keys[i], err)
		}
	}
}

// notGivenBack logs, at Warn, a failed call that gives back what a task
// kept for its turn: the task goes on without it, and what it kept stays
// until its keys expire (a place in a room may be let out for nothing).
// With ctx ended, the call goes on in the background (bounded like every
// clean-up) and its outcome is not known here: nothing is logged.
func (t *Throttler) notGivenBack(ctx context.Context, what string, rule *Rule, key string, err error) {
	if err != nil && ctx.Err() == nil {
		t.logger().LogAttrs(ctx, slog.LevelWarn, "worker: could not give back "+what,
			slog.String("rule", rule.name), slog.String("key", key), slog.Any("error", err))
	}
}

// copyID is the ID of the hand-over copy the task would be handed to.
func (tk *task) copyID() string { return fmt.Sprintf("%s~%d", tk.origin, tk.copies+1) }

// returnID is the asynq ID the task comes back as: its hand-over copy's
// for a task on its last retry (see handOver), else its own.
func (tk *task) returnID() string {
	if tk.last {
		return tk.copyID()
	}
	return tk.id
}

// noKey fails a task for which a rule's key function found no key: it
// fails without retries, its payload will not change.
func (t *Throttler) noKey(ctx context.Context, tk *task, r *Rule, err error) error {
	t.observe(ctx, Event{Kind: Failed, TaskID: tk.id, TaskType: tk.Type(), Rule: r.name, Err: err})
	return fmt.Errorf("worker: rule %q: %w: %w", r.name, err, asynq.SkipRetry)
}
