package fleet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Ranked returns a limiter's caller keys with counts since since, ranked by
// by (the most first; ties in reverse key order), count of them from
// offset on (count < 0: all), and total, the number of keys ranked. A
// non-empty filter keeps only the keys that start with it. Every key with
// counts is ranked, one with a zero count for by included.
//
// It unions the minutes' sets into the limiter's two union keys (which
// expire after UnionTTL), in a MULTI so that two dashboards do not mix
// their unions, then reads the page's other counts.
func Ranked(ctx context.Context, c redis.UniversalClient, prefix, limiter string, by Rank, since time.Time, filter string, offset, count int) (rows []KeyActivity, total int, err error) {
	now, err := Now(ctx, c)
	if err != nil {
		return nil, 0, fmt.Errorf("dashboard: reading the Redis clock: %w", err)
	}
	base := limiterBase(prefix, limiter)
	mins := recentMinutes(since, now)
	byKeys, otherKeys := minuteSets(base, mins, by), minuteSets(base, mins, 1-by)
	byUnion, otherUnion := unionKey(base, by), unionKey(base, 1-by)
	offset = max(offset, 0)
	var ranked *redis.ZSliceCmd
	var card *redis.IntCmd
	_, err = c.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		// every key of either set, scored by by alone
		weights := make([]float64, 0, 2*len(mins))
		for range byKeys {
			weights = append(weights, 1)
		}
		for range otherKeys {
			weights = append(weights, 0)
		}
		pipe.ZUnionStore(ctx, byUnion, &redis.ZStore{Keys: append(append([]string{}, byKeys...), otherKeys...), Weights: weights})
		pipe.Expire(ctx, byUnion, UnionTTL)
		pipe.ZUnionStore(ctx, otherUnion, &redis.ZStore{Keys: otherKeys})
		pipe.Expire(ctx, otherUnion, UnionTTL)
		card = pipe.ZCard(ctx, byUnion)
		if filter != "" {
			ranked = pipe.ZRevRangeWithScores(ctx, byUnion, 0, -1)
		} else {
			stop := int64(-1)
			if count >= 0 {
				stop = int64(offset) + int64(count) - 1
			}
			ranked = pipe.ZRevRangeWithScores(ctx, byUnion, int64(offset), stop)
		}
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("dashboard: ranking keys: %w", err)
	}
	if count == 0 {
		ranked.SetVal(nil)
	}
	zs := ranked.Val()
	total = int(card.Val())
	if filter != "" {
		kept := zs[:0]
		for _, z := range zs {
			if key, _ := z.Member.(string); strings.HasPrefix(key, filter) {
				kept = append(kept, z)
			}
		}
		total = len(kept)
		zs = kept[min(offset, len(kept)):]
		if count >= 0 && count < len(zs) {
			zs = zs[:count]
		}
	}
	if len(zs) == 0 {
		return nil, total, nil
	}
	keys := make([]string, len(zs))
	rows = make([]KeyActivity, len(zs))
	for i, z := range zs {
		keys[i], _ = z.Member.(string)
		rows[i].Key = keys[i]
		rows[i].set(by, int64(z.Score))
	}
	others, err := c.ZMScore(ctx, otherUnion, keys...).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, fmt.Errorf("dashboard: reading keys' counts: %w", err)
	}
	for i := range rows {
		if i < len(others) {
			rows[i].set(1-by, int64(others[i]))
		}
	}
	return rows, total, nil
}

// Activity returns the counts since since of the given caller keys that
// have any; a key without counts is missing from the map.
func Activity(ctx context.Context, c redis.UniversalClient, prefix, limiter string, since time.Time, keys []string) (map[string]KeyActivity, error) {
	out := map[string]KeyActivity{}
	if len(keys) == 0 {
		return out, nil
	}
	now, err := Now(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("dashboard: reading the Redis clock: %w", err)
	}
	base := limiterBase(prefix, limiter)
	mins := recentMinutes(since, now)
	pipe := c.Pipeline()
	held := make([]*redis.FloatSliceCmd, len(mins))
	admitted := make([]*redis.FloatSliceCmd, len(mins))
	for i, m := range mins {
		held[i] = pipe.ZMScore(ctx, heldKey(base, m), keys...)
		admitted[i] = pipe.ZMScore(ctx, admittedKey(base, m), keys...)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("dashboard: reading keys' counts: %w", err)
	}
	for i, key := range keys {
		a := KeyActivity{Key: key}
		for m := range mins {
			a.HeldBack += int64(at(held[m].Val(), i))
			a.Admitted += int64(at(admitted[m].Val(), i))
		}
		if a.HeldBack != 0 || a.Admitted != 0 {
			out[key] = a
		}
	}
	return out, nil
}

func at(scores []float64, i int) float64 {
	if i < len(scores) {
		return scores[i]
	}
	return 0
}

func (a *KeyActivity) set(by Rank, n int64) {
	if by == Admitted {
		a.Admitted = n
	} else {
		a.HeldBack = n
	}
}

// minuteSets returns the names of the minutes' sets of by.
func minuteSets(base string, mins []int64, by Rank) []string {
	out := make([]string, len(mins))
	for i, m := range mins {
		if by == Admitted {
			out[i] = admittedKey(base, m)
		} else {
			out[i] = heldKey(base, m)
		}
	}
	return out
}
