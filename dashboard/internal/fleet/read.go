package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limiters returns every limiter published in the last 24 hours, sorted by
// name. A record that cannot be read is skipped.
func Limiters(ctx context.Context, c redis.UniversalClient, prefix string) ([]Limiter, error) {
	all, err := c.HGetAll(ctx, limitersKey(prefix)).Result()
	if err != nil {
		return nil, fmt.Errorf("dashboard: reading the published limiters: %w", err)
	}
	out := make([]Limiter, 0, len(all))
	for name, value := range all {
		var r limiterRecord
		if json.Unmarshal([]byte(value), &r) != nil {
			continue
		}
		out = append(out, Limiter{Name: name, Kind: r.Kind, CodePolicy: r.CodePolicy, Seen: time.UnixMilli(r.SeenMs)})
	}
	slices.SortFunc(out, func(a, b Limiter) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Processes returns the processes that flushed at or after since, the most
// recent first.
func Processes(ctx context.Context, c redis.UniversalClient, prefix string, since time.Time) ([]Process, error) {
	zs, err := c.ZRevRangeByScoreWithScores(ctx, procsKey(prefix), &redis.ZRangeBy{
		Min: strconv.FormatInt(since.UnixMilli(), 10), Max: "+inf",
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("dashboard: reading the publishing processes: %w", err)
	}
	out := make([]Process, len(zs))
	for i, z := range zs {
		name, _ := z.Member.(string)
		out[i] = Process{Name: name, Seen: time.UnixMilli(int64(z.Score))}
	}
	return out, nil
}

// LimiterSeries returns the limiter's counts, all keys together, one Point
// per second from the second holding from up to to (excluded), zero where
// nothing was counted.
func LimiterSeries(ctx context.Context, c redis.UniversalClient, prefix, limiter string, from, to time.Time) ([]Point, error) {
	base := limiterBase(prefix, limiter)
	return series(ctx, c, from, to, func(minute int64) string { return secondsKey(base, minute) })
}

// KeySeries is LimiterSeries for one caller key.
func KeySeries(ctx context.Context, c redis.UniversalClient, prefix, limiter, key string, from, to time.Time) ([]Point, error) {
	base := limiterBase(prefix, limiter)
	return series(ctx, c, from, to, func(minute int64) string { return callerKey(base, minute, key) })
}

func series(ctx context.Context, c redis.UniversalClient, from, to time.Time, keyOf func(int64) string) ([]Point, error) {
	from = from.Truncate(time.Second)
	if !to.After(from) {
		return nil, nil
	}
	if to.Sub(from) > MaxSpan {
		return nil, fmt.Errorf("%w: %s", ErrSpan, to.Sub(from))
	}
	mins := minutes(from, to)
	pipe := c.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(mins))
	for i, m := range mins {
		cmds[i] = pipe.HGetAll(ctx, keyOf(m))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("dashboard: reading counts: %w", err)
	}
	counts := map[int64]*Counts{}
	for i, cmd := range cmds {
		for field, value := range cmd.Val() {
			if len(field) < 2 {
				continue // "p", the key's policy
			}
			sec, err := strconv.ParseInt(field[:len(field)-1], 10, 64)
			n, err2 := strconv.ParseInt(value, 10, 64)
			if err != nil || err2 != nil {
				continue
			}
			unix := mins[i]*60 + sec
			p := counts[unix]
			if p == nil {
				p = &Counts{}
				counts[unix] = p
			}
			switch field[len(field)-1] {
			case 'a':
				p.Admitted += n
			case 't':
				p.Throttled += n
			case 'r':
				p.Rescheduled += n
			}
		}
	}
	points := make([]Point, 0, int(to.Sub(from)/time.Second)+1)
	for at := from; at.Before(to); at = at.Add(time.Second) {
		p := Point{At: at}
		if n := counts[at.Unix()]; n != nil {
			p.Admitted, p.Throttled, p.Rescheduled = n.Admitted, n.Throttled, n.Rescheduled
		}
		points = append(points, p)
	}
	return points, nil
}

// KeyPolicy returns the last policy not the code's seen in force for the
// caller key since since, and its source ("plan", "stored", "stored for
// key"); both empty when none was.
func KeyPolicy(ctx context.Context, c redis.UniversalClient, prefix, limiter, key string, since time.Time) (policy, source string, err error) {
	now, err := Now(ctx, c)
	if err != nil {
		return "", "", fmt.Errorf("dashboard: reading the Redis clock: %w", err)
	}
	base := limiterBase(prefix, limiter)
	mins := recentMinutes(since, now)
	pipe := c.Pipeline()
	cmds := make([]*redis.StringCmd, len(mins))
	for i, m := range mins {
		cmds[i] = pipe.HGet(ctx, callerKey(base, m, key), "p")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return "", "", fmt.Errorf("dashboard: reading a key's policy: %w", err)
	}
	for i := len(cmds) - 1; i >= 0; i-- {
		if v := cmds[i].Val(); v != "" {
			i := strings.LastIndexByte(v, '|') // a source never holds one
			if i < 0 {
				return v, "", nil
			}
			return v[:i], v[i+1:], nil
		}
	}
	return "", "", nil
}
