package redisclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ReloadEvery is how often at most a client that FollowFailovers watches
// asks its Cluster for the map of which node serves which slots, while
// commands keep failing. A Cluster with cluster-node-timeout 1000 promotes
// a replica about two seconds after its master fails; a client that asked
// only on a redirect or at go-redis's own interval went on sending the
// slots' commands to the dead master until it came back (20 s and 55 s in
// issue 30's runs).
const ReloadEvery = 500 * time.Millisecond

// followed holds the clients FollowFailovers has hooked, so that a client
// handed to several limiters gets one hook.
var followed sync.Map // *redis.ClusterClient → *reloader

// FollowFailovers makes a *redis.ClusterClient reload its slot map, at most
// once per ReloadEvery, whenever a command through it fails to reach its
// node or gets an answer a failover gives (see failedOver), and bounds
// each node's answer to the reload by SlotsWithin (nodes the client
// creates from now on: those it knew before answer as go-redis's options
// say). It hooks the client once, however often it is called; the hook
// serves every user of the client, asynq's own calls included. A hooked
// client stays in a table of this package until the program ends. Other clients are left alone:
// go-redis's Sentinel client follows a promotion by itself, and a plain
// client has one server. Safe for concurrent use.
func FollowFailovers(c redis.UniversalClient) {
	cluster, ok := c.(*redis.ClusterClient)
	if !ok || cluster == nil {
		return
	}
	r := &reloader{client: cluster}
	if _, loaded := followed.LoadOrStore(cluster, r); loaded {
		return
	}
	cluster.AddHook(r)
	cluster.OnNewNode(func(node *redis.Client) { node.AddHook(slotsWithin{}) })
}

// SlotsWithin is how long a node may take to answer the CLUSTER SLOTS of
// a reload before the client asks another node. go-redis asks nodes in
// random order, each under the client's read timeout, retried: when it
// asked a frozen master (SIGSTOP, a hung machine), the reload waited about
// 10 s with go-redis's defaults, and decisions on the failed master's keys
// with it, though a replica had been promoted after 2.2 s.
const SlotsWithin = time.Second

// slotsWithin is the hook FollowFailovers adds to each node's client: it
// answers a CLUSTER SLOTS that takes longer than SlotsWithin with an
// error, so that the reload moves on to the next node. The command goes on
// in the background, on a copy of its own.
type slotsWithin struct{}

func (slotsWithin) DialHook(next redis.DialHook) redis.DialHook { return next }

func (slotsWithin) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (slotsWithin) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		slots, ok := cmd.(*redis.ClusterSlotsCmd)
		if !ok {
			return next(ctx, cmd)
		}
		own := redis.NewClusterSlotsCmd(ctx, slots.Args()...)
		done := make(chan error, 1)
		go func() { done <- next(ctx, own) }()
		timer := time.NewTimer(SlotsWithin)
		defer timer.Stop()
		select {
		case err := <-done:
			slots.SetVal(own.Val())
			slots.SetErr(own.Err())
			return err
		case <-timer.C:
			err := fmt.Errorf("redisclient: CLUSTER SLOTS unanswered after %s: %w", SlotsWithin, context.DeadlineExceeded)
			slots.SetErr(err)
			return err
		}
	}
}

// reloader is the hook FollowFailovers adds.
type reloader struct {
	client *redis.ClusterClient
	last   atomic.Int64 // unix nanoseconds of the last reload asked for
}

func (r *reloader) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *reloader) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil {
			r.failed(err)
		}
		return err
	}
}

func (r *reloader) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err != nil {
			r.failed(err)
		}
		return err
	}
}

// failed asks for a reload when err may mean the map is out of date and
// none was asked for within ReloadEvery. The reload runs in the background
// (go-redis's ReloadState), so the command that failed is not delayed.
func (r *reloader) failed(err error) {
	if !failedOver(err) {
		return
	}
	now := time.Now().UnixNano()
	last := r.last.Load()
	if now-last < int64(ReloadEvery) || !r.last.CompareAndSwap(last, now) {
		return
	}
	r.client.ReloadState(context.Background())
}

// failedOver reports an error a failing or promoted node gives: the node
// could not be reached or did not answer in time (a connection refused or
// reset, a timeout, a deadline, every connection busy), or it answered that the Cluster is
// changing (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, READONLY, MASTERDOWN,
// LOADING). Not a missing key, a caller that cancelled, a closed client or
// any other answer.
func failedOver(err error) bool {
	switch {
	case errors.Is(err, redis.Nil), errors.Is(err, context.Canceled), errors.Is(err, redis.ErrClosed):
		return false
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, redis.ErrPoolTimeout):
		return true
	}
	var answer redis.Error
	if errors.As(err, &answer) {
		msg := answer.Error()
		for _, p := range failoverAnswers {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// failoverAnswers start the answers of a Cluster node that is failing over
// or no longer serves the slot.
var failoverAnswers = []string{"MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN", "READONLY", "MASTERDOWN", "LOADING"}
