package scheduler

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// specParser reads the five-field cron format with an optional leading
// seconds field, descriptors such as @hourly and @every 10m, and CRON_TZ=.
var specParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// parseSpec reads an entry's spec. A spec that names no zone is read in
// loc. "@every d" ticks at the multiples of d since the Unix epoch (robfig's
// counts from when each process started, so replicas would tick apart).
func parseSpec(spec string, loc *time.Location) (cron.Schedule, error) {
	schedule, err := specParser.Parse(spec)
	if err != nil {
		return nil, err
	}
	switch s := schedule.(type) {
	case cron.ConstantDelaySchedule:
		return everySchedule{s.Delay}, nil
	case *cron.SpecSchedule:
		if !strings.HasPrefix(spec, "CRON_TZ=") && !strings.HasPrefix(spec, "TZ=") {
			// Set here, not written into the spec as CRON_TZ=: a zone
			// made with time.FixedZone has a name no parser can load.
			s.Location = loc
		}
	}
	return schedule, nil
}

// everySchedule ticks at every multiple of d since the Unix epoch, so that
// every replica ticks at the same instants.
type everySchedule struct{ d time.Duration }

// Next returns the first multiple of d after t.
func (s everySchedule) Next(t time.Time) time.Time {
	d := s.d.Nanoseconds()
	return time.Unix(0, (t.UnixNano()/d+1)*d).In(t.Location())
}

// doneKeep is how long a finished tick is remembered, so that no replica
// fires it again: twice the time to the next tick, at least ten minutes (a
// replica whose timer fires that late, after a long pause, would run the
// tick twice) and at most a day.
func doneKeep(schedule cron.Schedule, tick time.Time) time.Duration {
	return min(max(2*schedule.Next(tick).Sub(tick), 10*time.Minute), 24*time.Hour)
}

// tickKey is the context key of the tick a producer runs for.
type tickKey struct{}

// TickTime returns the tick a producer runs for, from the context the
// scheduler gives it; false outside a producer. A tick may be produced more
// than once (see the package documentation): a producer that derives its
// batch from the tick, not from the time it runs, emits the same tasks
// each time.
func TickTime(ctx context.Context) (time.Time, bool) {
	tick, ok := ctx.Value(tickKey{}).(time.Time)
	return tick, ok
}

// batchID names the tasks of one tick: "<entry>@<tick>", the tick in UTC.
func batchID(entry string, tick time.Time) string {
	return fmt.Sprintf("%s@%s", entry, tick.UTC().Format(time.RFC3339Nano))
}
