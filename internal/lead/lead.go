// Package lead tells package scheduler how long before its slot a task must
// be due in asynq to reach a worker by then. Package worker sets [Of] when
// it is initialised.
package lead

import "time"

// Of returns that lead for a *worker.Throttler, with the asynq intervals its
// Configure saw.
var Of func(throttler any) time.Duration
