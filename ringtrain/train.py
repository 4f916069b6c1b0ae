"""Synchronous data-parallel training over Horovod's ring-allreduce.

Reads top to bottom like Horovod's examples/tensorflow2 scripts; every line
that distribution adds is marked `# Horovod:`. What is not distribution
(logging, checkpoints, the stall watchdog, --straggler, snapshots, the
evaluation and the summary) is the shared loop's (workloads/loop.py), which
this recipe hands its mode; what it shares with TF's collective mode (the
shards, the lr schedule, the step's bookkeeping) is ringtrain/synchronous.py.
"""
import re
from dataclasses import dataclass

from ringtrain import knobs
from ringtrain.common.errors import Preempted, TrainingStopped, exit_now, launched_rank
from ringtrain.synchronous import SynchronousMode
from ringtrain.workloads import loop
from ringtrain.workloads.gradients import DEFAULT_RING_BUCKET_MB, reduce_in_buckets, ring_buckets
from ringtrain.workloads.horovod_env import allreduce_algorithm_in_effect, controller_in_effect, horovod_loop_in_effect
from ringtrain.workloads.mode import Agreement, Topology
from ringtrain.workloads.preemption import PREEMPTION
from ringtrain.workloads.straggler import check as check_straggler


def main(config, args, dataset):
    """`ringtrain` (--backend horovod): ring mode from the checked flags and data."""
    from ringtrain.workloads.tfenv import import_tensorflow_quietly
    import_tensorflow_quietly()
    return in_horovod(lambda: train(config, horovod_config(args), dataset))


def in_horovod(run):
    """run() under Horovod: a peer that died mid-collective is one line; Horovod's
    own end (MPI_Finalize) comes first, then no teardown of TF's modules."""
    import horovod.tensorflow as hvd
    try:
        code = run()
    except Preempted:
        hvd.shutdown()  # (MPI_Finalize: mpirun takes a rank that leaves without it for a failure)
        raise
    except Exception as e:
        gone = peer_gone(str(e))
        if gone is None:
            if hvd.is_initialized() and hvd.size() == 1:
                # (no peer to wait for: without MPI_Finalize, a one-process run's OpenMPI
                # left its session folder in /tmp at every error; with peers, Finalize could
                # wait on ranks still training, so the launcher ends those)
                hvd.shutdown()
            raise
        # A peer died mid-collective. Under Gloo this rank sees it at once, before the launcher
        # or scheduler that names the peer has ended the job (mpirun, when a rank exits or when
        # it wakes a frozen one with SIGCONT, then SIGTERM; SLURM, once it finds a node dead):
        # this rank waits for that end, quietly, and says it in one line only if none comes.
        ended_by_launcher = PREEMPTION.wait(LAUNCHER_GRACE)
        rank = launched_rank()
        raise TrainingStopped(f"{'rank ' + str(rank) + ': ' if rank is not None else ''}a collective failed: "
                              f"another rank, or its host, is gone ({gone}); the job ends: "
                              "resume with --resume from the last checkpoint, or run with --elastic",
                              quiet=ended_by_launcher) from None
    hvd.shutdown()
    return exit_now(code)


# How long a rank whose peer is gone waits for its launcher to end the job (and name the
# peer) before saying so itself: SLURM finds a dead node after SlurmdTimeout (10 s in
# ringtrain's clusters, more on many real ones); mpirun ends the others within a second.
LAUNCHER_GRACE = 30.0

# What Gloo's TCP transport says when a peer's sockets close or go silent mid-collective
# ("[.../gloo/transport/tcp/pair.cc:598] Connection closed by peer [198.18.0.1]:20897").
GLOO_TRANSPORT = re.compile(r"gloo/transport/[\w/]+\.cc:\d+\] ([^\n]+)")


def peer_gone(message):
    """What a failed collective's error says of a peer that is gone (Horovod's own
    shutdown, or Gloo's transport), or None for any other error."""
    if "Horovod has been shut down" in message:
        return "Horovod has been shut down"
    found = GLOO_TRANSPORT.search(message)
    return f"Gloo: {found.group(1).strip()}" if found else None


@dataclass(frozen=True)
class HorovodConfig:
    """Ring mode's own flags."""
    fp16_allreduce: bool = False
    adasum: bool = False
    fusion_threshold_mb: float = None
    cycle_time_ms: float = None
    horovod_loop: str = None
    timeline: str = None
    mpi_allreduce: str = "ring"
    mpi_busy_wait: bool = False
    cpu_operations: str = "auto"
    no_allreduce: bool = False
    elastic: bool = False
    commit_every: int = 10
    lr_scaling: bool = True     # lr x N (not with --no-lr-scaling, nor Adasum)
    warmup_epochs: float = 1.0
    bucket_mb: float = DEFAULT_RING_BUCKET_MB


def horovod_config(args):
    return HorovodConfig(args.fp16_allreduce, args.adasum, args.fusion_threshold_mb, args.cycle_time_ms,
                         args.horovod_loop, args.timeline, args.mpi_allreduce or "ring", args.mpi_busy_wait,
                         args.cpu_operations or "auto", args.no_allreduce, args.elastic, args.commit_every or 10,
                         lr_scaling=not (args.no_lr_scaling or args.adasum), warmup_epochs=args.warmup_epochs,
                         bucket_mb=DEFAULT_RING_BUCKET_MB if args.bucket_mb is None else args.bucket_mb)


def train(config, horovod, dataset):
    """config: the shared workloads.config.RunConfig; horovod: ringtrain.cli.HorovodConfig."""
    hvd, model, optimizer, device, loss_scale = start_horovod(config, horovod)
    mode = RingMode(hvd, config, horovod, dataset, model, optimizer, device, loss_scale)
    loop.Training(config, dataset, mode).run()
    return 0


def start_horovod(config, horovod):
    """Horovod initialised, this rank pinned, the model, its optimizer and
    float16's loss scale (or None) built."""
    knobs.apply_before_init(horovod, config.loop.stall_timeout)  # MPI's and Horovod's knobs: read by hvd.init
    import horovod.tensorflow as hvd
    from ringtrain.workloads.devices import pin_gpu
    from ringtrain.workloads.gradients import LossScale
    from ringtrain.workloads.tfenv import set_threads

    # Horovod: initialise; rank, size and local rank come from whoever launched us.
    hvd.init()
    check_straggler(config.loop.straggler, hvd.size())
    set_threads(config.data.threads)
    # Horovod: pin each rank to one GPU by local rank, where there are GPUs.
    device = pin_gpu(hvd.local_rank())

    # Horovod: with --sync-batch-norm, batch statistics are all-reduced over the ranks.
    model = config.model.build(synchronized_batch_norm=hvd.SyncBatchNormalization.from_config)
    optimizer = config.optimizer.keras()
    optimizer.build(model.trainable_variables)
    import tensorflow as tf
    return hvd, model, optimizer, device, LossScale(tf) if config.model.loss_scaled else None


class RingMode(SynchronousMode):
    """A rank of ring mode, as the shared loop runs it."""

    def __init__(self, hvd, config, horovod, dataset, model, optimizer, device, loss_scale=None):
        self.hvd, self.horovod = hvd, horovod
        agree = HorovodAgreement(hvd)
        train_step = make_train_step(hvd, horovod, model, optimizer, config.model.statistics_to_average(model),
                                     loss_scale)
        super().__init__(config, dataset, model, optimizer, agree, train_step,
                         dict(name="ring", prog="ringtrain", worker_word="rank", device=device), schedule=horovod,
                         loss_scale=loss_scale)
        self.topology = Topology(names=lambda r: f"rank {r} ({agree.hosts()[r]})")
        self.identical_updates = not horovod.no_allreduce  # (without the allreduce, each rank its own)

    def summary_fields(self, reports):
        controller = controller_in_effect(self.hvd.mpi_enabled())
        return dict(super().summary_fields(reports), controller=controller,
                    allreduce_algorithm=allreduce_algorithm_in_effect(controller),
                    horovod_loop=horovod_loop_in_effect(), bucket_mb=self.horovod.bucket_mb)


def make_train_step(hvd, horovod, model, optimizer, statistics=(), loss_scale=None):
    import numpy as np
    import tensorflow as tf
    from ringtrain.workloads.gradients import accumulated, apply_if_finite, rescaled
    from ringtrain.workloads.tfenv import step_function
    # Horovod: fp16 compression and Adasum are options. By default each rank's loss is over
    # the global batch's sample count and the gradients are summed (hvd.Sum): the sum is
    # the global batch's gradient, as hvd.Average's would be, without Average's scaling of
    # every fused buffer by 1/N on Horovod's thread (10 % of its CPU on mnist_cnn). fp16
    # keeps Average: gradients already divided by N would underflow in half precision sooner.
    # (Without the allreduce each rank trains alone on its own share.)
    compression = hvd.Compression.fp16 if horovod.fp16_allreduce else hvd.Compression.none
    summed = not (horovod.adasum or horovod.fp16_allreduce or horovod.no_allreduce)
    reduce_op = hvd.Sum if summed else hvd.Adasum if horovod.adasum else hvd.Average

    def average_statistics():
        # Horovod: batch norm's moving statistics, which the forward pass moved towards this
        # rank's batch, averaged over the ranks while backprop runs: every rank holds one model.
        # (One flat tensor: a grouped allreduce of ResNet-50's 106 cost 7-10 % of its step.)
        flat = hvd.allreduce(tf.concat([tf.reshape(v, [-1]) for v in statistics], 0), op=hvd.Average,
                             name=horovod_op_name("moving_statistics"))
        for variable, mean in zip(statistics, tf.split(flat, [int(np.prod(v.shape)) for v in statistics])):
            variable.assign(tf.reshape(mean, variable.shape))

    @step_function
    def train_step(images, labels, weights, global_count, lr, vote):
        optimizer.learning_rate.assign(lr)
        # Horovod: the gradients are all-reduced in buckets, each as soon as backprop has made
        # its gradients (hvd.DistributedGradientTape issues each alone: --bucket-mb 0); with
        # --accumulate K, as Horovod's backward_passes_per_step, the K passes' sum is
        # all-reduced once. Every rank's stop vote rides in one of them (a signal stops every
        # rank after the same step).
        exchange = None if horovod.no_allreduce else ExchangeWithVote(hvd, vote, reduce_op, compression,
                                                                      int(horovod.bucket_mb * 2**20))
        # Horovod: divide by the global batch's count (or, where the ranks' gradients are
        # averaged, its mean per-rank share), not the local count, so that the ranks'
        # sum (average) is exactly the global batch's gradient.
        loss_sum, samples, grads = accumulated(
            tf, model, (images, labels, weights, global_count), global_count if summed else global_count / hvd.size(),
            loss_scale,
            exchange=exchange,
            after_forward=average_statistics if statistics and not horovod.no_allreduce else None)
        # (without the allreduce each rank trains alone, but every rank stops after the same step)
        votes = summed_votes(hvd, vote) if exchange is None else exchange.votes
        # Horovod: after the allreduce every rank holds the same gradients, so every rank
        # applies them, or skips a non-finite update, alike.
        applied = apply_if_finite(optimizer, grads, model.trainable_variables)
        moved, overflow = rescaled(tf, loss_scale, applied, loss_sum)
        with tf.control_dependencies([moved]):
            return loss_sum, samples, tf.identity(applied), tf.identity(overflow), votes

    return train_step


def horovod_op_name(what):
    """A name for a Horovod op in the step's graph. Its failure (a lost rank) reaches --elastic as
    HorovodInternalError only if "Horovod" is in the failing node's name (elastic.py's wrapper,
    and hvd.elastic.run with patch 0007, read the error's message for it)."""
    return f"HorovodAllreduce_{what}"


class ExchangeWithVote:
    """Ring mode's gradient exchange (workloads.gradients.accumulated's): the
    gradients all-reduced by `op`, with this rank's stop `vote` riding in the
    last dense gradient's allreduce, the first that backprop makes. Alone, the
    vote's allreduce took a Horovod cycle of its own: about 2 % of a 40 ms
    mnist_cnn step on one host, more across hosts. Adasum, which combines whole
    tensors, sums it alone, as does a model without a dense gradient. `votes`:
    every rank's votes, summed. bucket_bytes: workloads.gradients.ring_buckets'."""

    def __init__(self, hvd, vote, op, compression, bucket_bytes=0):
        self.hvd, self.vote, self.op, self.compression, self.votes = hvd, vote, op, compression, None
        self.bucket_bytes = bucket_bytes

    def __call__(self, grads, grouped):
        import tensorflow as tf
        dense = [i for i, g in enumerate(grads) if g is not None and not isinstance(g, tf.IndexedSlices)]
        if self.op == self.hvd.Adasum or not dense:
            self.votes = summed_votes(self.hvd, self.vote)
            return self.allreduce(grads, grouped)
        carrier, grads = dense[-1], list(grads)
        shape, dtype = tf.shape(grads[carrier]), grads[carrier].dtype
        grads[carrier] = tf.concat([tf.reshape(grads[carrier], [-1]), tf.cast(tf.reshape(self.vote, [1]), dtype)], 0)
        reduced = self.allreduce(grads, grouped)
        flat = reduced[carrier]
        reduced[carrier] = tf.reshape(flat[:-1], shape)
        # (a vote counts the ranks asked to stop; the loop reads whether it is > 0. Average
        # divided it by the rank count, fp16 rounded it: both keep it > 0.)
        self.votes = tf.cast(flat[-1], tf.float32) * (self.hvd.size() if self.op == self.hvd.Average else 1)
        return reduced

    def allreduce(self, grads, grouped):
        """The gradients that exist (None: a variable the loss does not use) all-reduced: in one
        grouped allreduce (the K micro-batches' sum, made at once), or in buckets (--bucket-mb),
        each issued once backprop has made its gradients, last layers first. Issued alone, each
        of a model's many small gradients took a Horovod round, and across hosts small messages
        of its own (docs/results/2026-11-29-ring-buckets.md)."""
        import tensorflow as tf
        kw = dict(op=self.op, compression=self.compression)

        def plan(present):
            if grouped:
                return [list(range(len(present)))]
            # (sparse gradients, and any of unknown size, alone: Horovod gathers the former)
            elements = [None if isinstance(g, tf.IndexedSlices) else g.shape.num_elements() for g in present]
            return ring_buckets([float("inf") if n is None else n * g.dtype.size for n, g in zip(elements, present)],
                                self.bucket_bytes)

        def reduce(tensors):
            return [self.hvd.allreduce(tensors[0], **kw)] if len(tensors) == 1 else \
                self.hvd.grouped_allreduce(tensors, **kw)
        return reduce_in_buckets(grads, plan, reduce)


def summed_votes(hvd, vote):
    """Every rank's stop vote summed in an allreduce of its own."""
    return hvd.allreduce(vote, op=hvd.Sum, name=horovod_op_name("stop_votes"))


class HorovodAgreement(Agreement):
    """How ring ranks agree on a sum, a gather or a broadcast: Horovod's own collectives."""

    def __init__(self, hvd):
        self.hvd, self.rank, self.size = hvd, hvd.rank(), hvd.size()
        self._hosts = None

    def sum(self, values):
        import tensorflow as tf
        # Horovod: one small allreduce for a log line or the test counts, not one per step.
        return [float(v) for v in self.hvd.allreduce(tf.constant(values, tf.float64), op=self.hvd.Sum).numpy()]

    def gather(self, obj, gone=frozenset):
        return self.hvd.allgather_object(obj)

    def broadcast(self, obj):
        return self.hvd.broadcast_object(obj, root_rank=0)

    def broadcast_variables(self, variables):
        # Horovod: every rank starts from rank 0's weights and optimizer state.
        self.hvd.broadcast_variables(variables, root_rank=0)

    def hosts(self):
        if self._hosts is None:
            import socket
            self._hosts = self.hvd.allgather_object(socket.gethostname())
        return self._hosts
