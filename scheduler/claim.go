package scheduler

import (
	"context"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/bounded"
	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/scripts"
)

var tickClaimScript = scripts.Load(scriptFiles, "lua/assembled/tick_claim.lua")

// Claim modes of tick_claim.lua.
const (
	claimTake    = "0"
	claimRenew   = "1"
	claimFinish  = "2"
	claimRelease = "3"
	claimRecover = "4"
)

// A claim on a tick is a lease, renewed while its batch is produced: when
// its replica stops, or dies, it lapses within claimLease, and another
// replica, looking every recoverEvery, takes the tick over.
const (
	claimLease   = 6 * time.Second
	claimRenewal = claimLease / 3
	recoverEvery = 3 * time.Second
	// recoverWithin is how old an unfinished tick may be and still be
	// taken over; a claim's hash outlives its last write by as much.
	recoverWithin = 24 * time.Hour
)

// claims are the Redis keys of one entry's claims: the ticks in production
// and the ticks done, in the entry's Cluster slot.
type claims struct {
	running, done string
}

func (s *Scheduler) claimsOf(entry string) claims {
	base := s.cfg.prefix + "sched:" + keyspace.Tag(entry)
	return claims{running: base + ":running", done: base + ":done"}
}

// claim runs one mode of the claim script for tick (a Unix time in µs, or
// for recover the oldest tick to take over) with a claim or memory of span.
func (s *Scheduler) claim(ctx context.Context, c claims, mode string, tick int64, span time.Duration) (int64, error) {
	var n int64
	err := bounded.Call(ctx, func(ctx context.Context) error {
		var err error
		n, err = tickClaimScript.Run(ctx, s.client, []string{c.running, c.done},
			mode, s.replica, tick, span.Microseconds(), (recoverWithin + claimLease).Microseconds()).Int64()
		return err
	})
	if err != nil {
		return 0, err // n may still be written by a call abandoned at ctx's end
	}
	return n, nil
}

// keepClaim renews the claim on tick every claimRenewal until done is
// closed, or until the claim turns out to be no longer this replica's (it
// lapsed while Redis could not be reached, and another replica took it:
// both then produce the batch, whose task IDs make the second run enqueue
// only what is missing).
func (s *Scheduler) keepClaim(c claims, tick int64, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-s.clock.At(s.clock.Now().Add(claimRenewal)):
		}
		ctx, cancel := context.WithTimeout(context.Background(), claimRenewal)
		ours, err := s.claim(ctx, c, claimRenew, tick, claimLease)
		cancel()
		if err == nil && ours == 0 {
			return
		}
	}
}

// recoverTicks looks, every recoverEvery until ctx ends, for ticks of e
// whose claim lapsed before their batch was done (their replica stopped or
// died), takes them over and produces them.
func (s *Scheduler) recoverTicks(ctx context.Context, e *entry) {
	c := s.claimsOf(e.name)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.clock.At(s.clock.Now().Add(recoverEvery)):
		}
		for ctx.Err() == nil {
			oldest := s.clock.Now().Add(-recoverWithin).UnixMicro()
			tick, err := s.claim(ctx, c, claimRecover, oldest, claimLease)
			if err != nil || tick == 0 {
				break // Redis unreachable (the next look retries), or none
			}
			s.running.Add(1)
			go func() {
				defer s.running.Done()
				s.produceClaimed(ctx, e, time.UnixMicro(tick))
			}()
		}
	}
}

// release gives up this replica's claim on a tick whose batch it could not
// finish, so that another replica takes it over at once rather than when
// the claim lapses. It runs detached from ctx, which is ending.
func (s *Scheduler) release(ctx context.Context, c claims, tick int64) {
	_ = bounded.Finish(ctx, bounded.CleanupLimit, func(ctx context.Context) error {
		_, err := s.claim(ctx, c, claimRelease, tick, 0)
		return err
	})
}
