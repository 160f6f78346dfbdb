// Package scheduler fires batch jobs on cron schedules across replicas,
// each tick exactly once, and paces their tasks on the fleet's throttles.
//
// A nightly "re-sync all 40,000 customers with the partner API" enqueued in
// one burst fights the rate limit task by task; and asynq's own Scheduler,
// run on every replica for availability, enqueues every periodic task once
// per replica. This package does neither:
//
//	s, _ := scheduler.New(rdb)
//	err := s.Add("resync", "CRON_TZ=Europe/Berlin 0 2 * * *",
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
// # Exactly once across replicas
//
// Every replica runs every entry; at each tick they race for a claim in
// Redis keyed by entry and tick time (SET NX with an expiry, kept alive while
// the batch is produced and then remembered for a day), and only the winner
// runs the producer. A replica that dies mid-run stops nothing: the next
// ticks are claimed by the others. Tasks get the asynq IDs
// "<entry>@<tick>:<index>", so running a tick's batch again (by hand, after
// its replica died halfway) enqueues only what is missing.
//
// Schedules are robfig/cron specs: five fields, or six with leading
// seconds, descriptors such as @daily and @every 10m, and CRON_TZ=<zone>.
// The package runs its own timer per entry, so producers get a context and
// return an error, and Stop cancels and waits for them.
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
// once per forwarder pass, so a task reaches a worker from the start of its
// slot's second to a pass after: early, it waits in its handler for its slot;
// late, it runs on arrival on the slot it booked (bookings made here may be
// claimed that long after their start). The tasks of a second whose slots
// passed before the pass that delivers them start together: with the
// intervals worker.Throttler.Configure sets, 500 tasks paced at 100/s were
// planned exactly 10 ms apart, none was throttled on arrival, and at most
// 120–132 started within any one second (TestPaceSpreadsABatch).
//
// Producer failures, panics and enqueueing errors are logged (slog), passed
// to the error handler, and stop only their own tick.
package scheduler
