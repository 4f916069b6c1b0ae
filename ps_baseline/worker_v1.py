"""A worker of TF1's between-graph replication, in tf.compat.v1 graph mode,
as the classic distributed-TensorFlow tutorials teach it.

Every worker builds the same graph; replica_device_setter puts its variables
on the PS job and its computation on this worker. Async: each worker applies
its own gradients as soon as it has them. Sync: SyncReplicasOptimizer
aggregates K gradients per update (K < workers leaves backup workers).
Worker 0 is the chief: it initialises or restores the variables and writes
the checkpoints; the others wait for it. Everything else is the shared loop's
(workloads/loop.py); what in-graph replication shares with this is
graph_mode.py. Lines that distribution adds are marked `# PS:`.
"""
import contextlib
import json
import math
import threading
from dataclasses import dataclass

from ps_baseline import losses, placement, reports, servers
from ps_baseline.graph_mode import Feeds, GraphMode, Sessions, graph_mode
from ps_baseline.options import PROG, RESUME
from ringtrain.common.errors import UsageError
from ringtrain.multihost.net import wait_for
from ringtrain.workloads import loop
from ringtrain.workloads.mode import Agreement, Identity, StepResult, Topology
from ringtrain.workloads.sharding import updates_per_epoch
from ringtrain.workloads.summary import dumps

BOOKKEEPING = "ps_baseline"  # name scope of variables that are not the model's
# Sync, stopped on a signal: tokens for each worker, so that none waits in a step for a gradient of a
# worker that has stopped, and each gets to its next stop check (every ~0.2 s of its steps).
STOP_TOKENS = 1000


@dataclass
class ReplicaGraph:
    feeds: Feeds
    test_feeds: Feeds
    train_op: object
    loss_sum: object       # this worker's weighted loss sum over its batch
    count: object          # its real samples
    finite: object         # its gradients are finite (else its update is skipped)
    read_step: object      # the global step read before the weights
    applied_step: object   # the global step after this worker's update
    count_my_step: object  # this worker's own step count, after the update
    global_step: object
    worker_steps: list     # every worker's own step count, on the PS
    skipped: object        # updates skipped as non-finite
    optimizer: object
    pending: object        # sync: gradients in the accumulator, not yet applied
    test_metrics: tuple    # (correct, loss sum) of a test batch
    model_variables: list
    ps_bytes: list         # bytes of trainable variables on each PS task: what a worker pushes and pulls there
    reports: object        # the workers' end-of-run reports, on PS task 0
    announce: object       # what the chief tells the workers at the start (the stall watchdog's address)
    shutdown_ps: list
    release_workers: object  # sync: tokens that free workers still waiting for one
    release_for_stop: object  # sync: enough tokens for every worker to reach its next stop check
    simulated: bool        # on the simulated accelerator: nothing worth evaluating
    uninitialized: object = None  # non-chief: how many shared variables are not initialised yet
    scale: object = None           # float16's loss scale, as this step read it (1 without one)


def build_graph(tf, config, ps, cluster_spec, task, num_workers, image_shape):
    """The replica graph of worker `task`."""
    from ringtrain.workloads import models
    from ringtrain.workloads.gradients import LossScale, SkipNonFinite, all_finite, graph_accumulated
    # PS: variables go to the PS tasks (by --placement), ops stay on this worker.
    with tf.compat.v1.device(placement.device_setter(ps.placement, cluster_spec, task)):
        make_variable = placement.variable_factory(ps.placement, cluster_spec.num_tasks("ps"), ps.partition_min_bytes)
        model = config.model.build(make_variable)
        model_variables = tf.compat.v1.global_variables()
        feeds, test_feeds = Feeds.make(tf, image_shape, config.data.accumulate), Feeds.make(tf, image_shape)
        global_step, worker_steps, skipped = counters(tf, num_workers)
        loss_scale = LossScale(tf) if config.model.loss_scaled else None  # (on a PS task)
        # PS: the model reads its weights after this read of the global step, so
        # (step after our update - 1 - this) counts the updates that landed in between.
        read_step = tf.identity(global_step.read_value())
        optimizer = SkipNonFinite(tf, config.optimizer.v1(), skipped, loss_scale)
        if ps.sync:
            # PS: sync training: wait for K gradients, average them, apply once (if finite).
            optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
                optimizer, replicas_to_aggregate=ps.replicas_to_aggregate or num_workers,
                total_num_replicas=num_workers)
        # Normalised by the global batch's mean per-worker share, as in ring mode, so that
        # averaging the workers' gradients gives the global batch's gradient; K micro-batches
        # summed, unscaled (float16) before they are pushed.
        scale = tf.identity(loss_scale.scale.read_value()) if loss_scale else None
        loss_sum, grads_and_vars = graph_accumulated(tf, model, feeds, feeds.global_count / num_workers,
                                                     optimizer.compute_gradients, scale, before=[read_step])
        finite = all_finite(tf, [g for g, _ in grads_and_vars if g is not None])
        train_op = optimizer.apply_gradients(grads_and_vars, global_step=global_step)
        with tf.control_dependencies([train_op]):
            applied_step = tf.identity(global_step.read_value())
        # Counted right after the update, on the PS (no round trip through this
        # worker in between): a worker killed mid-step redoes that batch after a
        # restart instead of skipping it, and the update is counted exactly once.
        with tf.control_dependencies([train_op]), tf.compat.v1.colocate_with(worker_steps[task]):
            count_my_step = worker_steps[task].assign_add(1)
        test_metrics = models.correct_and_loss_sum(model(test_feeds.images, training=False), test_feeds.labels)
        # Only the shared (global) variables: local ones are this worker's to initialise.
        uninitialized = None if task == 0 else \
            tf.size(tf.compat.v1.report_uninitialized_variables(tf.compat.v1.global_variables()))
    report_ops, announce_ops, shutdown_ps = messages(tf, task, num_workers, cluster_spec.num_tasks("ps"))
    per_ps = placement.describe(tf.compat.v1.trainable_variables())[1]
    return ReplicaGraph(
        feeds, test_feeds, train_op, loss_sum, tf.reduce_sum(feeds.weights), finite, read_step, applied_step,
        count_my_step, global_step, worker_steps, skipped, optimizer,
        # Sync: an update takes the accumulated gradients; one computed against an
        # older global step is dropped as stale. The accumulators count alike.
        pending_gradients(tf, optimizer) if ps.sync else None, test_metrics, model_variables,
        [per_ps.get(f"/job:ps/task:{i}", 0) for i in range(cluster_spec.num_tasks("ps"))],
        report_ops, announce_ops, shutdown_ps,
        optimizer.get_init_tokens_op(num_tokens=num_workers) if ps.sync else None,
        optimizer.get_init_tokens_op(num_tokens=STOP_TOKENS * num_workers) if ps.sync else None,
        models.is_simulated(model), uninitialized, scale if scale is not None else tf.constant(1.0))


def counters(tf, num_workers):
    """The global step; each worker's own step count, checkpointed, so that a
    restarted worker (or a restored cluster) resumes its data where it left
    off; and the updates skipped as non-finite."""
    global_step = tf.compat.v1.train.get_or_create_global_step()
    with tf.compat.v1.variable_scope(BOOKKEEPING):
        worker_steps = [tf.compat.v1.get_variable(f"worker_steps_{i}", [], tf.int64, tf.zeros_initializer(),
                                                  trainable=False, use_resource=True)
                        for i in range(num_workers)]
        skipped = tf.compat.v1.get_variable("skipped_updates", [], tf.int64, tf.zeros_initializer(),
                                            trainable=False, use_resource=True)
    return global_step, worker_steps, skipped


def messages(tf, task, num_workers, num_ps):
    """End-of-run reports and the start-up announcement, through PS 0, so that
    a chief on another machine still hears every worker (not checkpointed);
    and the messages that end the PS tasks."""
    with tf.compat.v1.device(f"/job:worker/task:{task}"):
        with tf.compat.v1.device("/job:ps/task:0"):
            report_vars = [tf.compat.v1.Variable("", trainable=False, collections=[], use_resource=True,
                                                 name=f"{BOOKKEEPING}/report_{i}") for i in range(num_workers)]
            announce = tf.compat.v1.Variable("", trainable=False, collections=[], use_resource=True,
                                             name=f"{BOOKKEEPING}/announce")
        text = tf.compat.v1.placeholder(tf.string, [])
        report_ops = Messages(report_vars[task].assign(text), text, tf.group(*[v.initializer for v in report_vars]),
                              [v.read_value() for v in report_vars])
        announce_ops = Messages(announce.assign(text), text, announce.initializer, announce.read_value())
        return report_ops, announce_ops, servers.shutdown_ops(tf, [("ps", i) for i in range(num_ps)])


@dataclass
class Messages:
    write: object   # assign the placeholder's text
    text: object
    reset: object
    read: object


def train(config, ps, cluster, task, dataset):
    from ringtrain.workloads.tfenv import import_tensorflow_quietly, set_threads
    tf = import_tensorflow_quietly()
    set_threads(config.data.threads)
    device = servers.pin_task(cluster, "worker", task)
    graph_mode(tf)
    # PS: this task's gRPC server; the session below runs through it.
    server = servers.start_server(tf, cluster, "worker", task, config.data.threads)
    servers.wait_for_tasks(cluster, "ps", ps.startup_timeout)
    g = build_graph(tf, config, ps, tf.train.ClusterSpec(cluster.as_dict()), task, len(cluster.worker),
                    dataset.image_shape)
    summary = loop.Training(config, dataset, BetweenGraph(tf, config, ps, cluster, task, dataset, server, g,
                                                          device)).run()
    # (MonitoredSession's exit swallows an OutOfRangeError: the loop has named the task that went first)
    return 0 if summary or task != 0 else 1


class BetweenGraph(GraphMode):
    """A worker of between-graph replication, as the shared loop runs it."""

    def __init__(self, tf, config, ps, cluster, task, dataset, server, g, device):
        from ringtrain.workloads.checkpoints import GraphStore
        from ringtrain.workloads.tfenv import session_config
        num_workers, b = len(cluster.worker), config.data.batch_size
        self.tf, self.config, self.ps, self.cluster, self.task, self.dataset, self.g = \
            tf, config, ps, cluster, task, dataset, g
        self.is_chief, self.k = task == 0, (ps.replicas_to_aggregate or num_workers) if ps.sync else 1
        self.identity = Identity("ps-sync" if ps.sync else "ps-async", PROG, num_workers, local_workers=(task,),
                                 prefix=f"worker {task}: ", device=device)
        self.sessions = Sessions(tf, server, session_config(tf, config.data.threads,
                                                            ["/job:ps", f"/job:worker/task:{task}"],
                                                            precision=config.model.precision))
        self.agree = PSAgreement(tf, self.sessions, g, task, cluster, ps)
        self.store = GraphStore(tf, config.loop.keep_checkpoints, self.sessions.in_session)
        self.steps_per_epoch = updates_per_epoch(dataset, num_workers, b, config.data.accumulate)
        self.topology = Topology(
            names=lambda w: f"worker {w} at {cluster.worker[w]}", advice=RESUME,
            waits_for_all=ps.sync and losses.waits_for_every_worker(ps, num_workers),
            servers=tuple((f"ps task {i}", a) for i, a in enumerate(cluster.ps)) +
            (() if self.is_chief else (("the chief (worker 0)", cluster.worker[0]),)))
        self.until_updates, self.samples_per_update = ps.sync, self.k * config.data.per_update
        self.feeds, self.test_feeds, self.test_metrics = [(task, g.feeds)], g.test_feeds, g.test_metrics
        self.model_variables, self.evaluate = g.model_variables, None if g.simulated else self.evaluate_batch
        # (the sync chief's queue runner waits in its take of gradients until the session
        # closes: a grace period for it to stop first is spent waiting for nothing)
        self.stop_grace, self.staleness, self.my_steps = 0.2, reports.Staleness(), 0
        if ps.sync:
            quiet_cancelled_queue_runners(tf)
            # PS: the chief runs the queue that applies aggregated updates.
            self.hooks = [g.optimizer.make_session_run_hook(self.is_chief, num_tokens=0)]
        if self.is_chief and ps.show_placement:
            self.say(placement.format_table(*placement.describe(g.model_variables), ps.placement))

    @contextlib.contextmanager
    def session(self):
        g, ps, sessions = self.g, self.ps, self.sessions
        if self.is_chief:
            restoring = self.store.restore_path
            self.say(f"{'restoring ' + restoring if restoring else 'initialising the variables'}; "
                     f"{'sync' if ps.sync else 'async'}, {self.identity.workers} worker(s), {len(self.cluster.ps)} "
                     f"ps, placement {ps.placement}")
            sessions.run(g.announce.reset)  # (before the workers can read it: they wait for the chief)
        else:
            self.say("waiting for the chief to initialise the variables")
            sessions.wait_for_chief(g.uninitialized, ps.startup_timeout, self.cluster.worker[0])
        with super().session() as monitored:
            if self.is_chief:
                sessions.run(g.reports.reset)
            yield monitored

    def on_stop(self):
        if self.ps.sync:
            self.sessions.run(self.g.release_for_stop)

    def close(self):
        if not self.is_chief:
            self.say(f"done after {self.my_steps} steps")
            return
        # PS: training is over; let the PS tasks exit instead of joining forever.
        self.sessions.plain(self.g.shutdown_ps)

    def position(self):
        # PS: this worker's position is its own step count, kept on the PS. Where every update takes
        # one gradient of every worker, it is the global step: a gradient pushed but never applied
        # (the job stopped on a signal before the others pushed theirs) is pushed again.
        local_step, global_step = self.sessions.run([self.g.worker_steps[self.task], self.g.global_step])
        if self.ps.sync and self.k == self.identity.workers:
            local_step = global_step
        if local_step:
            self.say(f"resuming at my step {local_step}, global step {global_step}")
        self.my_steps = int(local_step)
        return local_step

    def step(self, number, feed, straggler):
        g = self.g
        _, loss_sum, count, finite, read_step, global_step, self.my_steps, scale = self.sessions.monitored.run(
            [g.train_op, g.loss_sum, g.count, g.finite, g.read_step, g.applied_step, g.count_my_step, g.scale], feed)
        self.staleness.add(read_step, global_step)
        # (float16: gradients that overflowed at a loss scale above 1, from a finite loss, are not divergence)
        overflow = not finite and scale > 1 and math.isfinite(loss_sum)
        return StepResult(loss_sum, count, bool(finite), update=int(global_step), overflow=overflow)

    def report(self):
        return {"staleness": self.staleness.as_list(), "staleness_histogram": self.staleness.histogram}

    def summary_fields(self, worker_reports):
        g, ps, sessions, k = self.g, self.ps, self.sessions, self.k
        chief = next(r for r in worker_reports if r["rank"] == 0)
        updates_per_sec = (chief["updates_timed"] / chief["seconds"]
                           if chief.get("updates_timed") is not None and chief["seconds"] > 0 else None)
        global_step = int(sessions.run(g.global_step))
        return dict(
            steps=global_step, num_ps=len(g.ps_bytes), reporting_workers=[r["rank"] for r in worker_reports],
            api="v1", placement=ps.placement, ps_bytes=g.ps_bytes, gradient_bytes=sum(g.ps_bytes),
            replicas_to_aggregate=k if ps.sync else None, updates_per_sec=updates_per_sec,
            # what the updates applied: K batches each (sync), one (async); dropped gradients excluded
            applied_images_per_sec=updates_per_sec * k * self.config.data.per_update if updates_per_sec else None,
            skipped_updates=int(sessions.run(g.skipped)),
            **(gradient_counts(sessions, g, k, global_step) if ps.sync else {}),
            **(reports.staleness_fields(worker_reports) if not ps.sync else {}))


def pending_gradients(tf, sync_optimizer):
    """How many gradients wait in a SyncReplicasOptimizer's accumulator, not yet
    applied (for the count of dropped stale gradients). TF has no public way to
    ask: this reads its private _accumulator_list (TF 2.21); every accumulator
    counts alike, so the first one's count serves. tests/test_private_apis.py
    fails with this message if TF changes it."""
    try:
        return sync_optimizer._accumulator_list[0][0].num_accumulated()
    except (AttributeError, IndexError, TypeError) as e:
        raise RuntimeError(f"TF {tf.__version__} changed SyncReplicasOptimizer's private _accumulator_list "
                           f"({type(e).__name__}: {e}): ps_baseline.worker_v1.pending_gradients needs a new way "
                           "to count the gradients waiting for an update") from None


def gradient_counts(sessions, g, k, global_step):
    """Sync: gradients pushed (every worker's steps), applied (K per update, and
    those still waiting in the accumulator), and dropped as stale: the rest. A
    take that found more than K waiting applies them all, so `dropped` is an
    upper bound; with K = every worker it is 0 up to that race."""
    pushed, pending = sum(sessions.run(g.worker_steps)), int(sessions.run(g.pending))
    return {"gradients_pushed": int(pushed), "gradients_pending": pending,
            "gradients_dropped": max(int(pushed) - k * int(global_step) - pending, 0)}


class PSAgreement(Agreement):
    """How the workers of between-graph replication agree: they don't, while
    training (each steps on its own); at the start the chief tells them where
    its stall watchdog listens, and at the end each writes its report into a
    variable on PS task 0, where the chief gathers them."""
    in_lockstep = False

    def __init__(self, tf, sessions, g, task, cluster, ps):
        self.tf, self.sessions, self.g, self.rank, self.size = tf, sessions, g, task, len(cluster.worker)
        self.cluster, self.ps = cluster, ps
        # PS: a scheduler's signal to any task stops every worker: the job's flag on PS task 0
        self.stop_raised = servers.SharedStop(lambda: servers.StopFlag(tf, sessions.server.target, sessions.config))

    def hosts(self):
        return [a.rpartition(":")[0] for a in self.cluster.worker]

    def broadcast(self, obj):
        g = self.g
        if self.rank == 0:
            self.sessions.run(g.announce.write, {g.announce.text: json.dumps(obj)})
            return obj
        text = wait_for(lambda: self._read(g.announce.read), self.ps.startup_timeout, poll=0.2)
        if not text:
            raise UsageError(f"the chief (worker 0 at {self.cluster.worker[0]}) said nothing within "
                             f"{self.ps.startup_timeout:g}s (--startup-timeout)")
        value = json.loads(text.decode())
        return tuple(value) if isinstance(value, list) else value

    def _read(self, fetch):
        try:
            return self.sessions.run(fetch)
        except self.tf.errors.FailedPreconditionError:  # not initialised by the chief yet
            return None

    def gather(self, report, gone=frozenset):
        """Every worker writes its report; the chief, after freeing sync workers still
        waiting for a token, waits for every report but those of workers gone silent."""
        g = self.g
        self.sessions.run(g.reports.write, {g.reports.text: dumps(report)})
        if self.rank != 0:
            return None
        if self.ps.sync:
            self.sessions.run(g.release_workers)
        # A silent worker that will not come back (under `launch` without restarts): don't wait for it.
        given_up = frozenset if losses.worker_may_come_back() else gone

        def every_report():
            texts = self.sessions.run(g.reports.read)
            missing = {i for i, text in enumerate(texts) if not text}
            return texts if not missing or missing <= given_up() else None

        texts = wait_for(every_report, self.ps.report_timeout, poll=0.5) or self.sessions.run(g.reports.read)
        missing = [i for i, t in enumerate(texts) if not t]
        if missing:
            why = "they went silent (dead or frozen)" if set(missing) <= given_up() else \
                f"waited {self.ps.report_timeout:g}s (--report-timeout)"
            print(f"worker {self.rank}: no report from worker(s) {missing}: {why}; summarising without them",
                  flush=True)
        return [json.loads(t.decode()) for t in texts if t]


def quiet_cancelled_queue_runners(tf):
    """The sync chief's queue runner is still waiting for gradients when the
    session closes at the end; its CancelledError then is expected, not news."""
    default_hook = threading.excepthook

    def hook(info):
        if not (issubclass(info.exc_type, tf.errors.CancelledError)
                and info.thread.name.startswith("QueueRunnerThread")):
            default_hook(info)

    threading.excepthook = hook
