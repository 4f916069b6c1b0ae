"""PS mode's stall watchdog (`--stall-timeout S`): a frozen task is named,
not waited on forever.

A frozen process still accepts TCP connections (the kernel answers for it),
so servers.Watchdog's port checks cannot see it. Here every v1 worker, from
its own thread and session, counts a heartbeat into a variable on PS task 0
each second, and reads everyone's. The chief names a worker whose heartbeat
stops: in sync training with K = W (every update waits for every worker) it
ends the job; where training goes on without it (async, backup workers) it
says so once. The other workers end the job if the chief's heartbeat stops,
and every worker if PS task 0 stops answering.
"""
import os
import sys
import threading
import time
from dataclasses import dataclass

BEAT = 1.0
FINISHED = -1  # a worker that is done stops beating on purpose
GONE_AFTER = 5 * BEAT  # the chief stops waiting for the report of a worker silent this long


@dataclass
class HeartbeatOps:
    write: object      # assign the placeholder's value to this worker's heartbeat
    value: object
    read: list         # every worker's heartbeat
    reset: object      # the chief zeroes them at the start


def build(tf, num_workers, task, scope):
    """The heartbeat variables (on PS task 0, outside checkpoints) and ops."""
    with tf.compat.v1.device("/job:ps/task:0"):
        beats = [tf.compat.v1.Variable(0, dtype=tf.int64, trainable=False, collections=[], use_resource=True,
                                       name=f"{scope}/heartbeat_{i}") for i in range(num_workers)]
    value = tf.compat.v1.placeholder(tf.int64, [])
    return HeartbeatOps(beats[task].assign(value), value, [b.read_value() for b in beats],
                        tf.group(*[b.initializer for b in beats]))


class StallWatch(threading.Thread):
    def __init__(self, tf, session, ops, task, cluster, timeout, waits_for_all, log, prog):
        super().__init__(daemon=True, name="ps-stall-watchdog")
        self.tf, self.session, self.ops, self.task = tf, session, ops, task
        self.cluster, self.timeout, self.waits_for_all, self.log, self.prog = \
            cluster, timeout, waits_for_all, log, prog
        self.options = tf.compat.v1.RunOptions(timeout_in_ms=int(BEAT * 5000))
        self.done = threading.Event()
        self.warned = set()
        self.last = {}  # worker -> (heartbeat value, when it last changed)

    def gone(self):
        """Workers silent for GONE_AFTER (dead or frozen), not finished; none if not watching."""
        now = time.monotonic()
        return {w for w, (beat, changed) in dict(self.last).items()
                if w != self.task and beat != FINISHED and now - changed > GONE_AFTER}

    def run(self):
        count, now = 0, time.monotonic()
        last = self.last
        ps_heard = now
        while not self.done.wait(BEAT):
            count, now = count + 1, time.monotonic()
            try:
                self.session.run(self.ops.write, {self.ops.value: count}, options=self.options)
                beats = self.session.run(self.ops.read, options=self.options)
                ps_heard = now
            except self.tf.errors.DeadlineExceededError:
                beats = None
            except self.tf.errors.OpError:
                continue  # not initialised yet by the chief, or shutting down
            if beats is None:
                if now - ps_heard > self.timeout:
                    self._end(f"ps task 0 at {self.cluster.ps[0]} stopped answering for {now - ps_heard:.0f} s "
                              f"(--stall-timeout): it is frozen or overloaded")
                continue
            for worker, beat in enumerate(beats):
                if beat != last.get(worker, (None,))[0]:
                    last[worker] = (beat, now)
            self._judge(last, now)

    def _judge(self, last, now):
        for worker, (beat, changed) in last.items():
            silent = now - changed
            if worker == self.task or beat == FINISHED or silent <= self.timeout:
                continue
            who = f"worker {worker} at {self.cluster.worker[worker]}"
            if self.task == 0 and self.waits_for_all:
                self._end(f"{who} sent no heartbeat for {silent:.0f} s (--stall-timeout): it is frozen, and sync "
                          f"training with every worker per update waits for it. Restart the cluster (same "
                          f"--checkpoint-dir) to resume, or use --replicas-to-aggregate for backup workers")
            elif self.task == 0 and worker not in self.warned:
                self.warned.add(worker)
                self.log(f"{who} sent no heartbeat for {silent:.0f} s (--stall-timeout): it is frozen or "
                         f"gone; training goes on without it")
            elif worker == 0 and self.task != 0:
                self._end(f"the chief ({who}) sent no heartbeat for {silent:.0f} s (--stall-timeout): it is "
                          f"frozen. Restart the cluster (same --checkpoint-dir) to resume")

    def finish(self):
        """This worker is done: say so, so that nobody takes it for frozen."""
        self.done.set()
        try:
            self.session.run(self.ops.write, {self.ops.value: FINISHED}, options=self.options)
        except self.tf.errors.OpError:
            pass

    def _end(self, what):
        sys.stderr.write(f"{self.prog}: error: {what}\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(3)
