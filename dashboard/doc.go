// Package dashboard is a live web dashboard of jobthrottle's limiters: which
// limit holds work back, for which caller key, and since when. New returns
// an http.Handler to mount under any path of your own server, beside
// asynqmon for instance; `throttlectl serve` runs it alone.
//
//	h, err := dashboard.New(rdb)
//	if err != nil {
//		return err
//	}
//	mux.Handle("/throttle/", http.StripPrefix("/throttle", h))
//
// It shows every limiter (its policy in force and where that comes from:
// code, stored with a PolicyStore, or stored for one key), its hottest
// keys, every key with state in Redis (paged, sorted, searchable by key
// prefix), and per limiter and per key the decisions admitted, throttled
// and rescheduled per second over the last 15 minutes, as charts that
// update every two seconds without a reload.
//
// The counts are the whole fleet's: each process gives a [Publisher] to its
// limiters (throttle.WithObserver) and its worker.Throttler
// (worker.WithObserver); the Publisher adds up its counts in memory and
// writes them to Redis every few seconds, in aggregate, under keys that
// expire after 17 minutes. Key states, blocks, bookings and stored
// policies are read from Redis as they are.
//
// The dashboard is read-only unless [WithActions] gives it a token: then a
// key can be reset, blocked or unblocked, and stored policies set or
// removed, by a POST that carries the token and comes from the dashboard's
// own page. Caller keys come from payloads and headers, so from outsiders:
// the pages never treat one as markup. Everything the pages need is
// embedded; nothing is loaded from elsewhere.
package dashboard
