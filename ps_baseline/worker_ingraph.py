"""The seeds' in-graph replication, in tf.compat.v1 graph mode.

One client, worker 0, builds one graph: the variables on the PS job (by
--placement), and one tower of the model per worker task, on
/job:worker/task:i. Every step it feeds every tower from its own process,
averages the towers' gradients and applies them once: synchronous by
construction. The other workers and the PS tasks only serve (the seeds'
server.join()) until the client says training is over.

Why the seeds call it rarely used: the client's feed carries every tower's
input, and if the client dies, everything stops. Lines that distribution adds
are marked `# PS:`.
"""
import functools
import time
from dataclasses import dataclass

from ringtrain.ps_baseline import placement, servers
from ringtrain.ps_baseline.options import PROG
from ringtrain.ps_baseline.worker_v1 import Feeds, open_session
from ringtrain.workloads import models
from ringtrain.workloads.console import Console
from ringtrain.workloads.evaluation import Evaluation, evaluate
from ringtrain.workloads.optimizers import v1_optimizer
from ringtrain.workloads.sharding import epoch_shard, steps_per_epoch
from ringtrain.workloads.snapshots import Snapshots
from ringtrain.workloads.straggler import summary_fields, wait_after
from ringtrain.workloads.summary import StepTimer, build_summary
from ringtrain.workloads.tfenv import import_tensorflow_quietly, session_config, set_threads

CLIENT = 0  # the worker task that builds the graph and drives training


@dataclass
class Tower:
    device: str
    feeds: Feeds
    loss_sum: object
    count: object
    extra: object   # --straggler: this tower's wait after its compute, in multiples of it
    waited: object  # the seconds it waited


@dataclass
class InGraph:
    towers: list
    train_op: object
    applied_step: object  # the global step after this step's update
    global_step: object
    test_metrics: tuple
    model_variables: list
    simulated: bool
    ps_bytes: list
    shutdown: list  # one enqueue per serving task (PS tasks, other workers)


def build_graph(tf, args, cluster_spec, image_shape):
    num_ps, num_workers = cluster_spec.num_tasks("ps"), cluster_spec.num_tasks("worker")
    # PS: the variables go to the PS tasks (by --placement); the client's own ops to worker 0.
    with tf.compat.v1.device(placement.device_setter(args.placement, cluster_spec, CLIENT)):
        make_variable = placement.variable_factory(args.placement, num_ps, args.partition_min_bytes)
        model = models.build(args.model, args.seed, make_variable, dropout=not args.no_dropout,
                             simulate_gpu_ms=args.simulate_gpu)
        model_variables = tf.compat.v1.global_variables()
        global_step = tf.compat.v1.train.get_or_create_global_step()
        optimizer = v1_optimizer(args.optimizer, args.lr)
        global_count = tf.compat.v1.placeholder(tf.float32, [], "global_count")
    towers, tower_grads = [], []
    for i in range(num_workers):
        # PS: tower i runs on worker i, reading the variables from the PS tasks.
        device = f"/job:worker/task:{i}"
        with tf.compat.v1.device(device), tf.compat.v1.name_scope(f"tower_{i}"):
            feeds = Feeds(tf.compat.v1.placeholder(tf.float32, [None, *image_shape], "images"),
                          tf.compat.v1.placeholder(tf.int32, [None], "labels"),
                          tf.compat.v1.placeholder(tf.float32, [None], "weights"), global_count)
            started = tf.timestamp()
            with tf.control_dependencies([started]):
                loss_sum = tf.reduce_sum(feeds.weights * models.per_example_loss(
                    model(feeds.images, training=True), feeds.labels))
            # Normalised by the global batch's mean per-tower share, as in every other
            # mode, so the towers' mean gradient is the global batch's gradient.
            loss = loss_sum / (global_count / num_workers)
            grads = optimizer.compute_gradients(loss, colocate_gradients_with_ops=True)
            extra = tf.compat.v1.placeholder_with_default(0.0, [], "straggler_extra")
            held, waited = wait_after(tf, [g for g, _ in grads], started, extra)
            grads = list(zip(held, [v for _, v in grads]))
        towers.append(Tower(device, feeds, loss_sum, tf.reduce_sum(feeds.weights), extra, waited))
        tower_grads.append(grads)
    # PS: the towers' gradients averaged on the client, applied once on the PS tasks.
    with tf.compat.v1.device(f"/job:worker/task:{CLIENT}"):
        averaged = [(tf.add_n([tf.convert_to_tensor(g) for g, _ in per_var]) / num_workers, per_var[0][1])
                    for per_var in zip(*tower_grads)]
    with tf.compat.v1.device(placement.device_setter(args.placement, cluster_spec, CLIENT)):
        train_op = optimizer.apply_gradients(averaged, global_step=global_step)
        with tf.control_dependencies([train_op]):
            applied_step = tf.identity(global_step.read_value())
        test_metrics = models.correct_and_loss_sum(model(towers[0].feeds.images, training=False),
                                                   towers[0].feeds.labels)
    shutdown = [servers.shutdown_queue(tf, "ps", i).enqueue(1) for i in range(num_ps)] + \
               [servers.shutdown_queue(tf, "worker", i).enqueue(1) for i in range(num_workers) if i != CLIENT]
    per_ps = placement.describe(tf.compat.v1.trainable_variables())[1]
    return InGraph(towers, train_op, applied_step, global_step, test_metrics, model_variables,
                   models.is_simulated(model), [per_ps.get(f"/job:ps/task:{i}", 0) for i in range(num_ps)],
                   shutdown)


def train(args, cluster, dataset):
    tf = import_tensorflow_quietly()
    set_threads(args.threads)
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    num_workers, num_ps = len(cluster.worker), len(cluster.ps)
    console = Console(prefix="client: ")

    # PS: the client's gRPC server; every other task must be up before the graph runs.
    server = servers.start_server(tf, cluster, "worker", CLIENT, args.threads)
    servers.wait_for_tasks(cluster, "ps", args.startup_timeout)
    servers.wait_for_tasks(cluster, "worker", args.startup_timeout)
    per_epoch = steps_per_epoch(len(dataset.train_labels), num_workers, args.batch_size)
    total_steps = args.steps or per_epoch * args.epochs
    g = build_graph(tf, args, tf.train.ClusterSpec(cluster.as_dict()), dataset.train_images.shape[1:])
    if args.show_placement:
        console.line(placement.format_table(*placement.describe(g.model_variables), args.placement))
        console.line("towers: " + ", ".join(f"tower {i} on {t.device}" for i, t in enumerate(g.towers))
                     + f"; the client (worker {CLIENT}) feeds them all and averages their gradients")
    restoring = args.checkpoint_dir and tf.train.latest_checkpoint(args.checkpoint_dir)
    console.begin(f"in-graph replication: {'restoring ' + restoring if restoring else 'initialising'}; "
                  f"{num_workers} tower(s) on {num_workers} worker task(s), {num_ps} ps, placement "
                  f"{args.placement}, {per_epoch} steps/epoch, {total_steps} steps")
    # A dead serving task ends the run with a line that names it.
    watchdog = servers.Watchdog(PROG, [(f"ps task {i}", a) for i, a in enumerate(cluster.ps)] +
                                [(f"worker task {i} (tower {i})", a) for i, a in enumerate(cluster.worker)
                                 if i != CLIENT],
                                "Restart the cluster (same --checkpoint-dir) to resume from the last checkpoint.")
    watchdog.start()
    config = session_config(tf, args.threads)
    with open_session(tf, args, server, config, True, cluster) as session:
        raw = lambda fetches, feed=None: session.run_step_fn(
            lambda step_context: step_context.session.run(fetches, feed))
        wall_start = time.perf_counter()
        timer, loss_sum, loss_count, waited = run_steps(args, session, raw, g, dataset, console, total_steps,
                                                        per_epoch)
        wall_seconds = time.perf_counter() - wall_start
        step = int(raw(g.global_step))
        evaluation = Evaluation() if g.simulated else evaluate(lambda images, labels: raw(
            g.test_metrics, {g.towers[0].feeds.images: images, g.towers[0].feeds.labels: labels}), dataset)
    watchdog.stop()
    summary = build_summary(
        "ps-ingraph", args, dataset, world_size=num_workers, steps=step, epochs=step / per_epoch,
        train_loss=loss_sum / loss_count if loss_count else None, evaluation=evaluation,
        wall_seconds=wall_seconds, reports=[timer.report()], num_ps=num_ps, api="v1", replication="in-graph",
        placement=args.placement, towers=[t.device for t in g.towers],
        hosts=[address.rsplit(":", 1)[0] for address in cluster.worker],
        checkpoint=tf.train.latest_checkpoint(args.checkpoint_dir) if args.checkpoint_dir else None,
        ps_bytes=g.ps_bytes, gradient_bytes=sum(g.ps_bytes), **summary_fields(args.straggler, waited))
    console.finish(summary, args.summary_json)
    # PS: training is over; let every serving task exit.
    with tf.compat.v1.Session(server.target, config=config) as sess:
        sess.run(g.shutdown)
    return 0


def run_steps(args, session, raw, g, dataset, console, total_steps, per_epoch):
    """The client's loop: every step feeds each tower its own shard's batch.
    Returns (its StepTimer, the last log window's loss sum and sample count,
    each tower's seconds of --straggler waiting)."""
    num_towers = len(g.towers)
    step = int(raw(g.global_step))
    if step:
        console.line(f"resuming at step {step}")
    timer, window_loss, window_count = StepTimer(args.warmup_steps), 0.0, 0.0
    snapshots, seen, waited = Snapshots(args.snapshot_dir, args.snapshot_every), 0.0, [0.0] * num_towers
    shard = functools.lru_cache(maxsize=num_towers)(
        lambda epoch, i: epoch_shard(len(dataset.train_labels), i, num_towers, args.batch_size, args.seed, epoch))
    while step < total_steps and not session.should_stop():
        epoch, batch = divmod(step, per_epoch)
        feed = {}
        for i, tower in enumerate(g.towers):
            # PS: the client feeds every tower: its bandwidth caps in-graph replication.
            feed.update(tower.feeds.train_batch(dataset, shard(epoch, i), batch, args.batch_size))
            if args.straggler:
                feed[tower.extra] = args.straggler.extra(i, step + 1)
        _, loss_sums, counts, step, waits = session.run(
            [g.train_op, [t.loss_sum for t in g.towers], [t.count for t in g.towers], g.applied_step,
             [t.waited for t in g.towers]], feed)
        step, samples = int(step), float(sum(counts))
        timer.step_done(samples)
        seen, waited = seen + samples, [w + float(x) for w, x in zip(waited, waits)]
        if snapshots.due(step):
            snapshots.take(step, seen, lambda: zip([v.name for v in g.model_variables], raw(g.model_variables)))
        window_loss, window_count = window_loss + float(sum(loss_sums)), window_count + samples
        if step % args.log_every == 0 or step >= total_steps:
            console.progress(step, total_steps, f"epoch {epoch + 1} step {step}/{total_steps} "
                             f"loss {window_loss / max(window_count, 1):.4f}")
            if step < total_steps:
                window_loss = window_count = 0.0
    return timer, window_loss, window_count, waited
