// Package failover holds the failover tests: a Redis Cluster with replicas
// and a master with a replica behind three Sentinels, started from the
// redis-server binary on loopback, a master killed or frozen under load,
// and what the library's limiters and an asynq fleet did through it.
//
// The tests need redis-server (REDIS_SERVER names another binary) and are
// built only with the failover build tag, as .ci/run runs them:
//
//	go test -race -tags failover ./internal/failover/
package failover
