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
// processes it starts afterwards, the other CPUs: CPU 0 for the Redis at
// addr (found by the process ID it reports, so it must run on this machine
// under a user allowed to bind it), 1 to n-1 for the rest. A shared Redis
// runs on a machine of its own; with 24 worker processes on its cores, the
// CPU time Redis reports for the same commands grows and varies with how
// often it is interrupted, which is the benchmark's doing, not the
// library's. It returns what it did, for the report.
func pinApart(ctx context.Context, admin *redis.Client, addr string) (string, error) {
	cpus := numCPU()
	if cpus < 2 {
		return "", errors.New("-pin: needs at least 2 CPUs")
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("-pin: %w", err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return "", fmt.Errorf("-pin: Redis at %s is not on this machine's loopback", addr)
	}
	info, err := admin.InfoMap(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("-pin: %w", err)
	}
	pid, err := strconv.Atoi(info["Server"]["process_id"])
	if err != nil {
		return "", fmt.Errorf("-pin: Redis's process_id: %w", err)
	}
	if err := pinProcess(pid, []int{0}); err != nil {
		return "", fmt.Errorf("-pin: %w", err)
	}
	rest := make([]int, 0, cpus-1)
	for c := 1; c < cpus; c++ {
		rest = append(rest, c)
	}
	if err := pinProcess(0, rest); err != nil {
		return "", fmt.Errorf("-pin: %w", err)
	}
	if cpus == 2 {
		return "Redis bound to CPU 0, the benchmark and its worker processes to CPU 1", nil
	}
	return fmt.Sprintf("Redis bound to CPU 0, the benchmark and its worker processes to CPUs 1-%d", cpus-1), nil
}
