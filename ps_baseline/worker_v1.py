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
import threading
import time
from types import SimpleNamespace

from ps_baseline import placement, reports, servers
from ps_baseline.cluster import wait_until_listening
from workloads import models
from workloads.errors import UsageError
from workloads.pipeline import as_float
from workloads.sharding import epoch_shard, eval_shard, steps_per_epoch
from workloads.summary import StepTimer, emit
from workloads.tfenv import import_tensorflow_quietly, set_threads

PROG = "ps-baseline"
EVAL_BATCH = 256
BOOKKEEPING = "ps_baseline"  # name scope of variables that are not the model's


def make_optimizer(tf, name, lr):
    if name == "sgd":
        return tf.compat.v1.train.GradientDescentOptimizer(lr)
    if name == "momentum":
        return tf.compat.v1.train.MomentumOptimizer(lr, 0.9)
    return tf.compat.v1.train.AdamOptimizer(lr)


def build_graph(tf, args, cluster_spec, num_workers, image_shape):
    """The replica graph of worker args.task_index; returns its handles."""
    num_ps = cluster_spec.num_tasks("ps")
    g = SimpleNamespace()
    # PS: variables go to the PS tasks (by --placement), ops stay on this worker.
    with tf.compat.v1.device(placement.device_setter(args.placement, cluster_spec, args.task_index)):
        make_variable = placement.variable_factory(args.placement, num_ps, args.partition_min_bytes)
        model = models.build(args.model, args.seed, make_variable, dropout=not args.no_dropout)
        g.model_variables = tf.compat.v1.global_variables()
        g.global_step = tf.compat.v1.train.get_or_create_global_step()
        g.images = tf.compat.v1.placeholder(tf.float32, [None, *image_shape], "images")
        g.labels = tf.compat.v1.placeholder(tf.int32, [None], "labels")
        g.weights = tf.compat.v1.placeholder(tf.float32, [None], "weights")
        g.global_count = tf.compat.v1.placeholder(tf.float32, [], "global_count")

        # PS: the model reads its weights after this read of the global step, so
        # (step after our update - 1 - this) counts the updates that landed in between.
        g.read_step = tf.identity(g.global_step.read_value())
        with tf.control_dependencies([g.read_step]):
            logits = model(g.images, training=True)
        g.loss_sum = tf.reduce_sum(g.weights * models.per_example_loss(logits, g.labels))
        g.count = tf.reduce_sum(g.weights)
        # Normalised by the global batch's mean per-worker share, as in ring mode,
        # so that averaging the workers' gradients gives the global batch's gradient.
        loss = g.loss_sum / (g.global_count / num_workers)
        tf.compat.v1.summary.scalar("train/loss", g.loss_sum / tf.maximum(g.count, 1.0))

        optimizer = make_optimizer(tf, args.optimizer, args.lr)
        if args.sync:
            # PS: sync training: wait for K gradients, average them, apply once.
            optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
                optimizer, replicas_to_aggregate=args.replicas_to_aggregate or num_workers,
                total_num_replicas=num_workers)
        g.optimizer = optimizer
        g.train_op = optimizer.minimize(loss, global_step=g.global_step)
        with tf.control_dependencies([g.train_op]):
            g.applied_step = tf.identity(g.global_step.read_value())

        with tf.compat.v1.variable_scope(BOOKKEEPING):
            # Each worker's own step count, checkpointed, so a restarted worker
            # (or a restored cluster) resumes its data where it left off.
            g.worker_steps = [tf.compat.v1.get_variable(
                f"worker_steps_{i}", [], tf.int64, tf.zeros_initializer(), trainable=False,
                use_resource=True) for i in range(num_workers)]
        # Counted right after the update, on the PS (no round trip through this
        # worker in between): a worker killed mid-step redoes that batch after a
        # restart instead of skipping it, and the update is counted exactly once.
        my_steps = g.worker_steps[args.task_index]
        with tf.control_dependencies([g.train_op]), tf.compat.v1.colocate_with(my_steps):
            g.count_my_step = my_steps.assign_add(1)

        eval_logits = model(g.images, training=False)
        g.eval_correct = tf.reduce_sum(tf.cast(tf.equal(
            tf.argmax(eval_logits, 1, output_type=tf.int32), g.labels), tf.float32))
        g.eval_loss_sum = tf.reduce_sum(models.per_example_loss(eval_logits, g.labels))
        if args.task_index != 0:
            # Only the shared (global) variables: local ones are this worker's to initialise.
            g.uninitialized = tf.size(tf.compat.v1.report_uninitialized_variables(
                tf.compat.v1.global_variables()))

    with tf.compat.v1.device(f"/job:worker/task:{args.task_index}"):
        # End-of-run reports travel through PS 0, so a chief on another machine
        # still sees every worker's measured throughput. Not checkpointed.
        with tf.compat.v1.device("/job:ps/task:0"):
            g.report_vars = [tf.compat.v1.Variable("", trainable=False, collections=[],
                                                   use_resource=True, name=f"{BOOKKEEPING}/report_{i}")
                             for i in range(num_workers)]
        g.report_text = tf.compat.v1.placeholder(tf.string, [])
        g.write_report = g.report_vars[args.task_index].assign(g.report_text)
        g.reset_reports = tf.group(*[v.initializer for v in g.report_vars])
        g.read_reports = [v.read_value() for v in g.report_vars]
        g.shutdown_ps = [servers.shutdown_queue(tf, i).enqueue(1) for i in range(num_ps)]
        if args.sync:
            # PS: after the last update, tokens that free any worker still waiting for one.
            g.release_workers = optimizer.get_init_tokens_op(num_tokens=num_workers)
    return g


def train(args, cluster, dataset):
    tf = import_tensorflow_quietly()
    set_threads(args.threads)
    tf.compat.v1.disable_eager_execution()  # the seeds' TF1 graph mode, for the whole process
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    task, is_chief = args.task_index, args.task_index == 0
    num_workers, num_ps = len(cluster.worker), len(cluster.ps)
    log = lambda msg: print(f"worker {task}: {msg}", flush=True)

    # PS: this task's gRPC server; the session below runs through it.
    server = servers.start_server(tf, cluster, "worker", task, args.threads)
    for i, address in enumerate(cluster.ps):
        wait_until_listening(address, f"ps task {i}", args.startup_timeout)

    per_epoch = steps_per_epoch(len(dataset.train_labels), num_workers, args.batch_size)
    total_steps = args.steps or per_epoch * args.epochs
    g = build_graph(tf, args, tf.train.ClusterSpec(cluster.as_dict()), num_workers,
                    dataset.train_images.shape[1:])
    hooks = []
    if args.sync:
        quiet_cancelled_queue_runners(tf)
        # PS: the chief runs the queue that applies aggregated updates.
        hooks.append(g.optimizer.make_session_run_hook(is_chief, num_tokens=0))
    if is_chief and args.show_placement:
        print(placement.format_table(*placement.describe(g.model_variables), args.placement), flush=True)

    config = servers.session_config(tf, args.threads, ["/job:ps", f"/job:worker/task:{task}"])
    restoring = args.checkpoint_dir and tf.train.latest_checkpoint(args.checkpoint_dir)
    if is_chief:
        log(f"{'restoring ' + restoring if restoring else 'initialising the variables'}; "
            f"{'sync' if args.sync else 'async'}, {num_workers} worker(s), {num_ps} ps, "
            f"placement {args.placement}, {per_epoch} steps/epoch, {total_steps} steps per worker")
    else:
        log("waiting for the chief to initialise the variables")
        wait_for_chief(tf, server, g, config, args.startup_timeout, cluster.worker[0])
    checkpoint_options = ({"save_checkpoint_steps": args.checkpoint_every, "save_checkpoint_secs": None}
                          if args.checkpoint_every else {"save_checkpoint_secs": 600})
    try:
        session = tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target, is_chief=is_chief, checkpoint_dir=args.checkpoint_dir,
            hooks=hooks, config=config, max_wait_secs=args.startup_timeout,
            save_summaries_steps=args.log_every, log_step_count_steps=0,
            stop_grace_period_secs=3, **checkpoint_options)
    except tf.errors.DeadlineExceededError:
        raise UsageError(f"the chief (worker 0 at {cluster.worker[0]}) did not initialise the "
                         f"variables within {args.startup_timeout:g}s (--startup-timeout): start it") from None

    peers = [(f"ps task {i}", a) for i, a in enumerate(cluster.ps)]
    if not is_chief:
        peers.append(("the chief (worker 0)", cluster.worker[0]))
    watchdog = servers.Watchdog(PROG, peers, "Restart the cluster (same --checkpoint-dir) "
                                "to resume from the last checkpoint.")
    watchdog.start()
    with session:
        raw = lambda fetches, feed=None: session.run_step_fn(
            lambda step_context: step_context.session.run(fetches, feed))
        if is_chief:
            raw(g.reset_reports)
        local_step, global_step = raw([g.worker_steps[task], g.global_step])
        if local_step:
            log(f"resuming at my step {local_step}, global step {global_step}")
        timer, staleness = StepTimer(), reports.Staleness()
        window_loss = window_count = 0.0
        wall_start = time.perf_counter()

        def finished():
            # Sync: the cluster's update count decides; async: each worker does its share.
            return global_step >= total_steps if args.sync else local_step >= total_steps

        shard_of_epoch = functools.lru_cache(maxsize=1)(
            lambda epoch: epoch_shard(len(dataset.train_labels), task, num_workers,
                                      args.batch_size, args.seed, epoch))
        while not finished() and not session.should_stop():
            epoch, batch = divmod(local_step, per_epoch)
            shard = shard_of_epoch(epoch)  # one permutation per epoch, not per step
            rows = slice(batch * args.batch_size, (batch + 1) * args.batch_size)
            idx = shard.indices[rows]
            feed = {g.images: as_float(dataset.train_images[idx]), g.labels: dataset.train_labels[idx],
                    g.weights: shard.weights[rows], g.global_count: shard.global_counts[batch]}
            _, loss_sum, count, read_step, global_step, local_step = session.run(
                [g.train_op, g.loss_sum, g.count, g.read_step, g.applied_step, g.count_my_step], feed)
            timer.step_done(float(count))
            staleness.add(read_step, global_step)
            window_loss, window_count = window_loss + loss_sum, window_count + count
            if local_step % args.log_every == 0 or finished():
                log(f"epoch {epoch + 1} step {local_step}/{total_steps} global step {global_step} "
                    f"loss {window_loss / max(window_count, 1):.4f}")
                if not finished():
                    window_loss = window_count = 0.0

        report = reports.WorkerReport(task, int(local_step), timer.report(), float(window_loss),
                                      float(window_count), staleness.as_list())
        raw(g.write_report, {g.report_text: report.to_json()})
        if not is_chief:
            watchdog.stop()
            log(f"done after {local_step} steps")
            return 0

        # The chief: free sync stragglers, wait for every report, then evaluate.
        if args.sync:
            raw(g.release_workers)
        deadline = time.monotonic() + args.report_timeout
        while not all(texts := raw(g.read_reports)) and time.monotonic() < deadline:
            time.sleep(0.5)
        if not all(texts):
            missing = [i for i, t in enumerate(texts) if not t]
            log(f"no report from worker(s) {missing} after {args.report_timeout:g}s "
                "(--report-timeout); summarising without them")
        worker_reports = [reports.WorkerReport.from_json(t.decode()) for t in texts if t]
        wall_seconds = time.perf_counter() - wall_start
        global_step = raw(g.global_step)
        evaluation = evaluate(raw, g, dataset)

    checkpoint = tf.train.latest_checkpoint(args.checkpoint_dir) if args.checkpoint_dir else None
    watchdog.stop()
    samples_per_update = (args.replicas_to_aggregate or num_workers) if args.sync else 1
    result = reports.summary(
        "ps-sync" if args.sync else "ps-async", args, dataset, num_workers, num_ps, worker_reports,
        global_step, global_step * samples_per_update / (num_workers * per_epoch), evaluation,
        wall_seconds, {"checkpoint": checkpoint, "api": "v1", "placement": args.placement})
    emit(result, args.summary_json)
    # PS: training is over; let the PS tasks exit instead of joining forever.
    with tf.compat.v1.Session(server.target, config=config) as sess:
        sess.run(g.shutdown_ps)
    return 0


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
        if not servers.wait_for(lambda: sess.run(g.uninitialized) == 0, timeout):
            raise UsageError(f"the chief (worker 0 at {chief_address}) did not initialise the "
                             f"variables within {timeout:g}s (--startup-timeout): start it")


def evaluate(run, g, dataset):
    """(correct, loss sum, samples) over the whole test split, on the final weights."""
    correct = loss_sum = 0.0
    idx = eval_shard(len(dataset.test_labels), 0, 1)
    for start in range(0, len(idx), EVAL_BATCH):
        rows = idx[start:start + EVAL_BATCH]
        c, l = run([g.eval_correct, g.eval_loss_sum],
                   {g.images: as_float(dataset.test_images[rows]), g.labels: dataset.test_labels[rows]})
        correct, loss_sum = correct + float(c), loss_sum + float(l)
    return correct, loss_sum, len(idx)
