//go:build !linux

package main

import "errors"

// pinProcess is supported on Linux only.
func pinProcess(pid int, cpus []int) error {
	return errors.New("-pin: binding processes to CPUs is supported on Linux only")
}

// allowedCPUs is supported on Linux only.
func allowedCPUs() ([]int, error) {
	return nil, errors.New("-pin: binding processes to CPUs is supported on Linux only")
}
