-- lane.lua: the worker's return lane. A task sent back by the worker waits
-- in asynq's retry set (or, for a hand-over copy, its scheduled set) with a
-- time a little past its turn; at its turn the worker's dispatcher moves it
-- to the head of its queue, where the next worker to ask takes it, instead
-- of the tail behind the whole backlog, where asynq's own forwarder would
-- put it (as it does if nobody moved it). The dispatcher moves the tasks of
-- one queue that are due together in one call, the first given ending
-- nearest the head. The keys are asynq v0.26's
-- (internal/base), all in the queue's Cluster slot.
--
-- KEYS[1]  asynq:{<queue>}:retry
-- KEYS[2]  asynq:{<queue>}:scheduled
-- KEYS[3]  asynq:{<queue>}:pending
-- KEYS[4..] asynq:{<queue>}:t:<task id>, each task's hash, in the order
--          of ARGV[2..]
-- ARGV[1]  now, Unix ns, for asynq's pending_since
-- ARGV[2..] the tasks' IDs, the first to be taken first (moved last, so
--          that it ends nearest the head)
-- Returns  {now_us, then for each task in turn: 1 moved, 2 not there yet
--          (the worker that sent it back has not handed it to asynq), 0
--          gone (run, moved by asynq, or deleted)}

local out = {server_now()}
for i = #ARGV, 2, -1 do
  out[i] = move_to_head(KEYS[1], KEYS[2], KEYS[3], KEYS[i + 2], ARGV[i], ARGV[1])
end
return out
