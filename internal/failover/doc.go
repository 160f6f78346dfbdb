// Package failover holds the failover tests: a Redis Cluster with replicas
// and a master with a replica behind three Sentinels, started from the
// redis-server binary on loopback, a master killed or frozen under load,
// and what the library's limiters and an asynq fleet did through it.
//
// The tests need redis-server (REDIS_SERVER names another binary) and are
// built only with the failover build tag:
//
//	go test -tags failover ./internal/failover/
//
// .ci/run runs them so, beside the passes against redis-server and the
// Cluster.
package failover
