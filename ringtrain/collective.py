"""Synchronous data-parallel training over TensorFlow's own collective
all-reduce (`ringtrain --backend tf-collective`):
tf.distribute.MultiWorkerMirroredStrategy. With CommunicationImplementation
RING (the default here) TF's RingReducer runs a two-pass ring, scatter-reduce
then allgather, between the workers' gRPC servers; on GPUs, NCCL may carry it.

The same models, data, shards, lr schedule and loop as ring mode (Horovod);
only how the workers meet and agree differs. Lines that distribution adds
are marked `# TF:`. The workers find each other through TF_CONFIG, set by
the user as TF's documentation does it, or made here from mpirun's ranks.
"""
import contextlib
import json
import os
import pickle
import socket
from dataclasses import dataclass

import numpy as np

from ringtrain.common.errors import Preempted, UsageError
from ringtrain.multihost import launched
from ringtrain.multihost.net import is_listening, wait_for
from ringtrain.synchronous import SynchronousMode
from ringtrain.workloads import loop
from ringtrain.workloads.gradients import DEFAULT_BUCKET_MB
from ringtrain.workloads.mode import Agreement, Topology
from ringtrain.workloads.straggler import check as check_straggler
from ringtrain.workloads.stall import AFTER_THE_WATCHDOG


def main(config, args, dataset):
    """`ringtrain --backend tf-collective`: TF's collective mode from the checked flags and data."""
    from ringtrain.multihost.slurm_step import DEFAULT_PORT_BASE
    from ringtrain.workloads.tfenv import import_tensorflow_quietly
    # (TF_CONFIG, or mpirun's ranks, before TF loads: a bad one is one line)
    workers = cluster(args.port_base or DEFAULT_PORT_BASE)
    import_tensorflow_quietly()
    return train(config, collective_config(args), workers, dataset)


@dataclass(frozen=True)
class CollectiveConfig:
    """TF's collective mode's own flags."""
    communication: str = "RING"
    lr_scaling: bool = True
    warmup_epochs: float = 1.0
    bucket_mb: float = DEFAULT_BUCKET_MB


def collective_config(args):
    return CollectiveConfig(args.communication or "RING", not args.no_lr_scaling, args.warmup_epochs,
                            DEFAULT_BUCKET_MB if args.bucket_mb is None else args.bucket_mb)


def cluster(port_base):
    """(this worker's index, every worker's host:port) from TF_CONFIG, which a
    user sets as TF's documentation does; under mpirun or srun, made from the
    ranks (multihost.launched) and exported; without any, one worker alone:
    (0, []). Checked before TensorFlow loads."""
    text = os.environ.get("TF_CONFIG")
    if not text:
        if not launched.launcher():
            return 0, []
        rank, workers = launched.addresses(port_base)
        os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                              "task": {"type": "worker", "index": rank}})
        return rank, workers
    try:
        tf_config = json.loads(text)
        workers, task = tf_config["cluster"]["worker"], tf_config["task"]
        index = int(task["index"])
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"TF_CONFIG is not TF's cluster description ({type(e).__name__}: {e}): set it as "
                         '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": I}}') \
            from None
    if set(tf_config["cluster"]) - {"worker", "chief"} or task.get("type") != "worker":
        raise UsageError("TF_CONFIG: TF's collective mode runs workers only: give cluster.worker and a task of "
                         "type worker (a PS cluster is ps-baseline's)")
    if not isinstance(workers, list) or not 0 <= index < len(workers):
        raise UsageError(f"TF_CONFIG: task index {index} is not one of the {len(workers)} worker(s): use "
                         f"0..{len(workers) - 1}")
    return index, workers


def train(config, collective, cluster, dataset):
    """config: the shared RunConfig; collective: ringtrain.cli.CollectiveConfig;
    cluster: (this worker's index, every worker's host:port), from cluster()."""
    rank, workers = cluster
    check_straggler(config.loop.straggler, max(len(workers), 1))
    import keras
    import tensorflow as tf
    from ringtrain.workloads.devices import local_index, pin_gpu
    from ringtrain.workloads.tfenv import set_threads
    set_threads(config.data.threads)  # (before the strategy: TF's runtime starts with it)
    # TF: pin each worker to the GPU of its place among its host's workers, where there are GPUs.
    device = pin_gpu(local_index(workers, rank) if workers else 0)
    if workers:
        print(f"ringtrain: worker {rank}: warning: TF's gRPC server at {workers[rank]} listens on every interface "
              "and runs any op sent to it, without authentication: keep that port closed to all but the "
              "cluster's hosts", flush=True)
    # TF: the strategy connects every worker (it waits for all of them) and, with RING,
    # reduces with TF's ring: scatter-reduce, then allgather.
    strategy = connect(tf, collective.communication, config.loop.stall_timeout)
    with strategy.scope():
        # TF: the variables are mirrored on every worker; updates are applied to all alike.
        # TF: with --sync-batch-norm, Keras all-reduces batch statistics over the workers.
        model = config.model.build(synchronized_batch_norm=lambda layer: keras.layers.BatchNormalization(
            **layer, synchronized=True))
        optimizer = config.optimizer.keras()
        optimizer.build(model.trainable_variables)
    # (float16's loss scale outside the strategy's scope: each worker's own, moved alike by the agreed updates)
    from ringtrain.workloads.gradients import LossScale
    loss_scale = LossScale(tf) if config.model.loss_scaled else None
    mode = CollectiveMode(tf, strategy, cluster, config, collective, dataset, model, optimizer, device, loss_scale)
    with chief_leaves_first(rank, workers):
        loop.Training(config, dataset, mode).run()
    return 0


@contextlib.contextmanager
def chief_leaves_first(rank, workers, timeout=120.0):
    """TF's collectives pull each worker's part from its gRPC server: a worker
    that left at once after the last collective (the end's gather, or the
    broadcast after a signal) could close its server while the chief still
    reads from it ("RecvBuf ... Socket closed" on the chief). So, once training
    is done, the other workers leave when the chief's server is gone (its
    process has ended), or after `timeout` seconds."""
    try:
        yield
    except Preempted:
        _wait_for_the_chief(rank, workers, timeout)
        raise
    _wait_for_the_chief(rank, workers, timeout)


def _wait_for_the_chief(rank, workers, timeout):
    if rank > 0 and workers:
        wait_for(lambda: not is_listening(workers[0]), timeout, poll=0.1)


class CollectiveMode(SynchronousMode):
    """A worker of TF's collective mode, as the shared loop runs it."""

    def __init__(self, tf, strategy, cluster, config, collective, dataset, model, optimizer, device, loss_scale=None):
        rank, workers = cluster
        self.tf, self.communication, self.bucket_mb = tf, collective.communication, collective.bucket_mb
        agree = CollectiveAgreement(tf, strategy, rank, max(len(workers), 1))
        train_step = make_train_step(tf, strategy, model, optimizer, config.model.statistics_to_average(model),
                                     loss_scale, bucket_bytes=int(collective.bucket_mb * 2**20))
        super().__init__(config, dataset, model, optimizer, agree, train_step,
                         dict(name="tf-collective", prog="ringtrain", device=device), schedule=collective,
                         loss_scale=loss_scale)
        self.topology = Topology(names=lambda r: f"worker {r} ({agree.hosts()[r]})",
                                 servers=tuple((f"worker {r}", a) for r, a in enumerate(workers) if r != rank))

    def summary_fields(self, reports):
        return dict(super().summary_fields(reports), controller="tf", bucket_mb=self.bucket_mb,
                    allreduce_algorithm=implementation_in_effect(self.tf, self.communication))


def connect(tf, communication="RING", stall_timeout=0.0):
    """TF's MultiWorkerMirroredStrategy over the workers of TF_CONFIG, reducing
    with `communication` (RING, AUTO or NCCL). stall_timeout: --stall-timeout,
    after which the watchdog names a worker that stopped answering; TF's own
    heartbeat then waits AFTER_THE_WATCHDOG longer (tf_heartbeat_after)."""
    if stall_timeout and "TF_CONFIG" in os.environ:
        tf_heartbeat_after(tf, stall_timeout + AFTER_THE_WATCHDOG)
    ring_in_subdivisions()
    return tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=communication))


def ring_in_subdivisions():
    """TF's ring as its runtime would cut it: each worker's share of a pack in
    up to 2 subdivisions of at most 4 MiB, in flight at once (ring_alg.cc), so
    that one crosses the link while the other is reduced. TF's Python API
    asks for none (max_subdivs_per_device=-1): each share then moves whole,
    one gRPC pull, and the link idles while it is reduced. The same sums,
    in other pieces. (TF's private API: tests/test_private_apis.py.)"""
    import functools

    from tensorflow.python.ops import collective_ops
    made_by_tf = getattr(collective_ops.all_reduce_v2, "func", collective_ops.all_reduce_v2)
    collective_ops.all_reduce_v2 = functools.partial(made_by_tf, max_subdivs_per_device=0)


def tf_heartbeat_after(tf, seconds):
    """The coordination service the strategy starts, as it configures it, but
    with its heartbeat timing out after `seconds`. Under TF's 10 s, one late
    heartbeat on a loaded machine aborted every collective of a live job
    (DEVELOPERS.md 6.5); a silent worker is the stall watchdog's to name.
    The strategy keeps a configuration that is already there. (TF's private
    API: tests/test_private_apis.py.)"""
    from tensorflow.compiler.xla.tsl.protobuf.coordination_config_pb2 import CoordinatedJob
    from tensorflow.python.distribute.multi_worker_util import coordination_leader
    from tensorflow.python.eager import context
    spec = tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec()
    context.context().configure_coordination_service(
        service_type="standalone", service_leader=coordination_leader(spec),
        coordinated_jobs=[CoordinatedJob(name=job, num_tasks=spec.num_tasks(job))
                          for job in ("chief", "worker") if job in spec.jobs],
        heartbeat_timeout_in_ms=int(seconds * 1000))


def make_train_step(tf, strategy, model, optimizer, statistics=(), loss_scale=None, bucket_bytes=0):
    from ringtrain.workloads.gradients import accumulated, all_reduce_in_buckets, already_summed, apply_if_finite, \
        rescaled
    from ringtrain.workloads.tfenv import step_function
    already_summed(optimizer)  # (the replica step hands it the all-reduced sum)

    def average_statistics():
        # TF: batch norm's moving statistics, which the forward pass moved towards this worker's
        # batch, averaged over the workers (one packed all-reduce): every worker holds one model.
        means = tf.distribute.get_replica_context().all_reduce("MEAN", [tf.identity(v) for v in statistics])
        for variable, mean in zip(statistics, means):
            variable.assign(mean)

    def replica_step(images, labels, weights, global_count, vote):
        # TF: divided by the global batch's samples, the SUM of the workers'
        # gradients is exactly the global batch's gradient (K micro-batches summed first).
        loss_sum, samples, grads = accumulated(tf, model, (images, labels, weights, global_count), global_count,
                                               loss_scale, after_forward=average_statistics if statistics else None)
        # TF: the gradients all-reduced (SUM) in buckets, last layers first, each as soon as
        # backprop has made it; every worker then holds the same sum, so all of them apply
        # it, or skip it where it is not finite, together. Every worker's stop vote is summed
        # in the same step (a signal stops every worker after the same step:
        # workloads/preemption.py), riding in the first bucket: as a collective of its own it
        # cost 1-2 ms a step on one host (DEVELOPERS.md 4.15).
        *summed, votes = all_reduce_in_buckets(tf, [*grads, vote_beside(tf, vote, grads)], bucket_bytes)
        applied = apply_if_finite(optimizer, summed, model.trainable_variables)
        moved, overflow = rescaled(tf, loss_scale, applied, loss_sum)
        with tf.control_dependencies([moved]):
            return loss_sum, samples, tf.identity(applied), tf.identity(overflow), tf.reshape(votes, [])

    @step_function
    def train_step(images, labels, weights, global_count, lr, vote):
        optimizer.learning_rate.assign(lr)  # (every worker's copy, before the replicas step)
        results = strategy.run(replica_step, args=(images, labels, weights, global_count, vote))
        return [strategy.experimental_local_results(r)[0] for r in results]

    return train_step


def vote_beside(tf, vote, grads):
    """The stop vote as a 1-element tensor of the last layer's gradient dtype: TF
    packs a bucket's tensors into one (concat), and all_reduce_in_buckets puts
    the last tensor of the list with the last layers' gradients, in the first
    bucket. (A vote counts workers: exact in any float type.)"""
    last = next((g for g in reversed(grads) if g is not None), None)
    return tf.cast(tf.reshape(vote, [1]), vote.dtype if last is None else last.dtype)


def implementation_in_effect(tf, asked):
    """What carried the gradients: TF's ring on CPU, whatever was asked (NCCL needs GPUs)."""
    if asked in ("AUTO", "NCCL") and tf.config.list_physical_devices("GPU"):
        return f"tf {'nccl' if asked == 'NCCL' else 'auto (nccl on GPUs)'}"
    return "tf ring" + (f" ({asked} asked; no GPU)" if asked != "RING" else "")


class CollectiveAgreement(Agreement):
    """How the workers agree on a sum, a gather or a broadcast: TF's own
    collectives (every worker makes the same calls, in the same order)."""

    def __init__(self, tf, strategy, rank, size):
        self.tf, self.strategy, self.rank, self.size = tf, strategy, rank, size
        self._hosts = None
        # Gathers of new shapes (a log line's loss, the end's reports) make TF retrace its
        # gather and say so, again and again: not news.
        tf.get_logger().setLevel("ERROR")

    def sum(self, values):
        total = self.strategy.reduce("SUM", self.tf.constant(values, self.tf.float64), axis=None)
        return [float(v) for v in total.numpy()]

    def gather(self, obj, gone=frozenset):
        """Every worker's obj, in worker order: pickled (as Horovod's
        allgather_object does; it travels between this job's own workers only)
        and widened to int32, which TF's collective gather takes."""
        data = np.frombuffer(pickle.dumps(obj), np.uint8).astype(np.int32)
        lengths = self.strategy.gather(self.tf.constant([len(data)]), axis=0).numpy()
        joined = self.strategy.gather(self.tf.constant(data), axis=0).numpy().astype(np.uint8).tobytes()
        out, at = [], 0
        for length in lengths:
            out.append(pickle.loads(joined[at:at + length]))
            at += length
        return out

    def broadcast(self, obj):
        return self.gather(obj)[0]

    def broadcast_variables(self, variables):
        """Worker 0's values into every worker's variables: one summed collective
        per dtype, every other worker adding zeros. (TF: every worker starts from
        worker 0's weights and optimizer state.)"""
        tf = self.tf
        # (in the same order on every worker: a set's order differs between processes)
        dtype_of = lambda v: tf.as_dtype(v.dtype)  # (a Keras variable's is a string)
        for dtype in sorted({dtype_of(v) for v in variables}, key=lambda d: d.name):
            group = [v for v in variables if dtype_of(v) == dtype]
            mine = tf.concat([tf.reshape(v, [-1]) if self.rank == 0 else tf.zeros([v.shape.num_elements()], dtype)
                              for v in group], 0)
            flat, at = self.strategy.reduce("SUM", mine, axis=None), 0
            for v in group:
                n = v.shape.num_elements()
                v.assign(tf.reshape(flat[at:at + n], v.shape))
                at += n

    def hosts(self):
        if self._hosts is None:
            self._hosts = self.gather(socket.gethostname())
        return self._hosts

