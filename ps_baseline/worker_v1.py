"""A worker of the seeds' between-graph replication, in tf.compat.v1 graph mode.

Every worker builds the same graph; replica_device_setter puts its variables
on the PS job and its computation on this worker. Async: each worker applies
its own gradients as soon as it has them. Sync: SyncReplicasOptimizer
aggregates K gradients per update (K < workers leaves backup workers).
MonitoredTrainingSession makes worker 0 the chief: it initialises or restores
the variables, writes checkpoints and summaries; the others wait for it.
Lines that distribution adds are marked `# PS:`.
"""
import functools
import os
import threading
import time
from dataclasses import dataclass

from ringtrain.multihost.net import wait_for
from ringtrain.ps_baseline import heartbeats, placement, reports, servers
from ringtrain.ps_baseline.failures import checkpoint_failures, newest_readable_checkpoint, non_finite_loss_hook
from ringtrain.ps_baseline.options import NO_RESTARTS_ENV, PROG
from ringtrain.workloads import models
from ringtrain.workloads.console import Console
from ringtrain.workloads.errors import UsageError
from ringtrain.workloads.evaluation import Evaluation, evaluate
from ringtrain.workloads.optimizers import v1_optimizer
from ringtrain.workloads.pipeline import as_float
from ringtrain.workloads.sharding import epoch_shard, steps_per_epoch
from ringtrain.workloads.snapshots import Snapshots
from ringtrain.workloads.straggler import Slowdown, summary_fields
from ringtrain.workloads.summary import StepTimer, build_summary
from ringtrain.workloads.tfenv import import_tensorflow_quietly, session_config, set_threads

BOOKKEEPING = "ps_baseline"  # name scope of variables that are not the model's


@dataclass
class Feeds:
    """The placeholders one step or one test batch is fed through."""
    images: object
    labels: object
    weights: object
    global_count: object

    def train_batch(self, dataset, shard, batch, batch_size):
        rows = slice(batch * batch_size, (batch + 1) * batch_size)
        idx = shard.indices[rows]
        return {self.images: as_float(dataset.train_images[idx]), self.labels: dataset.train_labels[idx],
                self.weights: shard.weights[rows], self.global_count: shard.global_counts[batch]}


@dataclass
class TrainOps:
    train_op: object
    loss_sum: object       # this worker's weighted loss sum over its batch
    count: object          # its real samples
    read_step: object      # the global step read before the weights
    applied_step: object   # the global step after this worker's update
    count_my_step: object  # this worker's own step count, after the update
    global_step: object
    worker_steps: list     # every worker's own step count, on the PS
    optimizer: object
    pending: object = None  # sync: gradients in the accumulator, not yet applied


@dataclass
class Coordination:
    """What the workers say to each other through the PS, outside training."""
    write_report: object
    report_text: object
    reset_reports: object
    read_reports: list
    shutdown_ps: list
    release_workers: object = None  # sync: tokens that free workers still waiting
    uninitialized: object = None    # non-chief: how many shared variables are not initialised yet
    heartbeats: object = None       # --stall-timeout: every worker's heartbeat on PS task 0


@dataclass
class ReplicaGraph:
    feeds: Feeds
    train: TrainOps
    test_metrics: tuple    # (correct, loss sum) of a test batch
    coordination: Coordination
    model_variables: list
    simulated: bool  # on the simulated accelerator: nothing worth evaluating
    ps_bytes: list   # bytes of trainable variables on each PS task: what a worker pushes and pulls there


def build_graph(tf, args, cluster_spec, num_workers, image_shape):
    """The replica graph of worker args.task_index."""
    num_ps = cluster_spec.num_tasks("ps")
    # PS: variables go to the PS tasks (by --placement), ops stay on this worker.
    with tf.compat.v1.device(placement.device_setter(args.placement, cluster_spec, args.task_index)):
        make_variable = placement.variable_factory(args.placement, num_ps, args.partition_min_bytes)
        model = models.build(args.model, args.seed, make_variable, dropout=not args.no_dropout,
                             simulate_gpu_ms=args.simulate_gpu)
        model_variables = tf.compat.v1.global_variables()
        feeds = Feeds(tf.compat.v1.placeholder(tf.float32, [None, *image_shape], "images"),
                      tf.compat.v1.placeholder(tf.int32, [None], "labels"),
                      tf.compat.v1.placeholder(tf.float32, [None], "weights"),
                      tf.compat.v1.placeholder(tf.float32, [], "global_count"))
        train = build_train_ops(tf, args, model, feeds, num_workers)
        test_metrics = models.correct_and_loss_sum(model(feeds.images, training=False), feeds.labels)
        uninitialized = None
        if args.task_index != 0:
            # Only the shared (global) variables: local ones are this worker's to initialise.
            uninitialized = tf.size(tf.compat.v1.report_uninitialized_variables(
                tf.compat.v1.global_variables()))
    coordination = build_coordination(tf, args, num_workers, num_ps, train.optimizer)
    coordination.uninitialized = uninitialized
    per_ps = placement.describe(tf.compat.v1.trainable_variables())[1]
    return ReplicaGraph(feeds, train, test_metrics, coordination, model_variables, models.is_simulated(model),
                        [per_ps.get(f"/job:ps/task:{i}", 0) for i in range(num_ps)])


def build_train_ops(tf, args, model, feeds, num_workers):
    global_step = tf.compat.v1.train.get_or_create_global_step()
    # PS: the model reads its weights after this read of the global step, so
    # (step after our update - 1 - this) counts the updates that landed in between.
    read_step = tf.identity(global_step.read_value())
    with tf.control_dependencies([read_step]):
        logits = model(feeds.images, training=True)
    loss_sum = tf.reduce_sum(feeds.weights * models.per_example_loss(logits, feeds.labels))
    count = tf.reduce_sum(feeds.weights)
    # Normalised by the global batch's mean per-worker share, as in ring mode,
    # so that averaging the workers' gradients gives the global batch's gradient.
    loss = loss_sum / (feeds.global_count / num_workers)
    tf.compat.v1.summary.scalar("train/loss", loss_sum / tf.maximum(count, 1.0))

    optimizer = v1_optimizer(args.optimizer, args.lr)
    if args.sync:
        # PS: sync training: wait for K gradients, average them, apply once.
        optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
            optimizer, replicas_to_aggregate=args.replicas_to_aggregate or num_workers,
            total_num_replicas=num_workers)
    train_op = optimizer.minimize(loss, global_step=global_step)
    # Sync: an update takes the accumulated gradients; one computed against an
    # older global step is dropped as stale. The accumulators count alike.
    pending = optimizer._accumulator_list[0][0].num_accumulated() if args.sync else None
    with tf.control_dependencies([train_op]):
        applied_step = tf.identity(global_step.read_value())

    with tf.compat.v1.variable_scope(BOOKKEEPING):
        # Each worker's own step count, checkpointed, so a restarted worker
        # (or a restored cluster) resumes its data where it left off.
        worker_steps = [tf.compat.v1.get_variable(
            f"worker_steps_{i}", [], tf.int64, tf.zeros_initializer(), trainable=False,
            use_resource=True) for i in range(num_workers)]
    # Counted right after the update, on the PS (no round trip through this
    # worker in between): a worker killed mid-step redoes that batch after a
    # restart instead of skipping it, and the update is counted exactly once.
    my_steps = worker_steps[args.task_index]
    with tf.control_dependencies([train_op]), tf.compat.v1.colocate_with(my_steps):
        count_my_step = my_steps.assign_add(1)
    return TrainOps(train_op, loss_sum, count, read_step, applied_step, count_my_step,
                    global_step, worker_steps, optimizer, pending)


def build_coordination(tf, args, num_workers, num_ps, optimizer):
    with tf.compat.v1.device(f"/job:worker/task:{args.task_index}"):
        # End-of-run reports travel through PS 0, so a chief on another machine
        # still sees every worker's measured throughput. Not checkpointed.
        with tf.compat.v1.device("/job:ps/task:0"):
            report_vars = [tf.compat.v1.Variable("", trainable=False, collections=[], use_resource=True,
                                                 name=f"{BOOKKEEPING}/report_{i}")
                           for i in range(num_workers)]
        report_text = tf.compat.v1.placeholder(tf.string, [])
        return Coordination(
            write_report=report_vars[args.task_index].assign(report_text), report_text=report_text,
            reset_reports=tf.group(*[v.initializer for v in report_vars]),
            read_reports=[v.read_value() for v in report_vars],
            shutdown_ps=[servers.shutdown_queue(tf, "ps", i).enqueue(1) for i in range(num_ps)],
            # PS: after the last update, tokens that free any worker still waiting for one.
            release_workers=optimizer.get_init_tokens_op(num_tokens=num_workers) if args.sync else None,
            heartbeats=heartbeats.build(tf, num_workers, args.task_index, BOOKKEEPING))


def train(args, cluster, dataset):
    tf = import_tensorflow_quietly()
    set_threads(args.threads)
    tf.compat.v1.disable_eager_execution()  # the seeds' TF1 graph mode, for the whole process
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    task, is_chief = args.task_index, args.task_index == 0
    num_workers, num_ps = len(cluster.worker), len(cluster.ps)
    console = Console(prefix=f"worker {task}: ", bar=False if not is_chief else None)

    # PS: this task's gRPC server; the session below runs through it.
    server = servers.start_server(tf, cluster, "worker", task, args.threads)
    servers.wait_for_tasks(cluster, "ps", args.startup_timeout)
    per_epoch = steps_per_epoch(len(dataset.train_labels), num_workers, args.batch_size)
    total_steps = args.steps or per_epoch * args.epochs
    g = build_graph(tf, args, tf.train.ClusterSpec(cluster.as_dict()), num_workers,
                    dataset.train_images.shape[1:])
    if is_chief and args.show_placement:
        console.line(placement.format_table(*placement.describe(g.model_variables), args.placement))

    config = session_config(tf, args.threads, ["/job:ps", f"/job:worker/task:{task}"])
    restoring = newest_readable_checkpoint(tf, args.checkpoint_dir, console.line) if is_chief else None
    if is_chief:
        console.begin(f"{'restoring ' + restoring if restoring else 'initialising the variables'}; "
                      f"{'sync' if args.sync else 'async'}, {num_workers} worker(s), {num_ps} ps, "
                      f"placement {args.placement}, {per_epoch} steps/epoch, {total_steps} steps per worker")
    else:
        console.begin("waiting for the chief to initialise the variables")
        wait_for_chief(tf, server, g, config, args.startup_timeout, cluster.worker[0])
    with checkpoint_failures(tf, args.checkpoint_dir):  # (the chief saves a first checkpoint here)
        session = open_session(tf, args, server, config, is_chief, cluster,
                               sync_optimizer=g.train.optimizer if args.sync else None,
                               guard=non_finite_loss_hook(tf, g.train, task, args.checkpoint_dir))

    peers = [(f"ps task {i}", a) for i, a in enumerate(cluster.ps)]
    if not is_chief:
        peers.append(("the chief (worker 0)", cluster.worker[0]))
    watchdog = servers.Watchdog(PROG, peers, "Restart the cluster (same --checkpoint-dir) "
                                "to resume from the last checkpoint.")
    watchdog.start()
    # A frozen task (which still accepts connections) is named after --stall-timeout.
    stall = heartbeats.StallWatch(
        tf, tf.compat.v1.Session(server.target, graph=g.train.global_step.graph, config=config),
        g.coordination.heartbeats, task, cluster, args.stall_timeout,
        waits_for_all=args.sync and (args.replicas_to_aggregate or num_workers) == num_workers,
        log=console.line, prog=PROG)
    if args.stall_timeout:
        stall.start()
    with checkpoint_failures(tf, args.checkpoint_dir), session:
        raw = lambda fetches, feed=None: session.run_step_fn(
            lambda step_context: step_context.session.run(fetches, feed))
        if is_chief:
            raw([g.coordination.reset_reports, g.coordination.heartbeats.reset])
        wall_start = time.perf_counter()
        snapshots = Snapshots(args.snapshot_dir if is_chief else None, args.snapshot_every)
        report = run_steps(args, session, raw, g, dataset, console, total_steps, per_epoch, num_workers,
                           snapshots)
        raw(g.coordination.write_report, {g.coordination.report_text: report.to_json()})
        if not is_chief:
            stall.finish()
            watchdog.stop()
            console.line(f"done after {report.local_steps} steps")
            return 0
        # Under `launch` without restarts, a silent worker will not come back: don't wait for it.
        worker_reports = gather_reports(raw, g, args.sync, args.report_timeout, console,
                                        gone=stall.gone if os.environ.get(NO_RESTARTS_ENV) else set)
        stall.finish()
        wall_seconds = time.perf_counter() - wall_start
        global_step = raw(g.train.global_step)
        gradients = gradient_counts(raw, g, args, global_step) if args.sync else {}
        evaluation = Evaluation() if g.simulated else evaluate(lambda images, labels: raw(
            g.test_metrics, {g.feeds.images: images, g.feeds.labels: labels}), dataset)

    watchdog.stop()
    samples_per_update = (args.replicas_to_aggregate or num_workers) if args.sync else 1
    mode = "ps-sync" if args.sync else "ps-async"
    chief_timer = next(r.timer for r in worker_reports if r.task_index == 0)
    updates_per_sec = (chief_timer["updates_timed"] / chief_timer["seconds"]
                       if chief_timer.get("updates_timed") is not None and chief_timer["seconds"] > 0 else None)
    loss_count = sum(r.loss_count for r in worker_reports)
    summary = build_summary(
        mode, args, dataset, world_size=num_workers, steps=global_step,
        epochs=global_step * samples_per_update / (num_workers * per_epoch),
        train_loss=sum(r.loss_sum for r in worker_reports) / loss_count if loss_count else None,
        evaluation=evaluation, wall_seconds=wall_seconds, reports=[r.timer for r in worker_reports],
        num_ps=num_ps, reporting_workers=sorted(r.task_index for r in worker_reports),
        hosts=[r.timer["host"] for r in sorted(worker_reports, key=lambda r: r.task_index)],
        checkpoint=tf.train.latest_checkpoint(args.checkpoint_dir) if args.checkpoint_dir else None,
        api="v1", placement=args.placement, ps_bytes=g.ps_bytes, gradient_bytes=sum(g.ps_bytes),
        replicas_to_aggregate=samples_per_update if args.sync else None,
        # what the updates applied: K batches each (sync), one (async); dropped gradients excluded
        updates_per_sec=updates_per_sec,
        applied_images_per_sec=updates_per_sec * samples_per_update * args.batch_size
        if updates_per_sec is not None else None, **gradients,
        **summary_fields(args.straggler, [r.straggler_wait_sec for r in worker_reports]),
        **(reports.staleness_fields(worker_reports) if mode == "ps-async" else {}))
    console.finish(summary, args.summary_json)
    # PS: training is over; let the PS tasks exit instead of joining forever.
    with tf.compat.v1.Session(server.target, config=config) as sess:
        sess.run(g.coordination.shutdown_ps)
    return 0


def open_session(tf, args, server, config, is_chief, cluster, sync_optimizer=None, guard=None):
    """`guard`: a hook that may stop training before anything is saved (on the
    chief it runs before the checkpoint saver)."""
    hooks = [guard] if guard and not is_chief else []
    if sync_optimizer:
        quiet_cancelled_queue_runners(tf)
        # PS: the chief runs the queue that applies aggregated updates.
        hooks.append(sync_optimizer.make_session_run_hook(is_chief, num_tokens=0))
    checkpoint_options = ({"save_checkpoint_steps": args.checkpoint_every, "save_checkpoint_secs": None}
                          if args.checkpoint_every else {"save_checkpoint_secs": 600})
    try:
        # PS: the chief initialises or restores the variables and checkpoints them.
        return tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target, is_chief=is_chief, checkpoint_dir=args.checkpoint_dir,
            hooks=hooks, chief_only_hooks=[guard] if guard and is_chief else None,
            config=config, max_wait_secs=args.startup_timeout,
            save_summaries_steps=args.log_every, log_step_count_steps=0,
            stop_grace_period_secs=3, **checkpoint_options)
    except tf.errors.DeadlineExceededError:
        raise UsageError(f"the chief (worker 0 at {cluster.worker[0]}) did not initialise the "
                         f"variables within {args.startup_timeout:g}s (--startup-timeout): start it") from None


def run_steps(args, session, raw, g, dataset, console, total_steps, per_epoch, num_workers, snapshots):
    """This worker's share of training; returns its report."""
    task, ops = args.task_index, g.train
    local_step, global_step = raw([ops.worker_steps[task], ops.global_step])
    if local_step:
        console.line(f"resuming at my step {local_step}, global step {global_step}")
    timer, staleness = StepTimer(args.warmup_steps), reports.Staleness()
    slowdown = Slowdown(args.straggler, task)
    samples_per_update = (args.replicas_to_aggregate or num_workers) * args.batch_size if args.sync \
        else args.batch_size
    window_loss = window_count = 0.0

    def finished():
        # Sync: the cluster's update count decides; async: each worker does its share.
        return global_step >= total_steps if args.sync else local_step >= total_steps

    shard_of_epoch = functools.lru_cache(maxsize=1)(
        lambda epoch: epoch_shard(len(dataset.train_labels), task, num_workers, args.batch_size,
                                  args.seed, epoch))
    while not finished() and not session.should_stop():
        epoch, batch = divmod(local_step, per_epoch)
        feed = g.feeds.train_batch(dataset, shard_of_epoch(epoch), batch, args.batch_size)
        with slowdown.step(local_step + 1):  # --straggler: that worker waits after its compute
            _, loss_sum, count, read_step, global_step, local_step = session.run(
                [ops.train_op, ops.loss_sum, ops.count, ops.read_step, ops.applied_step, ops.count_my_step],
                feed)
        timer.step_done(float(count), update=int(global_step))
        staleness.add(read_step, global_step)
        if snapshots.due(local_step):
            # PS: the chief reads the weights from the PS tasks; samples seen are those the updates applied.
            snapshots.take(local_step, global_step * samples_per_update, lambda: zip(
                [v.name for v in g.model_variables], raw(g.model_variables)), global_step=int(global_step))
        window_loss, window_count = window_loss + loss_sum, window_count + count
        if local_step % args.log_every == 0 or finished():
            console.progress(local_step, total_steps, f"epoch {epoch + 1} step {local_step}/{total_steps} "
                             f"global step {global_step} loss {window_loss / max(window_count, 1):.4f}")
            if not finished():
                window_loss = window_count = 0.0
    return reports.WorkerReport(task, int(local_step), timer.report(), float(window_loss),
                                float(window_count), staleness.as_list(), staleness.histogram, slowdown.waited)


def gradient_counts(raw, g, args, global_step):
    """Sync: gradients pushed (every worker's steps), applied (K per update, and
    those still waiting in the accumulator), and dropped as stale: the rest. A
    take that found more than K waiting applies them all, so `dropped` is an
    upper bound; with K = every worker it is 0 up to that race."""
    pushed, pending = sum(raw(g.train.worker_steps)), int(raw(g.train.pending))
    k = args.replicas_to_aggregate or len(g.train.worker_steps)
    return {"gradients_pushed": int(pushed), "gradients_pending": pending,
            "gradients_dropped": max(int(pushed) - k * int(global_step) - pending, 0)}


def gather_reports(raw, g, sync, timeout, console, gone=set):
    """The chief, after its own steps: free sync stragglers, then wait for
    every report but those of workers gone silent (dead or frozen)."""
    if sync:
        raw(g.coordination.release_workers)

    def every_report():
        texts = raw(g.coordination.read_reports)
        missing = {i for i, text in enumerate(texts) if not text}
        return texts if not missing or missing <= gone() else None

    texts = wait_for(every_report, timeout, poll=0.5) or raw(g.coordination.read_reports)
    missing = [i for i, t in enumerate(texts) if not t]
    if missing:
        why = "they went silent (dead or frozen)" if set(missing) <= gone() else \
            f"waited {timeout:g}s (--report-timeout)"
        console.line(f"no report from worker(s) {missing}: {why}; summarising without them")
    return [reports.WorkerReport.from_json(t.decode()) for t in texts if t]


def quiet_cancelled_queue_runners(tf):
    """The sync chief's queue runner is still waiting for gradients when the
    session closes at the end; its CancelledError then is expected, not news."""
    default_hook = threading.excepthook

    def hook(info):
        if not (issubclass(info.exc_type, tf.errors.CancelledError)
                and info.thread.name.startswith("QueueRunnerThread")):
            default_hook(info)

    threading.excepthook = hook


def wait_for_chief(tf, server, g, config, timeout, chief_address):
    """Poll every half second until the chief has initialised the variables
    (MonitoredTrainingSession's own wait re-checks only every 30 s)."""
    with tf.compat.v1.Session(server.target, config=config) as sess:
        if not wait_for(lambda: sess.run(g.coordination.uninitialized) == 0, timeout, poll=0.5):
            raise UsageError(f"the chief (worker 0 at {chief_address}) did not initialise the "
                             f"variables within {timeout:g}s (--startup-timeout): start it")
