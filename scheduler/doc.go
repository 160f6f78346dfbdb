// Package scheduler fires batch jobs on cron schedules across replicas,
// each tick exactly once, and paces their tasks on the fleet's throttles.
//
// A nightly "re-sync all 40,000 customers with the partner API" enqueued in
// one burst fights the rate limit task by task; and asynq's own Scheduler,
// run on every replica for availability, enqueues every periodic task once
// per replica. This package does neither:
//
//	s, _ := scheduler.New(rdb)
//	err := s.Add("resync", "CRON_TZ=Europe/Berlin 30 3 * * *",
//		scheduler.Stream(func(ctx context.Context, emit func(*asynq.Task) error) error {
//			for _, c := range customers(ctx) {
//				if err := emit(asynq.NewTask("partner:sync", c.JSON())); err != nil {
//					return err
//				}
//			}
//			return nil
//		}),
//		scheduler.PacedBy(th), // the workers' worker.Throttler
//	)
//	s.Start()
//	defer s.Stop(ctx)
//
// # Once across replicas, and to its end
//
// Every replica runs every entry; at each tick they race for a claim in
// Redis, and only the winner runs the producer. The claim is a lease of 6 s,
// renewed every 2 s while the batch is produced. A replica that is stopped
// (Stop) while its producer runs gives the tick up at once; one that dies,
// or loses Redis, stops renewing and its claim lapses within 6 s. Every
// replica looks every 3 s for such ticks and takes them over: the batch is
// produced again, to its end, by another replica. A finished tick is
// remembered (for twice the time to the next tick, from ten minutes to a
// day) so that no replica fires it again; an entry keeps two Redis keys
// whatever its schedule, and each replica costs Redis one script call per
// entry every 3 s besides the ticks themselves.
//
// A tick's tasks get the asynq IDs "<entry>@<tick>:<index>", so a batch
// produced again enqueues only what is missing. This asks two things of a
// producer: build the batch from the tick ([TickTime]), not from the time
// it runs (a re-run may come seconds later, after midnight say), and emit
// the same tasks in the same order each time. A producer that fails, or
// panics, ends its tick: the error is reported and the tick is not tried
// again. A batch cut short because a task could not be booked or enqueued
// (Redis unreachable) is released and tried again, like a stopped one.
//
// Schedules are robfig/cron specs: five fields, or six with leading
// seconds, descriptors such as @daily, and CRON_TZ=<zone>. A spec without
// a zone is read in UTC ([WithLocation] changes that), so that replicas on
// machines set to different zones agree on every tick. "@every d" ticks at
// the multiples of d since the Unix epoch, the same instants on every
// replica. The package runs its own timer per entry, so producers get a
// context and return an error, and Stop cancels and waits for them.
//
// # Pacing
//
// With [PacedBy], each task of a batch books its slots on the worker's
// TokenBucket and GCRA rules that match it (worker.Throttler.Book) and is
// enqueued with ProcessAt at its slot: 40,000 tasks at 50/s flow over 800 s,
// and each is admitted on arrival at a worker instead of being throttled
// again and again. [Pace] does the same for one batch, without cron.
//
// asynq keeps ProcessAt in whole seconds and moves due tasks to their queue
// once per forwarder pass, and idle workers look at their queues now and
// then. So a paced task is due in asynq a little before its slot (the
// Throttler's Lead: 1.4 s with the intervals its Configure sets), and its
// slot starts no sooner than that from the booking: it reaches a worker
// ahead of its slot, finds its slots there, and waits in its handler to
// start exactly at them. Measured (TestPaceSpreadsABatch): 500 tasks paced
// at 100/s were planned exactly 10 ms apart, all 500 were admitted on
// arrival, and no second held more than 101 starts. [DeliverAtSlot] makes
// ProcessAt the slot itself instead, for when asynq's own view of the plan
// matters more; tasks then mostly arrive after their slots and those of a
// second start together.
//
// Producer failures, panics and enqueueing errors are logged (slog), passed
// to the error handler, and stop only their own tick.
package scheduler
