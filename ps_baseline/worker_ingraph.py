"""TF1's in-graph replication, in tf.compat.v1 graph mode, as the classic
distributed-TensorFlow tutorials describe it.

One client, worker 0, builds one graph: the variables on the PS job (by
--placement), and one tower of the model per worker task, on
/job:worker/task:i. Every step it feeds every tower from its own process,
averages the towers' gradients and applies them once: synchronous by
construction. The other workers and the PS tasks only serve (the tutorials'
server.join()) until the client says training is over. Everything else is
the shared loop's (workloads/loop.py), and what it shares with between-graph
replication is graph_mode.py.

Why the tutorials call it rarely used: the client's feed carries every
tower's input, and if the client dies, everything stops. Lines that
distribution adds are marked `# PS:`.
"""
import math
from dataclasses import dataclass

from ps_baseline import placement, servers
from ps_baseline.graph_mode import Feeds, GraphMode, Sessions, graph_mode
from ps_baseline.options import PROG, RESUME
from ringtrain.workloads import loop
from ringtrain.workloads.mode import Identity, StepResult, StragglerWait, Topology
from ringtrain.workloads.sharding import updates_per_epoch

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
class ClientGraph:
    """The one graph the client builds: a tower per worker task."""
    towers: list
    test_feeds: Feeds
    train_op: object
    finite: object        # the towers' mean gradient was finite (else the update was skipped)
    applied_step: object  # the global step after this step's update
    global_step: object
    test_metrics: tuple
    model_variables: list
    simulated: bool
    ps_bytes: list
    shutdown: list  # one enqueue per serving task (PS tasks, other workers)
    scale: object   # float16's loss scale, as this step read it (1 without one)


def build_graph(tf, config, ps, cluster_spec, image_shape):
    from ringtrain.workloads import models
    from ringtrain.workloads.gradients import LossScale, SkipNonFinite, all_finite, graph_accumulated
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
        loss_scale = LossScale(tf) if config.model.loss_scaled else None
        optimizer = SkipNonFinite(tf, config.optimizer.v1(), skipped, loss_scale)
        global_count = tf.compat.v1.placeholder(tf.float32, [], "global_count")
        scale = tf.identity(loss_scale.scale.read_value()) if loss_scale else None
    towers, tower_grads = [], []
    for i in range(num_workers):
        # PS: tower i runs on worker i, reading the variables from the PS tasks.
        device = f"/job:worker/task:{i}"
        with tf.compat.v1.device(device), tf.compat.v1.name_scope(f"tower_{i}"):
            feeds = Feeds.make(tf, image_shape, config.data.accumulate, global_count)
            started = tf.timestamp()
            # Normalised by the global batch's mean per-tower share, as in every other
            # mode, so the towers' mean gradient is the global batch's gradient.
            loss_sum, grads = graph_accumulated(
                tf, model, feeds, global_count / num_workers,
                lambda loss: optimizer.compute_gradients(loss, colocate_gradients_with_ops=True), scale,
                before=[started])
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
        test_feeds = Feeds.make(tf, image_shape)
        test_metrics = models.correct_and_loss_sum(model(test_feeds.images, training=False), test_feeds.labels)
    serving = [("ps", i) for i in range(num_ps)] + [("worker", i) for i in range(num_workers) if i != CLIENT]
    shutdown = servers.shutdown_ops(tf, serving)
    per_ps = placement.describe(tf.compat.v1.trainable_variables())[1]
    return ClientGraph(towers, test_feeds, train_op, finite, applied_step, global_step, test_metrics, model_variables,
                   models.is_simulated(model), [per_ps.get(f"/job:ps/task:{i}", 0) for i in range(num_ps)],
                   shutdown, scale if scale is not None else tf.constant(1.0))


def train(config, ps, cluster, task, dataset):
    from ringtrain.workloads.tfenv import import_tensorflow_quietly, set_threads
    tf = import_tensorflow_quietly()
    set_threads(config.data.threads)
    device = servers.pin_task(cluster, "worker", CLIENT)  # PS: the client's own tower, as every worker's
    graph_mode(tf)
    # PS: the client's gRPC server; every other task must be up before the graph runs.
    server = servers.start_server(tf, cluster, "worker", CLIENT, config.data.threads)
    servers.wait_for_tasks(cluster, "ps", ps.startup_timeout)
    servers.wait_for_tasks(cluster, "worker", ps.startup_timeout)
    g = build_graph(tf, config, ps, tf.train.ClusterSpec(cluster.as_dict()), dataset.image_shape)
    summary = loop.Training(config, dataset, InGraph(tf, config, ps, cluster, dataset, server, g, device)).run()
    return 0 if summary else 1


def serve(tf, cluster, job, task, threads, log):
    """PS tasks, and the tower workers other than the client: serve their
    variables or their tower until the client says training is over (or is gone)."""
    return servers.serve_task(tf, cluster, job, task, threads, log,
                              watch=("the in-graph client (worker 0)", cluster.worker[CLIENT]))


class InGraph(GraphMode):
    """The in-graph client, as the shared loop runs it: every step feeds each
    tower its own shard's batch."""

    def __init__(self, tf, config, ps, cluster, dataset, server, g, device):
        from ringtrain.workloads.checkpoints import GraphStore
        from ringtrain.workloads.tfenv import session_config
        num_workers = len(cluster.worker)
        self.tf, self.config, self.ps, self.cluster, self.dataset, self.g = tf, config, ps, cluster, dataset, g
        self.is_chief = True
        self.identity = Identity("ps-ingraph", PROG, num_workers, local_workers=tuple(range(num_workers)),
                                 worker_word="tower", prefix="client: ", device=device)
        self.sessions = Sessions(tf, server, session_config(tf, config.data.threads, precision=config.model.precision))
        self.agree = servers.Coordinating(lambda: servers.StopFlag(tf, server.target, self.sessions.config))
        self.straggler = StragglerWait.IN_STEP
        self.store = GraphStore(tf, config.loop.keep_checkpoints, self.sessions.in_session)
        self.steps_per_epoch = updates_per_epoch(dataset, num_workers, config.data.batch_size, config.data.accumulate)
        self.topology = Topology(advice=RESUME, servers=tuple(
            [(f"ps task {i}", a) for i, a in enumerate(cluster.ps)] +
            [(f"worker task {i} (tower {i})", a) for i, a in enumerate(cluster.worker) if i != CLIENT]))
        self.feeds = [(i, tower.feeds) for i, tower in enumerate(g.towers)]
        self.test_feeds, self.test_metrics, self.model_variables = g.test_feeds, g.test_metrics, g.model_variables
        self.evaluate = None if g.simulated else self.evaluate_batch
        if ps.show_placement:
            self.say(placement.format_table(*placement.describe(g.model_variables), ps.placement))
            self.say("towers: " + ", ".join(f"tower {i} on {t.device}" for i, t in enumerate(g.towers))
                     + f"; the client (worker {CLIENT}) feeds them all and averages their gradients")

    def session(self):
        restoring = self.store.restore_path
        self.say(f"in-graph replication: {'restoring ' + restoring if restoring else 'initialising'}; "
                 f"{self.identity.workers} tower(s) on {self.identity.workers} worker task(s), "
                 f"{len(self.cluster.ps)} ps, placement {self.ps.placement}")
        return super().session()

    def close(self):
        # PS: training is over; let every serving task exit.
        self.sessions.plain(self.g.shutdown)

    def position(self):
        start = self.sessions.run(self.g.global_step)
        if start:
            self.say(f"resuming at step {start}")
        return start

    def step(self, number, feed, straggler):
        # PS: the client feeds every tower: its bandwidth caps in-graph replication.
        g = self.g
        feed = {**feed, **{tower.extra: factor for tower, factor in zip(g.towers, straggler)}}
        _, loss_sums, counts, finite, applied_step, waits, scale = self.sessions.monitored.run(
            [g.train_op, [t.loss_sum for t in g.towers], [t.count for t in g.towers], g.finite, g.applied_step,
             [t.waited for t in g.towers], g.scale], feed)
        broke = tuple(i for i, loss in enumerate(loss_sums) if not math.isfinite(loss))
        # (float16: gradients that overflowed at a loss scale above 1, from a finite loss, are not divergence)
        overflow = not finite and scale > 1 and not broke
        return StepResult(sum(loss_sums), sum(counts), bool(finite), broke=broke, waited=waits, overflow=overflow)

    def summary_fields(self, reports):
        g = self.g
        return dict(num_ps=len(g.ps_bytes), api="v1", replication="in-graph", placement=self.ps.placement,
                    towers=[t.device for t in g.towers], ps_bytes=g.ps_bytes, gradient_bytes=sum(g.ps_bytes),
                    hosts=[address.rpartition(":")[0] for address in self.cluster.worker])
