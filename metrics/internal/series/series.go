// Package series holds what package metrics and its subpackage
// workermetrics share: the worker series of a metrics.Collector, and the
// cleaning of label values. It lets workermetrics feed a Collector's worker
// series while package metrics itself imports neither asynq nor worker.
package series

import (
	"strings"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// Worker is the worker series of one metrics.Collector.
type Worker struct {
	Tasks  *prometheus.CounterVec   // task_type, rule, event
	Waits  *prometheus.HistogramVec // task_type, event
	Leases *prometheus.GaugeVec     // rule
}

// WorkerOf returns the worker series of a *metrics.Collector, or nil for
// anything else (a nil Collector included). Package metrics sets it when it
// is initialised; a package that can name metrics.Collector has imported
// metrics, so it is always set by then.
var WorkerOf func(collector any) *Worker

// LabelValue returns s as a valid label value: Prometheus refuses (and its
// WithLabelValues panics on) invalid UTF-8, which a task type, being bytes
// from the queue, may contain. Invalid bytes become U+FFFD.
func LabelValue(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
