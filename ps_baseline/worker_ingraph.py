"""TF1's in-graph replication, in tf.compat.v1 graph mode, as the classic
distributed-TensorFlow tutorials describe it.

One client, worker 0, builds one graph: the variables on the PS job (by
--placement), and one tower of the model per worker task, on
/job:worker/task:i. Every step it feeds every tower from its own process,
averages the towers' gradients and applies them once: synchronous by
construction. The other workers and the PS tasks only serve (the tutorials'
server.join()) until the client says training is over. Everything else is
the shared loop's (workloads/loop.py).

Why the tutorials call it rarely used: the client's feed carries every
tower's input, and if the client dies, everything stops. Lines that
distribution adds are marked `# PS:`.
"""
import functools
import math
from dataclasses import dataclass

from ringtrain.ps_baseline import placement, servers
from ringtrain.ps_baseline.options import PROG
from ringtrain.ps_baseline.worker_v1 import RESUME, Feeds, Sessions, graph_mode
from ringtrain.workloads import loop
from ringtrain.workloads.sharding import epoch_shard, steps_per_epoch

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
    finite: object        # the towers' mean gradient was finite (else the update was skipped)
    applied_step: object  # the global step after this step's update
    global_step: object
    test_metrics: tuple
    model_variables: list
    simulated: bool
    ps_bytes: list
    shutdown: list  # one enqueue per serving task (PS tasks, other workers)


def build_graph(tf, config, ps, cluster_spec, image_shape):
    from ringtrain.workloads import models
    from ringtrain.workloads.gradients import SkipNonFinite, all_finite
    from ringtrain.workloads.straggler import wait_after
    num_ps, num_workers = cluster_spec.num_tasks("ps"), cluster_spec.num_tasks("worker")
    # PS: the variables go to the PS tasks (by --placement); the client's own ops to worker 0.
    with tf.compat.v1.device(placement.device_setter(ps.placement, cluster_spec, CLIENT)):
        make_variable = placement.variable_factory(ps.placement, num_ps, ps.partition_min_bytes)
        model = config.model.build(make_variable)
        model_variables = tf.compat.v1.global_variables()
        global_step = tf.compat.v1.train.get_or_create_global_step()
        skipped = tf.compat.v1.get_variable("ps_baseline/skipped_updates", [], tf.int64, tf.zeros_initializer(),
                                            trainable=False, use_resource=True)
        optimizer = SkipNonFinite(tf, config.optimizer.v1(), skipped)
        global_count = tf.compat.v1.placeholder(tf.float32, [], "global_count")
    towers, tower_grads = [], []
    for i in range(num_workers):
        # PS: tower i runs on worker i, reading the variables from the PS tasks.
        device = f"/job:worker/task:{i}"
        with tf.compat.v1.device(device), tf.compat.v1.name_scope(f"tower_{i}"):
            feeds = Feeds.make(tf, image_shape, global_count)
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
    # PS: the towers' gradients averaged on the client, applied once on the PS tasks (if finite).
    with tf.compat.v1.device(f"/job:worker/task:{CLIENT}"):
        averaged = [(tf.add_n([tf.convert_to_tensor(g) for g, _ in per_var]) / num_workers, per_var[0][1])
                    for per_var in zip(*tower_grads)]
        finite = all_finite(tf, [g for g, _ in averaged])
    with tf.compat.v1.device(placement.device_setter(ps.placement, cluster_spec, CLIENT)):
        train_op = optimizer.apply_gradients(averaged, global_step=global_step)
        with tf.control_dependencies([train_op]):
            applied_step = tf.identity(global_step.read_value())
        test_metrics = models.correct_and_loss_sum(model(towers[0].feeds.images, training=False),
                                                   towers[0].feeds.labels)
    serving = [("ps", i) for i in range(num_ps)] + [("worker", i) for i in range(num_workers) if i != CLIENT]
    shutdown = servers.shutdown_ops(tf, serving)
    per_ps = placement.describe(tf.compat.v1.trainable_variables())[1]
    return InGraph(towers, train_op, finite, applied_step, global_step, test_metrics, model_variables,
                   models.is_simulated(model), [per_ps.get(f"/job:ps/task:{i}", 0) for i in range(num_ps)],
                   shutdown)


def train(config, ps, cluster, dataset):
    from ringtrain.workloads.checkpoints import GraphStore
    from ringtrain.workloads.devices import pin_gpu
    from ringtrain.workloads.tfenv import import_tensorflow_quietly, session_config, set_threads
    tf = import_tensorflow_quietly()
    set_threads(config.data.threads)
    device = pin_gpu(0)  # PS: the client's own tower (worker 0) computes on its host's first GPU
    graph_mode(tf)
    num_workers, num_ps = len(cluster.worker), len(cluster.ps)

    # PS: the client's gRPC server; every other task must be up before the graph runs.
    server = servers.start_server(tf, cluster, "worker", CLIENT, config.data.threads)
    servers.wait_for_tasks(cluster, "ps", ps.startup_timeout)
    servers.wait_for_tasks(cluster, "worker", ps.startup_timeout)
    g = build_graph(tf, config, ps, tf.train.ClusterSpec(cluster.as_dict()), dataset.train_images.shape[1:])
    store = GraphStore(tf, keep=config.loop.keep_checkpoints)
    per_epoch = steps_per_epoch(len(dataset.train_labels), num_workers, config.data.batch_size)
    sessions = Sessions(tf, server, session_config(tf, config.data.threads))
    serving = [(f"ps task {i}", a) for i, a in enumerate(cluster.ps)] + \
        [(f"worker task {i} (tower {i})", a) for i, a in enumerate(cluster.worker) if i != CLIENT]
    run = loop.Training(config, loop.Mode(
        "ps-ingraph", PROG, num_workers, local_workers=tuple(range(num_workers)), worker_word="tower",
        prefix="client: ", waits_in_graph=True, servers=serving, advice=RESUME,
        device=device),
        dataset, per_epoch, store=store)
    if ps.show_placement:
        run.console.line(placement.format_table(*placement.describe(g.model_variables), ps.placement))
        run.console.line("towers: " + ", ".join(f"tower {i} on {t.device}" for i, t in enumerate(g.towers))
                         + f"; the client (worker {CLIENT}) feeds them all and averages their gradients")
    run.resume()
    run.console.line(f"in-graph replication: {'restoring ' + store.restore_path if store.restore_path else 'initialising'}"
                     f"; {num_workers} tower(s) on {num_workers} worker task(s), {num_ps} ps, placement {ps.placement}")
    with tf.compat.v1.train.MonitoredSession(
            session_creator=store.session_creator(True, server.target, sessions.config, ps.startup_timeout),
            stop_grace_period_secs=3) as session:
        sessions.monitored = session
        store.run_in_session = sessions.in_session
        summary = train_steps(run, session, sessions, g, config, ps, cluster, dataset, per_epoch)
    # PS: training is over; let every serving task exit.
    sessions.plain(g.shutdown)
    return 0 if summary else 1


def train_steps(run, session, sessions, g, config, ps, cluster, dataset, per_epoch):
    """The client's loop: every step feeds each tower its own shard's batch."""
    from ringtrain.workloads.models import variable_name
    num_towers = len(g.towers)
    start = int(sessions.run(g.global_step))
    if start:
        run.console.line(f"resuming at step {start}")
    shard = functools.lru_cache(maxsize=num_towers)(
        lambda epoch, i: epoch_shard(len(dataset.train_labels), i, num_towers, config.data.batch_size,
                                     config.data.seed, epoch))

    def batches():
        step = start
        while not session.should_stop():
            epoch, batch = divmod(step, per_epoch)
            # PS: the client feeds every tower: its bandwidth caps in-graph replication.
            feed = {}
            for i, tower in enumerate(g.towers):
                feed.update(tower.feeds.train_batch(dataset, shard(epoch, i), batch, config.data.batch_size))
            yield epoch, batch + 1, feed
            step += 1

    def step(number, feed, straggler):
        feed = {**feed, **{tower.extra: factor for tower, factor in zip(g.towers, straggler)}}
        _, loss_sums, counts, finite, applied_step, waits = session.run(
            [g.train_op, [t.loss_sum for t in g.towers], [t.count for t in g.towers], g.finite, g.applied_step,
             [t.waited for t in g.towers]], feed)
        broke = tuple(i for i, loss in enumerate(loss_sums) if not math.isfinite(loss))
        return loop.StepResult(sum(loss_sums), sum(counts), bool(finite), broke=broke, waited=waits)

    return run.run(step, batches(), start=start,
                   metrics=None if g.simulated else lambda images, labels: sessions.run(
                       g.test_metrics, {g.towers[0].feeds.images: images, g.towers[0].feeds.labels: labels}),
                   read_weights=lambda: list(zip([variable_name(v) for v in g.model_variables],
                                                 sessions.run(g.model_variables))),
                   fields=lambda reports: dict(
                       num_ps=len(g.ps_bytes), api="v1", replication="in-graph", placement=ps.placement,
                       towers=[t.device for t in g.towers], ps_bytes=g.ps_bytes, gradient_bytes=sum(g.ps_bytes),
                       hosts=[address.rpartition(":")[0] for address in cluster.worker]))
