package fleet

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Flush writes b in one pipeline (after one HMGET when a limiter's kind or
// code policy is missing from b, to keep the ones stored), at now on the Redis
// clock. It returns the number of commands the write pipeline sent.
func Flush(ctx context.Context, c redis.UniversalClient, prefix string, b *Batch, now time.Time) (int, error) {
	stored, err := storedRecords(ctx, c, prefix, b)
	if err != nil {
		return 0, err
	}
	pipe := c.Pipeline()
	minuteTTL := MinuteTTL
	for name, l := range b.Limiters {
		base := limiterBase(prefix, name)
		expire := map[string]bool{}
		incr := func(key string, sec int64, c Counts) {
			field := strconv.FormatInt(sec, 10)
			if c.Admitted != 0 {
				pipe.HIncrBy(ctx, key, field+"a", c.Admitted)
			}
			if c.Throttled != 0 {
				pipe.HIncrBy(ctx, key, field+"t", c.Throttled)
			}
			if c.Rescheduled != 0 {
				pipe.HIncrBy(ctx, key, field+"r", c.Rescheduled)
			}
			expire[key] = true
		}
		for _, s := range l.Seconds {
			incr(secondsKey(base, floorDiv(s.Unix, 60)), s.Unix-60*floorDiv(s.Unix, 60), s.Counts)
		}
		for key, caller := range l.Callers {
			held := map[int64]int64{}
			admitted := map[int64]int64{}
			for _, s := range caller.Seconds {
				minute := floorDiv(s.Unix, 60)
				k := callerKey(base, minute, key)
				incr(k, s.Unix-60*minute, s.Counts)
				if caller.Policy != "" && held[minute] == 0 && admitted[minute] == 0 {
					pipe.HSet(ctx, k, "p", caller.Policy+"|"+caller.Source)
				}
				held[minute] += s.Throttled // a rescheduled task was throttled first
				admitted[minute] += s.Admitted
			}
			for minute, n := range held {
				if n != 0 {
					pipe.ZIncrBy(ctx, heldKey(base, minute), float64(n), key)
					expire[heldKey(base, minute)] = true
				}
			}
			for minute, n := range admitted {
				if n != 0 {
					pipe.ZIncrBy(ctx, admittedKey(base, minute), float64(n), key)
					expire[admittedKey(base, minute)] = true
				}
			}
		}
		for key := range expire {
			pipe.Expire(ctx, key, minuteTTL)
		}
		record := limiterRecord{Kind: l.Kind, CodePolicy: l.CodePolicy, SeenMs: now.UnixMilli()}
		if old, ok := stored[name]; ok {
			record.Kind = cmp.Or(record.Kind, old.Kind)
			record.CodePolicy = cmp.Or(record.CodePolicy, old.CodePolicy)
		}
		record.Kind = cmp.Or(record.Kind, "rate")
		encoded, err := json.Marshal(record)
		if err != nil {
			return 0, fmt.Errorf("dashboard: encoding limiter %q: %w", name, err)
		}
		pipe.HSet(ctx, limitersKey(prefix), name, encoded)
	}
	if len(b.Limiters) > 0 {
		pipe.Expire(ctx, limitersKey(prefix), LimitersTTL)
	}
	pipe.ZAdd(ctx, procsKey(prefix), redis.Z{Score: float64(now.UnixMilli()), Member: b.Process})
	pipe.ZRemRangeByScore(ctx, procsKey(prefix), "-inf", "("+strconv.FormatInt(now.Add(-ProcsKept).UnixMilli(), 10))
	pipe.Expire(ctx, procsKey(prefix), ProcsTTL)
	sent := pipe.Len()
	if _, err := pipe.Exec(ctx); err != nil {
		return sent, fmt.Errorf("dashboard: publishing counts: %w", err)
	}
	return sent, nil
}

// limiterRecord is a limiter's value in the limiters' hash.
type limiterRecord struct {
	Kind       string `json:"kind"`
	CodePolicy string `json:"code_policy"`
	SeenMs     int64  `json:"seen_ms"`
}

// storedRecords returns the records stored for the limiters of b whose
// kind or code policy b lacks.
func storedRecords(ctx context.Context, c redis.UniversalClient, prefix string, b *Batch) (map[string]limiterRecord, error) {
	var names []string
	for name, l := range b.Limiters {
		if l.CodePolicy == "" || l.Kind == "" {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	values, err := c.HMGet(ctx, limitersKey(prefix), names...).Result()
	if err != nil {
		return nil, fmt.Errorf("dashboard: reading the limiters' code policies: %w", err)
	}
	stored := make(map[string]limiterRecord, len(names))
	for i, v := range values {
		s, ok := v.(string)
		if !ok {
			continue
		}
		var r limiterRecord
		if json.Unmarshal([]byte(s), &r) == nil {
			stored[names[i]] = r
		}
	}
	return stored, nil
}
