package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/redisaddr"
	"github.com/jobthrottle/jobthrottle/scheduler"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/redis/go-redis/v9"
)

// tenants and their share of the partner calls, enqueued in this order:
// acme enqueues three times as much as each other tenant, and first.
var tenants = []struct {
	name  string
	share int // percent
}{{"acme", 60}, {"globex", 20}, {"initech", 20}}

// batchTenant is the tenant whose customers the nightly batch re-syncs.
const batchTenant = "initech"

// payload is what every task carries.
type payload struct {
	Tenant string `json:"tenant,omitempty"`
	Batch  bool   `json:"batch,omitempty"`
}

// demo is the running fleet and what it has seen.
type demo struct {
	opts      options
	mini      *miniredis.Miniredis
	rdb       redis.UniversalClient
	kind      string         // "Redis", "Redis Cluster" or "Redis behind Sentinel"
	spec      redisaddr.Spec // where Redis is, for the throttlectl command
	addr      string         // the Redis's host:port, the embedded one's too
	id        string         // names the prefix and the queue (demoPrefix, demoQueue)
	prefix    string
	queue     string
	partner   *partnerAPI
	servers   []*asynq.Server
	sched     *scheduler.Scheduler
	th        *worker.Throttler
	inspector *asynq.Inspector
	dash      *demoDashboard // with --dashboard
	started   time.Time
	enqueued  time.Time // when the servers started and the tasks went in
	finished  chan struct{}

	expected map[string]int // tenant → tasks calling the partner
	exports  atomic.Int32   // running now
	mostExp  atomic.Int32   // most running at once

	mu          sync.Mutex
	runs        map[string]int // task ID → times run
	ranBy       map[string]int // tenant (or "exports") → tasks done
	tenantOf    map[string]string
	admitted    map[string][]time.Time // tenant → its partner calls' admissions, on the Redis clock, in order
	allAdmitted []time.Time            // every tenant's, in order
	offset      time.Duration          // the Redis clock less this process's (see clockOffset)
	offsetErr   time.Duration          // within how much offset is known
	waited      map[string]int         // tenant → tasks that waited inline
	resched     map[string]int         // tenant → reschedules
	seen        map[string]bool        // partner calls' task IDs the throttle has decided on
	firstSeen   map[string][]time.Time // tenant → when its calls were first decided on, on this process's clock
	gaveUp      int
	undecided   int
	closeOnce   sync.Once
}

func startDemo(opts options) (*demo, error) {
	d := &demo{
		opts: opts, started: time.Now(), finished: make(chan struct{}),
		expected: map[string]int{}, runs: map[string]int{}, ranBy: map[string]int{}, tenantOf: map[string]string{},
		admitted: map[string][]time.Time{}, waited: map[string]int{}, resched: map[string]int{},
		seen: map[string]bool{}, firstSeen: map[string][]time.Time{},
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	d.id = hex.EncodeToString(id[:])
	d.prefix, d.queue = demoPrefix(d.id), demoQueue(d.id)
	spec := redisaddr.Spec{Value: opts.redisAddr, Cluster: opts.cluster, Master: opts.sentinel}
	if spec.Value == "" {
		if spec.Cluster || spec.Master != "" {
			return nil, errors.New("--cluster and --sentinel need --redis: the embedded Redis is one server")
		}
		// miniredis listens on a loopback port, where throttlectl can
		// reach it while the demo runs.
		d.mini = miniredis.NewMiniRedis()
		if err := d.mini.Start(); err != nil {
			return nil, fmt.Errorf("starting the embedded Redis: %w", err)
		}
		spec.Value = d.mini.Addr()
	}
	d.addr = redisaddr.Redacted(spec.Value)
	ropts, err := spec.Read()
	if err != nil {
		d.stop()
		return nil, fmt.Errorf("--redis %q: %w", d.addr, err)
	}
	d.kind, d.spec = ropts.Kind(), spec
	d.rdb = ropts.NewClient()
	if err := d.rdb.Ping(context.Background()).Err(); err != nil {
		d.stop()
		return nil, fmt.Errorf("the %s at %s: %w", d.kind, d.addr, err)
	}
	offset, within, err := clockOffset(context.Background(), d.rdb)
	if err != nil {
		d.stop()
		return nil, fmt.Errorf("the Redis at %s: reading its clock: %w", d.addr, err)
	}
	d.offset, d.offsetErr = offset, within
	d.inspector = asynq.NewInspectorFromRedisClient(d.rdb)
	if opts.dashboard != "" {
		dash, err := startDashboard(d.rdb, opts.dashboard, d.prefix)
		if err != nil {
			d.stop()
			return nil, err
		}
		d.dash = dash
	}
	d.partner = newPartnerAPI()
	th, err := d.throttler()
	if err != nil {
		d.stop()
		return nil, err
	}
	d.th = th
	d.plan()
	d.enqueued = time.Now()
	for range opts.servers {
		cfg := asynq.Config{Concurrency: opts.concurrency, Queues: map[string]int{d.queue: 1}, LogLevel: asynq.FatalLevel, ShutdownTimeout: 2 * time.Second}
		th.Configure(&cfg)
		srv := asynq.NewServerFromRedisClient(d.rdb, cfg)
		if err := srv.Start(th.Middleware(d.handler())); err != nil {
			d.stop()
			return nil, err
		}
		d.servers = append(d.servers, srv)
	}
	if err := d.enqueue(th); err != nil {
		d.stop()
		return nil, err
	}
	return d, nil
}

// throttler builds the fleet's rules: each tenant's rate and the overall
// rate on partner calls, and the cap on exports.
func (d *demo) throttler() (*worker.Throttler, error) {
	limiterOpts := []throttle.Option{throttle.WithPrefix(d.prefix)}
	workerOpts := []worker.Option{worker.WithPrefix(d.prefix), worker.WithObserver(worker.ObserverFunc(d.observe))}
	if d.dash != nil {
		limiterOpts = append(limiterOpts, throttle.WithObserver(d.dash.pub))
		workerOpts = append(workerOpts, worker.WithObserver(d.dash.pub))
	}
	perTenant, err := throttle.New(d.rdb, "partner-per-tenant", d.opts.algorithm.policy(d.opts.tenantRate), limiterOpts...)
	if err != nil {
		return nil, err
	}
	overall, err := throttle.New(d.rdb, "partner-overall", d.opts.algorithm.policy(d.opts.overallRate), limiterOpts...)
	if err != nil {
		return nil, err
	}
	exports, err := throttle.NewConcurrencyLimiter(d.rdb, "exports", throttle.Concurrency{Limit: d.opts.exportCap, Lease: 10 * time.Second}, limiterOpts...)
	if err != nil {
		return nil, err
	}
	tenant := worker.ByPayloadField("tenant")
	overallOpts := []worker.RuleOption{worker.KeyBy(worker.Constant("partner-api"))}
	if d.opts.algorithm.meter {
		// The overall limit shared fairly between the tenants with a
		// backlog (rate rules only).
		overallOpts = append(overallOpts, worker.FairBy(tenant))
	}
	return worker.New(d.rdb, []worker.Rule{
		worker.Rate("tenant", worker.Type("partner:sync"), perTenant, worker.KeyBy(tenant)),
		worker.Rate("overall", worker.Type("partner:sync"), overall, overallOpts...),
		worker.Concurrency("exports", worker.Type("export:run"), exports, worker.KeyBy(worker.Constant("exports"))),
	}, workerOpts...)
}

// tenantOf returns the tenant of the i-th of n partner calls: every call
// of the first tenant, then of the second, and so on, by their shares.
func tenantOf(i, n int) string {
	for t, upTo := 0, 0; t < len(tenants)-1; t++ {
		upTo += n * tenants[t].share / 100
		if i < upTo {
			return tenants[t].name
		}
	}
	return tenants[len(tenants)-1].name
}

// plan counts the tasks each tenant will run, before any server starts:
// the demo is done when every count is reached.
func (d *demo) plan() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range d.opts.tasks {
		d.expected[tenantOf(i, d.opts.tasks)]++
	}
	d.expected[batchTenant] += d.opts.batch
}

// enqueue puts the work in: a backlog of partner calls, the exports, and a
// scheduler entry whose first tick paces the nightly batch.
func (d *demo) enqueue(th *worker.Throttler) error {
	client := asynq.NewClientFromRedisClient(d.rdb)
	add := func(typ string, p payload) error {
		body, _ := json.Marshal(p)
		info, err := client.Enqueue(asynq.NewTask(typ, body), asynq.Queue(d.queue))
		if err != nil {
			return fmt.Errorf("enqueueing: %w", err)
		}
		d.mu.Lock()
		d.tenantOf[info.ID] = p.Tenant
		d.mu.Unlock()
		return nil
	}
	for i := range d.opts.tasks {
		if err := add("partner:sync", payload{Tenant: tenantOf(i, d.opts.tasks)}); err != nil {
			return err
		}
	}
	for range d.opts.exports {
		if err := add("export:run", payload{}); err != nil {
			return err
		}
	}
	if d.opts.batch == 0 {
		return nil
	}
	sched, err := scheduler.New(d.rdb, scheduler.WithPrefix(d.prefix), scheduler.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		return err
	}
	var fired atomic.Bool
	err = sched.Add("nightly-resync", "@every 2s", scheduler.Batch(func(ctx context.Context) ([]*asynq.Task, error) {
		if fired.Swap(true) {
			return nil, nil // the demo's night has one batch
		}
		batch := make([]*asynq.Task, d.opts.batch)
		for i := range batch {
			body, _ := json.Marshal(payload{Tenant: batchTenant, Batch: true})
			batch[i] = asynq.NewTask("partner:sync", body)
		}
		return batch, nil
	}), scheduler.PacedBy(th), scheduler.TaskOptions(asynq.Queue(d.queue)))
	if err != nil {
		return err
	}
	d.sched = sched
	return sched.Start()
}

// handler is the fleet's task handler: a partner call, or an export.
func (d *demo) handler() asynq.Handler {
	httpClient := &http.Client{Timeout: 10 * time.Second}
	return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		var p payload
		_ = json.Unmarshal(task.Payload(), &p)
		switch task.Type() {
		case "partner:sync":
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.partner.URL, nil)
			req.Header.Set("X-Tenant", p.Tenant)
			resp, err := httpClient.Do(req)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		case "export:run":
			now := d.exports.Add(1)
			for m := d.mostExp.Load(); now > m && !d.mostExp.CompareAndSwap(m, now); m = d.mostExp.Load() {
			}
			time.Sleep(300 * time.Millisecond)
			d.exports.Add(-1)
			p.Tenant = "exports"
		}
		d.record(worker.OriginalTaskID(ctx, task), p.Tenant)
		return nil
	})
}

func (d *demo) record(id, tenant string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.runs[id]++
	d.ranBy[tenant]++
	if d.doneLocked() {
		d.closeOnce.Do(func() { close(d.finished) })
	}
}

func (d *demo) observe(_ context.Context, e worker.Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	id := originalID(e.TaskID)
	tenant, ok := d.tenantOf[id]
	if !ok && strings.HasPrefix(id, "nightly-resync@") {
		tenant = batchTenant // the scheduler's batch
	}
	if e.TaskType == "partner:sync" && !d.seen[id] {
		d.seen[id] = true
		d.firstSeen[tenant] = append(d.firstSeen[tenant], time.Now())
	}
	if (e.Kind == worker.Admitted || e.Kind == worker.WaitedInline) && e.TaskType == "partner:sync" && !e.Slot.IsZero() {
		d.admitLocked(tenant, e.Slot)
	}
	switch e.Kind {
	case worker.WaitedInline:
		d.waited[tenant]++
	case worker.Rescheduled:
		d.resched[tenant]++
	case worker.GaveUp:
		d.gaveUp++
	case worker.Failed:
		d.undecided++
	}
}

// done reports whether every task has run.
func (d *demo) done() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.doneLocked()
}

func (d *demo) doneLocked() bool {
	for tenant, n := range d.expected {
		if d.ranBy[tenant] < n {
			return false
		}
	}
	return d.ranBy["exports"] >= d.opts.exports
}

// redisName says which Redis the demo runs on.
func (d *demo) redisName() string {
	if d.mini != nil {
		return "embedded Redis " + d.addr
	}
	return d.kind + " " + d.addr
}

// stop shuts the fleet down and removes every key the demo put in Redis
// (see removeKeys), then says how many it removed.
func (d *demo) stop() (removed int, err error) {
	if d.sched != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = d.sched.Stop(ctx)
		cancel()
	}
	for _, s := range d.servers {
		s.Shutdown()
	}
	if d.th != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = d.th.Close(ctx)
		cancel()
	}
	if d.partner != nil {
		d.partner.Close()
	}
	var dashErr error
	if d.dash != nil {
		dashErr = d.dash.close() // its last counts go in before the keys go out
	}
	if d.rdb != nil {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		removed, err = d.removeKeys(ctx)
		cancel()
		d.rdb.Close()
	}
	if d.mini != nil {
		d.mini.Close()
	}
	if err != nil {
		err = fmt.Errorf("removing the demo's keys (%s): %w", strings.Join(keyPatterns(d.id), ", "), err)
	}
	return removed, errors.Join(dashErr, err)
}
