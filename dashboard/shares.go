package dashboard

import (
	"context"

	"github.com/jobthrottle/jobthrottle/internal/lease"
)

// sharesView is a key's rate leased to processes
// (throttle.WithLeasedShares) and the rest of it, which Redis decides for
// the processes that hold no share.
type sharesView struct {
	// Leased reports a limiter whose processes lease shares: the rest
	// and holders below are read.
	Leased            bool        `json:"leased"`
	RestRatePerSecond float64     `json:"restRatePerSecond"`
	RestBurst         float64     `json:"restBurst"`
	RestTokens        float64     `json:"restTokens"`
	Holders           []shareView `json:"holders"`
}

// shareView is one process's share of a key's rate.
type shareView struct {
	Holder        string  `json:"holder"` // host/pid/random
	RatePerSecond float64 `json:"ratePerSecond"`
	Burst         float64 `json:"burst"`
	// LeaseEndsInMs is how long until its lease ends, on the Redis clock
	// (its process renews it every half lease).
	LeaseEndsInMs    int64   `json:"leaseEndsInMs"`
	AskedPerSecond   float64 `json:"askedPerSecond"` // the demand it last asked for
	CountedPerSecond float64 `json:"countedPerSecond"`
}

// shares reads the shares of caller's key under policy, the one in force
// for it, when v's processes lease them.
func (h *Handler) shares(ctx context.Context, v limiterView, caller, policy string) (sharesView, error) {
	sv := sharesView{Holders: []shareView{}}
	if !v.Leased {
		return sv, nil
	}
	rd, err := h.inv.readerFor(v)
	if err != nil || rd == nil || rd.rate == nil {
		return sv, err
	}
	st, ok, err := lease.ReadKey(ctx, h.client, rd.rate.Key(caller), policy)
	if err != nil || !ok {
		return sv, err
	}
	sv.Leased, sv.RestRatePerSecond, sv.RestBurst, sv.RestTokens = true, st.RestRate, st.RestBurst, st.RestTokens
	for _, hd := range st.Holders {
		sv.Holders = append(sv.Holders, shareView{Holder: hd.ID, RatePerSecond: hd.Rate, Burst: hd.Burst,
			LeaseEndsInMs: max(0, hd.Ends.Sub(st.At).Milliseconds()), AskedPerSecond: hd.Demand, CountedPerSecond: hd.CountedRate})
	}
	return sv, nil
}
