//go:build linux

package main

import (
	"context"
	"os/exec"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPinProcessBindsEveryThread: a running process pinned to CPU 0 has
// every thread it has bound to CPU 0 alone.
func TestPinProcessBindsEveryThread(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("one CPU: nothing to bind apart")
	}
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	if err := pinProcess(child.Process.Pid, []int{0}); err != nil {
		t.Fatal(err)
	}
	var got unix.CPUSet
	if err := unix.SchedGetaffinity(child.Process.Pid, &got); err != nil {
		t.Fatal(err)
	}
	if got.Count() != 1 || !got.IsSet(0) {
		t.Fatalf("the process runs on %d CPUs (CPU 0: %v), want CPU 0 alone", got.Count(), got.IsSet(0))
	}
}

// TestPinApartRefusesARemoteRedis: a Redis on another machine cannot be
// bound to a CPU here, and -pin says so before asking it anything.
func TestPinApartRefusesARemoteRedis(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("one CPU: -pin refuses for that first")
	}
	if _, err := pinApart(context.Background(), nil, "10.1.2.3:6379"); err == nil {
		t.Fatal("pinApart accepted a Redis that is not on loopback")
	}
}
