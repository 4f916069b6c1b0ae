"""The same training through TF's current PS API (`--api tf2`, async only):
tf.distribute.ParameterServerStrategy + ClusterCoordinator.

Here PS and worker tasks only run servers; a separate coordinator task (job
"chief") owns the program: it creates the variables on the PS tasks and
schedules step functions onto whichever worker is free. Its loop is the
shared one (workloads/loop.py); a scheduled step's result is read a few
steps later, so the workers are never left waiting for the coordinator.
Lines that distribution adds are marked `# PS:`.
"""
import functools

import numpy as np

from ps_baseline import reports, servers
from ps_baseline.options import PROG, RESUME
from ringtrain.workloads import loop
from ringtrain.workloads.devices import remote_workers_device
from ringtrain.workloads.mode import Deferred, Identity, Mode, StepResult, StragglerWait, Topology
from ringtrain.workloads.sharding import epoch_plan, updates_per_epoch

LAG_PER_WORKER = 4  # steps in flight per worker: results are read this far behind


def inter_op_threads(threads):
    """TF2's remote functions deadlock with a single inter-op thread (a
    blocked receive holds the only one), so --threads 1 still gets 2 here."""
    return max(threads, 2) if threads else 0


def serve(tf, cluster, job_name, task_index, threads, log):
    """PS and worker tasks: a server, until the coordinator says training is
    over (or is gone)."""
    servers.pin_task(cluster, job_name, task_index)
    server = servers.start_server(tf, cluster, job_name, task_index, threads, inter_op_threads(threads))
    coordinator = cluster.chief[0]
    return servers.serve(tf, server, job_name, task_index, threads, log, watch=("the TF2 coordinator", coordinator),
                         told_by=coordinator)


def train(config, ps, cluster, task, dataset):
    import tensorflow as tf
    if config.data.threads:
        tf.config.threading.set_intra_op_parallelism_threads(config.data.threads)
        tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads(config.data.threads))
    servers.pin_task(cluster, "chief", task)  # the coordinator computes nothing of the training
    servers.wait_for_tasks(cluster, "ps", ps.startup_timeout)
    servers.wait_for_tasks(cluster, "worker", ps.startup_timeout)

    # PS: the strategy places variables on the PS tasks; the coordinator schedules steps.
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster.as_dict()), task_type="chief", task_id=0, rpc_layer="grpc")
    partitioner = (tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=ps.partition_min_bytes, max_shards=len(cluster.ps)) if ps.placement == "partitioned"
        else None)
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    # (each checkpoint retraces TF's saver function, and TF warns about it every time: not news)
    tf.get_logger().setLevel("ERROR")
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    loop.Training(config, dataset, Coordinator(tf, strategy, coordinator, config, ps, cluster, dataset)).run()
    return 0


class Coordinator(Mode):
    """The TF2 coordinator, as the shared loop runs it: each loop step is one
    step scheduled on whichever worker is free; its result is read a few steps
    later, so that the workers never wait for the coordinator."""

    def __init__(self, tf, strategy, coordinator, config, ps, cluster, dataset):
        from ringtrain.workloads.checkpoints import ObjectStore
        from ringtrain.workloads.evaluation import metrics_of
        num_workers, b = len(cluster.worker), config.data.batch_size
        self.tf, self.strategy, self.coordinator, self.config, self.ps, self.cluster, self.dataset = \
            tf, strategy, coordinator, config, ps, cluster, dataset
        self.state = TrainingState(tf, strategy, config, num_workers)
        self.identity = Identity("ps-tf2", PROG, num_workers, local_workers=tuple(range(num_workers)),
                                 prefix="coordinator: ", device=remote_workers_device(tf))
        self.agree = servers.Coordinating(lambda: servers.StopFlag(tf, f"grpc://{cluster.chief[0]}"))
        self.store = ObjectStore(config.loop.keep_checkpoints, **self.state.checkpointed())
        self.steps_per_epoch = updates_per_epoch(dataset, num_workers, b, config.data.accumulate)
        self.topology = Topology(
            waits_for_all=False, servers=tuple((f"ps task {i}", a) for i, a in enumerate(cluster.ps)),
            # (TF's coordinator goes on without a dead worker: a frozen one is named when nobody steps)
            frozen_candidates=tuple((f"worker task {i}", a) for i, a in enumerate(cluster.worker)),
            advice=RESUME)
        # PS: every worker's steps are scheduled here, one at a time, each waiting on its own worker.
        self.straggler, self.scheduled = StragglerWait.ON_WORKERS, num_workers
        self.samples_per_update = config.data.per_update
        self.lag, self.describe = LAG_PER_WORKER * num_workers, f"{num_workers} worker(s), {len(cluster.ps)} ps"
        self.evaluate = metrics_of(self.state.model)

    def start(self, restored):
        """The position is each worker's own step count, restored with the rest."""
        from ringtrain.workloads.checkpoints import Progress
        steps, per_round = self.state.steps(), self.steps_per_epoch * self.scheduled
        return Progress.at(steps, steps // per_round, steps % per_round, per_round, 1, self.config.data.per_update)

    def batches(self, start):
        # PS: each worker reads its own shard, from where it stood.
        iterator = iter(self.coordinator.create_per_worker_dataset(per_worker_dataset(
            self.tf, self.config, self.dataset, self.identity.workers, self.steps_per_epoch,
            self.state.worker_steps.numpy().tolist())))
        self.worker_step = make_worker_step(self.tf, self.strategy, self.state, self.identity.workers)
        number, per_round = start.step, self.steps_per_epoch * self.scheduled
        while True:  # (the batch itself is the workers' to read)
            yield number // per_round, number % per_round + 1, iterator
            number += 1

    def step(self, number, iterator, straggler):
        scheduled = self.coordinator.schedule(self.worker_step, args=(iterator,))

        def resolve():
            loss_sum, samples, applied, update, worker, waited, overflow = (np.asarray(v) for v in scheduled.fetch())
            return StepResult(loss_sum, samples, bool(applied), update=int(update), broke=(int(worker),),
                              waited=np.eye(self.identity.workers)[int(worker)] * float(waited),
                              overflow=bool(overflow))
        return Deferred(resolve)

    def weights(self):
        from ringtrain.workloads import models
        return models.named_weights(self.state.model)

    def close(self):
        # PS: training is over; the PS and worker tasks may exit instead of serving forever.
        # (through the coordinator's own server, which the strategy started: a PS task as the
        # master would end in the middle of its own step, and that step would never return)
        cluster = self.cluster
        servers.shut_down(self.tf, f"grpc://{cluster.chief[0]}", [(job, i) for job in ("ps", "worker")
                                                                 for i in range(len(getattr(cluster, job)))])

    def summary_fields(self, reports_):
        state = self.state
        stale_sum, stale_max = int(state.stale_sum.numpy()), int(state.stale_max.numpy())
        # (steps: every worker's, as applied: the last result read need not be the last update made)
        return dict(steps=state.steps(), num_ps=len(self.cluster.ps), reporting_workers=[-1], api="tf2",
                    placement=self.ps.placement,
                    hosts=[address.rpartition(":")[0] for address in self.cluster.worker],
                    throughput_measured_at="coordinator (all workers as one)",
                    worker_steps=state.worker_steps.numpy().tolist(),
                    **reports.staleness_fields([{"staleness": [stale_sum, state.steps(), stale_max]}]))


class TrainingState:
    """The model, optimizer and counters, created on the PS tasks."""

    def __init__(self, tf, strategy, config, num_workers):
        from ringtrain.workloads.gradients import LossScale
        with strategy.scope():
            self.model = config.model.build()
            self.loss_scale = LossScale(tf) if config.model.loss_scaled else None
            self.optimizer = config.optimizer.keras()
            self.optimizer.build(self.model.trainable_variables)
            # Keras 3's optimizer.iterations loses increments under async PS: count ourselves.
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
            # each worker's own steps: where its data stands, for a resume
            self.worker_steps = tf.Variable(np.zeros(num_workers, np.int64), trainable=False, name="worker_steps")
            self.stale_sum = tf.Variable(0, dtype=tf.int64, trainable=False, name="staleness_sum")
            self.stale_max = tf.Variable(0, dtype=tf.int64, trainable=False, name="staleness_max")

    def checkpointed(self):
        return dict(model=self.model, optimizer=self.optimizer, global_step=self.global_step,
                    worker_steps=self.worker_steps, **(self.loss_scale.variables() if self.loss_scale else {}))

    def steps(self):
        return int(self.global_step.numpy())


def per_worker_dataset(tf, config, source, num_workers, per_epoch, worker_steps):
    """The dataset function create_per_worker_dataset runs on each worker: the
    worker's own share of every epoch (workloads/pipeline.py, as every other
    mode reads it), from the update its step count says it stands at, with its
    --straggler factors. TF traces it once for every worker: the worker learns
    which one it is when it runs, from
    tf.distribute.coordinator.experimental_get_current_worker_index(), and reads
    the one of the workers' datasets that is its own."""
    from ringtrain.workloads.pipeline import epoch_dataset
    data, loop_ = config.data, config.loop
    if source.train.in_memory:
        source.train.keep_as_tensors(tf)  # (one copy, captured by the function, not each epoch's share)
    # two epochs from where each worker stands, then around again (.repeat): the function, every
    # worker's datasets in it, is traced and sent to the workers before their first step
    epochs = 2

    def own(worker):
        first, done = divmod(worker_steps[worker], per_epoch)
        parts = [epoch_dataset(tf, source, epoch_plan(source, worker, num_workers, data.batch_size, data.accumulate,
                                                      data.seed, e, done if e == first else 0),
                               data.batch_size, data.accumulate) for e in range(first, first + epochs)]
        return functools.reduce(lambda a, b: a.concatenate(b), parts).repeat()

    # --straggler: each worker's wait after each of its own steps, in multiples of its compute, from
    # the one policy (Straggler.extra), for one period of its slow steps
    spec = loop_.straggler
    period = spec.every if spec else 1
    extra = np.array([[spec.extra(w, s) if spec else 0.0 for s in range(1, period + 1)] for w in range(num_workers)],
                     np.float32)  # [W, period]: step s (from 1) of worker w waits extra[w, (s - 1) % period]

    def dataset_fn(_):
        worker = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int32)
        # (only the chosen one is read: the others' files are never opened)
        batches = tf.data.Dataset.choose_from_datasets([own(w) for w in range(num_workers)],
                                                       tf.data.Dataset.from_tensors(tf.cast(worker, tf.int64)).repeat())
        factor = tf.data.Dataset.from_tensor_slices(tf.gather(extra, worker)).repeat()
        return tf.data.Dataset.zip((batches, factor, tf.data.Dataset.from_tensors(worker).repeat()))

    return lambda: tf.distribute.get_strategy().distribute_datasets_from_function(dataset_fn)


def make_worker_step(tf, strategy, state, num_workers):
    from ringtrain.workloads.gradients import accumulated, apply_if_finite, rescaled
    from ringtrain.workloads.straggler import wait_after
    from ringtrain.workloads.tfenv import step_function
    model, optimizer, global_step, loss_scale = state.model, state.optimizer, state.global_step, state.loss_scale

    @step_function
    def worker_step(iterator):
        def step(batch, extra, worker):
            read_step = global_step.read_value()
            started = tf.timestamp()
            with tf.control_dependencies([read_step, started]):  # weights are read after the step count
                loss_sum, samples, grads = accumulated(tf, model, batch, batch[3] / num_workers, loss_scale)
            grads, waited = wait_after(tf, grads, started, extra)  # --straggler, on the straggler only
            applied = apply_if_finite(optimizer, grads, model.trainable_variables)
            moved, overflow = rescaled(tf, loss_scale, applied, loss_sum)
            update = global_step.assign_add(1)
            state.worker_steps.scatter_add(tf.IndexedSlices(tf.ones([1], tf.int64), tf.reshape(worker, [1])))
            stale = update - read_step - 1
            state.stale_sum.assign_add(stale)
            state.stale_max.assign(tf.maximum(state.stale_max, stale))
            with tf.control_dependencies([moved]):
                return loss_sum, samples, tf.identity(applied), update, worker, waited, tf.identity(overflow)
        # PS: runs on whichever worker the coordinator picks; variables live on the PS tasks.
        return strategy.run(step, args=next(iterator))

    return worker_step
