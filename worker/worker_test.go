package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/redis/go-redis/v9"
)

func TestNewRejectsBadRules(t *testing.T) {
	tg := redistest.Embedded(t)
	limiter, _ := throttle.New(tg.Client, "limiter", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1})
	window, _ := throttle.New(tg.Client, "window", throttle.FixedWindow{Limit: 1, Window: time.Second})
	capped, _ := throttle.NewConcurrencyLimiter(tg.Client, "capped", throttle.Concurrency{Limit: 1, Lease: time.Second})
	leased, _ := throttle.New(tg.Client, "leased", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1}, throttle.WithLeasedShares(0))
	good := worker.Rate("ok", worker.AnyTask(), limiter, worker.KeyBy(worker.ByType()))
	fair := func(name string, m worker.Matcher) worker.Rule {
		return worker.Rate(name, m, limiter, worker.KeyBy(worker.Constant("all")), worker.FairBy(worker.ByType()))
	}
	for name, rules := range map[string][]worker.Rule{
		"none":          nil,
		"no name":       {worker.Rate("", worker.AnyTask(), limiter, worker.KeyBy(worker.ByType()))},
		"nil matcher":   {worker.Rate("r", nil, limiter, worker.KeyBy(worker.ByType()))},
		"nil limiter":   {worker.Rate("r", worker.AnyTask(), nil, worker.KeyBy(worker.ByType()))},
		"nil conc":      {worker.Concurrency("r", worker.AnyTask(), nil, worker.KeyBy(worker.ByType()))},
		"bad pattern":   {worker.Rate("r", worker.Pattern("a["), limiter, worker.KeyBy(worker.ByType()))},
		"duplicate":     {good, good},
		"nil key":       {worker.Rate("r", worker.AnyTask(), limiter, worker.KeyBy(nil))},
		"nil option":    {worker.Rate("r", worker.AnyTask(), limiter, nil, worker.KeyBy(worker.ByType()))},
		"bad bookahead": {worker.Rate("r", worker.AnyTask(), limiter, worker.BookAhead(0), worker.KeyBy(worker.ByType()))},
		"bad give-up":   {worker.Rate("r", worker.AnyTask(), limiter, worker.GiveUp(worker.GiveUpPolicy{MaxThrottles: -1}), worker.KeyBy(worker.ByType()))},
		"fair window":   {worker.Rate("r", worker.AnyTask(), window, worker.FairBy(worker.ByType()), worker.KeyBy(worker.ByType()))},
		"fair cap":      {worker.Concurrency("r", worker.AnyTask(), capped, worker.FairBy(worker.ByType()), worker.KeyBy(worker.ByType()))},
		"weights only":  {worker.Rate("r", worker.AnyTask(), limiter, worker.Weights(func(string) int { return 2 }), worker.KeyBy(worker.ByType()))},
		"nil flow":      {worker.Rate("r", worker.AnyTask(), limiter, worker.FairBy(nil), worker.KeyBy(worker.ByType()))},
		"nil weights":   {worker.Rate("r", worker.AnyTask(), limiter, worker.FairBy(worker.ByType()), worker.Weights(nil), worker.KeyBy(worker.ByType()))},
		"no key":        {worker.Rate("r", worker.AnyTask(), limiter)},
		"no cap key":    {worker.Concurrency("r", worker.AnyTask(), capped)},
		"fair leased":   {worker.Rate("r", worker.AnyTask(), leased, worker.FairBy(worker.ByType()), worker.KeyBy(worker.ByType()))},
		// A task waits in one rule's room: two rules that share fairly
		// and may match one task cannot both hold.
		"two fair":         {fair("a", worker.AnyTask()), fair("b", worker.Type("x"))},
		"two fair types":   {fair("a", worker.Type("x", "y")), fair("b", worker.Type("y"))},
		"fair pattern":     {fair("a", worker.Pattern("x:*")), fair("b", worker.Type("x:1"))},
		"fair queues":      {fair("a", worker.Queue("q")), fair("b", worker.Queue("q", "r"))},
		"fair type, queue": {fair("a", worker.Type("x")), fair("b", worker.Queue("q"))},
	} {
		if _, err := worker.New(tg.Client, rules); !errors.Is(err, worker.ErrInvalidRule) {
			t.Errorf("%s: New = %v, want ErrInvalidRule", name, err)
		}
	}
	// Rules that share fairly but pick different tasks are fine.
	for name, rules := range map[string][]worker.Rule{
		"fair, other types":    {fair("a", worker.Type("x", "y")), fair("b", worker.Type("z"))},
		"fair, other pattern":  {fair("a", worker.Pattern("x:*")), fair("b", worker.Type("y:1"))},
		"fair, other queues":   {fair("a", worker.Queue("q")), fair("b", worker.Queue("r"))},
		"fair and not fair":    {fair("a", worker.AnyTask()), good},
		"cap keyed explicitly": {worker.Concurrency("r", worker.AnyTask(), capped, worker.KeyBy(worker.Constant("all")))},
		"leased shares":        {worker.Rate("r", worker.AnyTask(), leased, worker.KeyBy(worker.ByType())), good},
	} {
		th, err := worker.New(tg.Client, rules)
		if err != nil {
			t.Errorf("%s: New = %v, want no error", name, err)
			continue
		}
		_ = th.Close(context.Background())
	}
	for name, opt := range map[string]worker.Option{
		"nil":             nil,
		"negative inline": worker.WithInlineWait(-time.Second),
		"brace prefix":    worker.WithPrefix("a{"),
	} {
		if _, err := worker.New(tg.Client, []worker.Rule{good}, opt); !errors.Is(err, worker.ErrInvalidOption) {
			t.Errorf("option %s: New = %v, want ErrInvalidOption", name, err)
		}
	}
	for _, client := range []redis.UniversalClient{nil, (*redis.Client)(nil), (*redis.ClusterClient)(nil)} {
		if _, err := worker.New(client, []worker.Rule{good}); !errors.Is(err, worker.ErrInvalidOption) {
			t.Errorf("New(%T(nil)): %v; want ErrInvalidOption", client, err)
		}
	}
}

func TestConfigureWrapsTheUsersFunctions(t *testing.T) {
	tg := redistest.Embedded(t)
	limiter, _ := throttle.New(tg.Client, "limiter", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1})
	th, err := worker.New(tg.Client, []worker.Rule{worker.Rate("r", worker.AnyTask(), limiter, worker.KeyBy(worker.ByType()))})
	if err != nil {
		t.Fatal(err)
	}
	userErr := errors.New("the user's own")
	cfg := asynq.Config{
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return 42 * time.Second },
		IsFailure:      func(err error) bool { return !errors.Is(err, userErr) },
	}
	th.Configure(&cfg)
	if cfg.DelayedTaskCheckInterval != 250*time.Millisecond || cfg.TaskCheckInterval != 100*time.Millisecond {
		t.Errorf("DelayedTaskCheckInterval %s, TaskCheckInterval %s; want the defaults", cfg.DelayedTaskCheckInterval, cfg.TaskCheckInterval)
	}
	task := asynq.NewTask("x", nil)
	if d := cfg.RetryDelayFunc(3, errors.New("boom"), task); d != 42*time.Second {
		t.Errorf("another error's delay: %s, want the user's 42s", d)
	}
	if cfg.IsFailure(userErr) || !cfg.IsFailure(errors.New("boom")) {
		t.Error("IsFailure does not defer to the user's function")
	}
	kept := asynq.Config{DelayedTaskCheckInterval: 3 * time.Second, TaskCheckInterval: 2 * time.Second}
	th.Configure(&kept)
	if kept.DelayedTaskCheckInterval != 3*time.Second || kept.TaskCheckInterval != 2*time.Second || kept.IsFailure(errors.New("x")) != true {
		t.Errorf("Configure changed a set interval or lost the default IsFailure: %+v", kept)
	}
	if d := kept.RetryDelayFunc(0, errors.New("x"), task); d < 15*time.Second {
		t.Errorf("without a user function, other errors get asynq's default delay; got %s", d)
	}
}

// TestARejectionGivesBackWhatOtherRulesTook calls the middleware directly:
// when one rule turns a task away, the leases and units other rules gave it
// are returned.
func TestARejectionGivesBackWhatOtherRulesTook(t *testing.T) {
	tg := redistest.Embedded(t)
	ctx := context.Background()
	window, _ := throttle.New(tg.Client, "window", throttle.FixedWindow{Limit: 5, Window: redistest.FarWindow}, throttle.WithPrefix(tg.Prefix))
	meter, _ := throttle.New(tg.Client, "meter", throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1}, throttle.WithPrefix(tg.Prefix))
	conc, _ := throttle.NewConcurrencyLimiter(tg.Client, "conc", throttle.Concurrency{Limit: 1, Lease: time.Minute}, throttle.WithPrefix(tg.Prefix))
	var seen asynqtest.Events
	th, err := worker.New(tg.Client, []worker.Rule{
		worker.Rate("window", worker.AnyTask(), window, worker.KeyBy(worker.Constant("w"))),
		worker.Rate("meter", worker.AnyTask(), meter, worker.KeyBy(worker.Constant("m")), worker.BookAhead(time.Minute)),
		worker.Concurrency("conc", worker.AnyTask(), conc, worker.KeyBy(worker.Constant("c"))),
	}, worker.WithObserver(&seen), worker.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	h := th.Middleware(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran++; return nil }))
	task := asynq.NewTask("job", nil)
	if err := h.ProcessTask(ctx, task); err != nil || ran != 1 {
		t.Fatalf("first task: %v, ran %d", err, ran)
	}
	// The meter's hour is spent: the next task is turned away by it, and
	// the window's unit and the concurrency lease are given back.
	err = h.ProcessTask(ctx, task)
	var throttled *worker.ThrottledError
	if !errors.As(err, &throttled) || !errors.Is(err, worker.ErrThrottled) || throttled.Rule != "meter" || throttled.Key != "m" || ran != 1 {
		t.Fatalf("second task: %v; want throttled by the meter", err)
	}
	if r, _ := window.Peek(ctx, "w"); r.Remaining != 4 {
		t.Errorf("the window kept the refused task's unit: %+v", r)
	}
	if r, _ := conc.Peek(ctx, "c"); r.Remaining != 1 {
		t.Errorf("the refused task kept its lease: %+v", r)
	}
	if seen.Count(worker.Rescheduled) != 1 {
		t.Errorf("events %v", seen.ByKind())
	}
}

func TestKeyFunctions(t *testing.T) {
	task := asynq.NewTaskWithHeaders("partner:sync", []byte(`{"tenant":"acme","account":42,"flag":true}`), map[string]string{"region": "eu"})
	for _, tc := range []struct {
		name string
		key  worker.KeyFunc
		want string
		err  bool
	}{
		{"type", worker.ByType(), "partner:sync", false},
		{"constant", worker.Constant("all"), "all", false},
		{"string field", worker.ByPayloadField("tenant"), "acme", false},
		{"number field", worker.ByPayloadField("account"), "42", false},
		{"bool field", worker.ByPayloadField("flag"), "", true},
		{"missing field", worker.ByPayloadField("nope"), "", true},
		{"header", worker.ByHeader("region"), "eu", false},
		{"missing header", worker.ByHeader("zone"), "", true},
		{"queue outside a server", worker.ByQueue(), worker.DefaultQueue, false},
	} {
		got, err := tc.key(context.Background(), task)
		if got != tc.want || (err != nil) != tc.err || (err != nil && !errors.Is(err, worker.ErrNoKey)) {
			t.Errorf("%s: %q, %v", tc.name, got, err)
		}
	}
	if _, err := worker.ByPayloadField("tenant")(context.Background(), asynq.NewTask("x", []byte("not json"))); !errors.Is(err, worker.ErrNoKey) {
		t.Errorf("not JSON: %v", err)
	}
}

func TestAKeylessTaskFailsWithoutRetries(t *testing.T) {
	tg := redistest.Embedded(t)
	limiter, _ := throttle.New(tg.Client, "limiter", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1}, throttle.WithPrefix(tg.Prefix))
	th, _ := worker.New(tg.Client, []worker.Rule{worker.Rate("tenant", worker.AnyTask(), limiter, worker.KeyBy(worker.ByPayloadField("tenant")))})
	err := th.Middleware(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })).ProcessTask(context.Background(), asynq.NewTask("x", []byte(`{}`)))
	if !errors.Is(err, worker.ErrNoKey) || !errors.Is(err, asynq.SkipRetry) {
		t.Fatalf("task without a tenant: %v; want ErrNoKey and asynq.SkipRetry", err)
	}
}

func TestMatchers(t *testing.T) {
	email, sms := asynq.NewTask("email:send", nil), asynq.NewTask("sms:send", nil)
	for _, tc := range []struct {
		m          worker.Matcher
		email, sms bool
	}{
		{worker.Type("email:send"), true, false},
		{worker.Type("email:send", "sms:send"), true, true},
		{worker.Pattern("email:*"), true, false},
		{worker.Pattern("*:send"), true, true},
		{worker.AnyTask(), true, true},
		{worker.MatchFunc(func(_ context.Context, t *asynq.Task) bool { return t.Type() == "sms:send" }), false, true},
		{worker.Queue(worker.DefaultQueue), true, true}, // outside a server: the default queue
		{worker.Queue("critical"), false, false},
	} {
		ctx := context.Background()
		if tc.m.Match(ctx, email) != tc.email || tc.m.Match(ctx, sms) != tc.sms {
			t.Errorf("%#v: email %v, sms %v", tc.m, tc.m.Match(ctx, email), tc.m.Match(ctx, sms))
		}
	}
}

// TestBookLeavesSharedTurnsToTheRoom: a task under one meter rule gets its
// slot booked, paced behind the last; a task under two (per tenant and
// overall) books nothing, since its turn is decided among the tasks waiting
// for the overall limit when it runs: Book returns now for it.
func TestBookLeavesSharedTurnsToTheRoom(t *testing.T) {
	tg := redistest.New(t)
	opts := []throttle.Option{throttle.WithPrefix(tg.Prefix)}
	perTenant, err := throttle.New(tg.Client, "perTenant", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	overall, err := throttle.New(tg.Client, "overall", throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	tenant := worker.KeyBy(worker.ByPayloadField("tenant"))
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{
		worker.Rate("tenant", worker.Type("paced"), perTenant, tenant),
		worker.Rate("tenant-shared", worker.Type("shared"), perTenant, tenant),
		worker.Rate("overall", worker.Type("shared"), overall, worker.KeyBy(worker.Constant("all"))),
	})
	ctx := context.Background()
	task := func(typ string) *asynq.Task { return asynq.NewTask(typ, []byte(`{"tenant":"a"}`)) }
	first, err := th.Book(ctx, task("paced"), "p1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	second, err := th.Book(ctx, task("paced"), "p2", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if gap := second.Slot.Sub(first.Slot); gap != 100*time.Millisecond {
		t.Fatalf("two bookings under one meter are %s apart; want 100ms", gap)
	}
	before := time.Now()
	b, err := th.Book(ctx, task("shared"), "s1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Slot.IsZero() || b.StartAt.Before(before) || time.Since(b.StartAt) > time.Second {
		t.Fatalf("Book under two meters: %+v; want now and no slot", b)
	}
	if n, err := tg.Client.Exists(ctx, overall.Key("all")).Result(); err != nil || n != 0 {
		t.Fatalf("the overall meter has state after Book under two meters (%d, %v)", n, err)
	}
}
