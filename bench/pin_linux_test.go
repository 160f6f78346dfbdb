//go:build linux

package main

import (
	"context"
	"os/exec"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPinProcessBindsEveryThread: a running process pinned to one CPU has
// every thread it has bound to that CPU alone.
func TestPinProcessBindsEveryThread(t *testing.T) {
	cpus, err := allowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	if len(cpus) != runtime.NumCPU() {
		t.Fatalf("allowedCPUs gave %v, runtime.NumCPU %d", cpus, runtime.NumCPU())
	}
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	last := cpus[len(cpus)-1]
	if err := pinProcess(child.Process.Pid, []int{last}); err != nil {
		t.Fatal(err)
	}
	var got unix.CPUSet
	if err := unix.SchedGetaffinity(child.Process.Pid, &got); err != nil {
		t.Fatal(err)
	}
	if got.Count() != 1 || !got.IsSet(last) {
		t.Fatalf("the process runs on %d CPUs (CPU %d: %v), want CPU %d alone", got.Count(), last, got.IsSet(last), last)
	}
}

// TestPinApartRefusesARemoteRedis: a Redis on another machine cannot be
// bound to a CPU here, and -pin says so before asking it anything.
func TestPinApartRefusesARemoteRedis(t *testing.T) {
	if _, err := pinApart(context.Background(), nil, "10.1.2.3:6379"); err == nil {
		t.Fatal("pinApart accepted a Redis that is not on loopback")
	}
}
