package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// pinApart gives Redis a CPU of its own and the benchmark, with the worker
// processes it starts afterwards, the other CPUs: the first CPU this
// process may run on for the Redis at addr (found by the process ID it
// reports, so it must run on this machine under a user allowed to bind
// it), the others for the rest. A shared Redis runs on a machine of its
// own; with 24 worker processes on its cores, the CPU time Redis reports
// for the same commands grows and varies with how often it is
// interrupted, which is the benchmark's doing, not the library's. It
// returns what it did, for the report.
func pinApart(ctx context.Context, admin *redis.Client, addr string) (string, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("-pin: %w", err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return "", fmt.Errorf("-pin: Redis at %s is not on this machine's loopback", addr)
	}
	cpus, err := allowedCPUs()
	if err != nil {
		return "", err
	}
	if len(cpus) < 2 {
		return "", errors.New("-pin: needs at least 2 CPUs")
	}
	info, err := admin.InfoMap(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("-pin: %w", err)
	}
	pid, err := strconv.Atoi(info["Server"]["process_id"])
	if err != nil {
		return "", fmt.Errorf("-pin: Redis's process_id: %w", err)
	}
	if err := pinProcess(pid, cpus[:1]); err != nil {
		return "", fmt.Errorf("-pin: %w", err)
	}
	if err := pinProcess(0, cpus[1:]); err != nil {
		return "", fmt.Errorf("-pin: %w", err)
	}
	return fmt.Sprintf("Redis bound to CPU %d, the benchmark and its worker processes to CPUs %v", cpus[0], cpus[1:]), nil
}
