// Package lua holds the Redis scripts of jobthrottle's limiters as readable
// .lua files, and [Scripts], the same scripts as Redis runs them.
//
// Each script's own file (gcra and token bucket share meter.lua) opens with
// a header naming its KEYS, ARGV and return value; common.lua holds the
// helpers they share, and common_worker.lua those of the worker's waiting
// rooms, return lanes and bookings. The file Redis runs is
// assembled/<name>.lua: the opening of common.lua, the helpers of both
// files the script uses, and the script, so the line numbers in an error
// from Redis point into that file. `go
// generate ./lua/` writes the assembled files after a script changes (see
// internal/luagen); a test fails while one is not current. The worker's and
// the scheduler's own scripts live in those packages' lua folders, built
// the same way.
//
// Every script reads the clock with redis.call('TIME'), declares every key
// it touches in KEYS (all in one Cluster slot), and gives every key it
// writes an expiry; scripts return integers, and strings where their header
// says so.
package lua

import "embed"

//go:generate go run ../internal/luagen

// Scripts holds the limiters' scripts as Redis runs them, as
// assembled/<name>.lua: read one to load it with SCRIPT LOAD, or to see
// the line an error from Redis names. An embed.FS is read-only and safe for
// concurrent use.
//
//go:embed assembled/*.lua
var Scripts embed.FS
