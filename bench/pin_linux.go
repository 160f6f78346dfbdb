//go:build linux

package main

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// pinProcess binds every thread of process pid (0: this one) to cpus.
// Threads it starts later inherit the binding from the thread that starts
// them, and so do the processes it starts.
func pinProcess(pid int, cpus []int) error {
	if pid == 0 {
		pid = os.Getpid()
	}
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	threads, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return fmt.Errorf("pinning process %d: %w", pid, err)
	}
	for _, th := range threads {
		tid, err := strconv.Atoi(th.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			return fmt.Errorf("pinning thread %d of process %d: %w", tid, pid, err)
		}
	}
	return nil
}

// allowedCPUs returns the CPUs this process may run on, in order.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, err
	}
	var cpus []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}
