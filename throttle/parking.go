package throttle

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/redis/go-redis/v9"
)

// This file is what a ConcurrencyLimiter does for the worker's parked
// waiters (tasks sent back to asynq while they keep their place in a
// cap's line): parking a waiter at once when it is too far back to wait,
// and moving a called waiter's task to the head of its queue in the
// release that calls it, rather than in a call of its own.

// parking is what the worker set through internal/gate (see OnCapCall).
type parking struct {
	call func(payloads []string)
	task func(payload string) (id string, keys []string, ok bool)
}

// parkedWaiter is a waiter seen parked near the head of a key's line.
type parkedWaiter struct{ id, payload string }

// heads remembers, per key (its holders' Redis key), the parked waiters at
// the head of its line as last told (a wait's reply, or a release's
// message on the key's wake channel), so that the next release of the key
// may prepare for them. Safe for concurrent use.
type heads struct {
	mu   sync.Mutex
	keys map[string][]parkedWaiter
}

// headsKept bounds the keys heads remembers; past it, it starts afresh.
const headsKept = 4096

func (h *heads) set(key string, ws []parkedWaiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(ws) == 0 {
		delete(h.keys, key)
		return
	}
	if h.keys == nil || (len(h.keys) >= headsKept && h.keys[key] == nil) {
		h.keys = map[string][]parkedWaiter{}
	}
	h.keys[key] = ws
}

func (h *heads) get(key string) []parkedWaiter {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.keys[key]
}

// look is how many places from the head of a key's line a wait's reply
// lists the parked waiters of (the script's "look"): none unless the worker
// brings parked waiters back; else twice the limit and two (a release
// calls parked waiters up to a limit's worth of places beyond the slot it
// frees, and as many releases come elsewhere within a hold), at most
// maxLook.
func (c *ConcurrencyLimiter) look() int {
	if p := c.parking.Load(); p == nil || p.task == nil {
		return 0
	}
	return min(2*c.policy.Limit+2, maxLook)
}

// maxLook bounds the places a wait looks at for parked waiters, and so the
// waiters a release prepares for: four KEYS each.
const maxLook = 16

// noteHeads remembers the parked waiters a wait's reply on key lists
// after its "#" (past its eight values); a reply without "#" changes
// nothing.
func (c *ConcurrencyLimiter) noteHeads(key string, values []any) {
	for i := 8; i < len(values); i++ {
		if s, _ := values[i].(string); s != "#" {
			continue
		}
		var ws []parkedWaiter
		for j := i + 1; j+1 < len(values); j += 2 {
			id, _ := values[j].(string)
			payload, _ := values[j+1].(string)
			ws = append(ws, parkedWaiter{id, payload})
		}
		c.heads.set(c.Key(key), ws)
		return
	}
}

// noteMessage remembers the parked waiters a release told on a key's wake
// channel after the ids it woke: "#" and their ids and payloads, one a
// line. key is the holders' Redis key.
func (h *heads) noteMessage(key, msg string) {
	lines := strings.Split(msg, "\n")
	if lines[0] != "#" || len(lines)%2 != 1 {
		return // not a list this version wrote
	}
	ws := make([]parkedWaiter, 0, len(lines)/2)
	for i := 1; i+1 < len(lines); i += 2 {
		ws = append(ws, parkedWaiter{lines[i], lines[i+1]})
	}
	h.set(key, ws)
}

// prepared returns the KEYS and ARGV a release or leave of key adds (see
// concurrency.lua): now for asynq, the average hold (when a worker parks
// waiters here), the look, and the parked waiters last seen at the head of
// key's line whose task the worker can name, when the task's keys share
// key's Cluster slot (or the client is one server).
func (c *ConcurrencyLimiter) prepared(key string) (keys []string, args []any) {
	p := c.parking.Load()
	hold := "0" // nothing parks here (no worker brings parked waiters back): the line needs none
	if p != nil {
		hold = c.holdMicros()
	}
	args = []any{strconv.FormatInt(time.Now().UnixNano(), 10), hold, strconv.Itoa(c.look())}
	var ws []parkedWaiter
	holders := c.Key(key)
	if p != nil && p.task != nil {
		ws = c.heads.get(holders)
	}
	_, single := c.client.(*redis.Client)
	var pairs []any
	for _, w := range ws {
		id, tk, ok := p.task(w.payload)
		if !ok || len(tk) != 4 || (!single && !keyspace.OneSlot(append([]string{holders}, tk...)...)) {
			continue
		}
		keys = append(keys, tk...)
		pairs = append(pairs, w.id, id)
	}
	return keys, append(append(args, strconv.Itoa(len(pairs)/2)), pairs...)
}

// called hands the payloads of the parked waiters a release or leave
// called back and did not move (its values past the fifth) to the
// worker's call function.
func (c *ConcurrencyLimiter) called(values []any) {
	p := c.parking.Load()
	if p == nil || p.call == nil {
		return
	}
	var now, later []string
	settling := false
	for _, v := range values[min(5, len(values)):] {
		payload, ok := v.(string)
		switch {
		case !ok:
		case payload == "~":
			settling = true // the rest are on their way back to their queues
		case settling:
			later = append(later, payload)
		default:
			now = append(now, payload)
		}
	}
	if len(now) > 0 {
		p.call(now)
	}
	if len(later) > 0 {
		time.AfterFunc(awaySettle, func() { p.call(later) })
	}
}

// callParked hands payload, a parked waiter's, to the worker's call
// function, which brings its task back to the head of its queue.
func (c *ConcurrencyLimiter) callParked(payload string) {
	if p := c.parking.Load(); p != nil && p.call != nil {
		p.call([]string{payload})
	}
}

// awaySettle is how long after the line parks a waiter whose budget ran out
// its task takes to be back in asynq's hands (concurrency.lua's
// AWAY_SETTLE): a release that calls it back meanwhile has it brought back
// that much later.
const awaySettle = 120 * time.Millisecond

// noteHold records how long one of this process's leases was held: an
// average that follows the last few holds, which a waiter compares with its
// budget to park at once when it is too far back in line (see
// concurrency.lua's wait), and which a release keeps with the line for
// the fleet's waiters.
func (c *ConcurrencyLimiter) noteHold(d time.Duration) {
	if d <= 0 {
		return
	}
	for {
		old := c.hold.Load()
		next := int64(d)
		if old > 0 {
			next = old + (int64(d)-old)/8
		}
		if c.hold.CompareAndSwap(old, next) {
			return
		}
	}
}

// holdMicros is the average hold, us, as the script takes it ("0": none
// seen yet).
func (c *ConcurrencyLimiter) holdMicros() string {
	return strconv.FormatInt(c.hold.Load()/int64(time.Microsecond), 10)
}
