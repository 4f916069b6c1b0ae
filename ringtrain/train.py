"""Synchronous data-parallel training over Horovod's ring-allreduce.

Reads top to bottom like Horovod's examples/tensorflow2 scripts; every line
that distribution adds is marked `# Horovod:`. What is not distribution
(logging, checkpoints, the stall watchdog, --straggler, snapshots, the
evaluation and the summary) is the shared loop's (workloads/loop.py), which
this recipe calls with its step.
"""
from ringtrain import knobs
from ringtrain.workloads import loop
from ringtrain.workloads.checkpoints import ObjectStore, Progress
from ringtrain.workloads.horovod_env import allreduce_algorithm_in_effect, horovod_loop_in_effect
from ringtrain.workloads.schedule import learning_rate_schedule
from ringtrain.workloads.sharding import steps_per_epoch
from ringtrain.workloads.straggler import check as check_straggler


def train(config, horovod, dataset):
    """config: the shared workloads.config.RunConfig; horovod: ringtrain.cli.HorovodConfig."""
    knobs.apply_before_init(horovod)  # MPI yield, fusion buffer, cycle time, timeline: read by hvd.init
    import horovod.tensorflow as hvd
    from ringtrain.workloads.devices import pin_gpu
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
    if horovod.elastic:
        from ringtrain import elastic
        return elastic.train(hvd, config, horovod, dataset, model, optimizer, train_on_this_world, device)

    run = training(hvd, config, horovod, dataset, model, optimizer, device=device)
    # Horovod: every rank starts from rank 0's weights, optimizer state and progress.
    progress = hvd.broadcast_object(run.resume(), root_rank=0) or Progress()
    hvd.broadcast_variables(list(model.variables) + list(optimizer.variables), root_rank=0)
    train_on_this_world(hvd, run, horovod, dataset, model, optimizer, progress)
    return 0


def training(hvd, config, horovod, dataset, model, optimizer, **mode):
    """The shared loop, for this world of ranks."""
    host_of = HorovodAgreement(hvd, in_lockstep=not horovod.no_allreduce)
    ring = loop.Mode("ring", "ringtrain", hvd.size(), local_workers=(hvd.rank(),), worker_word="rank",
                     speaks=hvd.rank() == 0, names=lambda r: f"rank {r} ({host_of.hosts()[r]})", **mode)
    return loop.Training(config, ring, dataset, steps_per_epoch(len(dataset.train_labels), hvd.size(),
                                                                config.data.batch_size),
                         agree=host_of, store=ObjectStore(config.loop.keep_checkpoints, model=model,
                                                          optimizer=optimizer))


def train_on_this_world(hvd, run, horovod, dataset, model, optimizer, progress, after_step=None,
                        extra_fields=None):
    """Training from `progress` on, at the present rank count."""
    from ringtrain.workloads import models, pipeline
    from ringtrain.workloads.evaluation import metrics_of
    c = run.config
    # Horovod: the lr grows with the rank count, after a warm-up.
    lr_at = learning_rate_schedule(c.optimizer.lr, hvd.size(), run.per_epoch, scale=horovod.lr_scaling,
                                   warmup_epochs=horovod.warmup_epochs)
    train_step = make_train_step(hvd, horovod, model, optimizer, c.model.statistics_to_average(model))

    def step(number, batch, _):
        optimizer.learning_rate.assign(lr_at(number - 1))
        loss_sum, samples, applied = train_step(*batch)
        return loop.StepResult(loss_sum, samples, bool(applied), job_samples=float(batch[3]))

    # Horovod: each rank reads its own disjoint shard of every epoch.
    batches = pipeline.batches_from(run.dataset, hvd.rank(), hvd.size(), c.data.batch_size, c.data.seed,
                                    progress.epoch, progress.batches_done(hvd.size(), c.data.batch_size),
                                    c.data.threads)
    controller = "mpi" if hvd.mpi_enabled() else "gloo"
    return run.run(
        step, batches, start=progress.step, learning_rate=lambda number: lr_at(number - 1),
        describe=f"{hvd.size()} rank(s) x batch {c.data.batch_size}",
        metrics=metrics_of(model), after_step=after_step,
        read_weights=lambda: models.named_weights(model),
        fields=lambda reports: dict(
            controller=controller, allreduce_algorithm=allreduce_algorithm_in_effect(controller),
            horovod_loop=horovod_loop_in_effect(),
            gradient_bytes=models.gradient_bytes(model),
            **(extra_fields or {})))


def make_train_step(hvd, horovod, model, optimizer, statistics=()):
    import numpy as np
    import tensorflow as tf
    from ringtrain.workloads import models
    from ringtrain.workloads.gradients import apply_if_finite
    from ringtrain.workloads.tfenv import step_function
    # Horovod: fp16 compression and Adasum are options; Average is the default.
    compression = hvd.Compression.fp16 if horovod.fp16_allreduce else hvd.Compression.none
    reduce_op = hvd.Adasum if horovod.adasum else hvd.Average

    @step_function
    def train_step(images, labels, weights, global_count):
        with tf.GradientTape() as tape:
            loss_sum = models.weighted_loss_sum(model, images, labels, weights)
            # Horovod: divide by the global batch's mean per-rank share, not the local
            # count, so that averaging over ranks gives exactly the global batch's gradient.
            loss = loss_sum / (global_count / hvd.size())
        if statistics and not horovod.no_allreduce:
            # Horovod: batch norm's moving statistics, which the forward pass moved towards this
            # rank's batch, averaged over the ranks while backprop runs: every rank holds one model.
            # (One flat tensor: a grouped allreduce of ResNet-50's 106 cost 7-10 % of its step.)
            flat = hvd.allreduce(tf.concat([tf.reshape(v, [-1]) for v in statistics], 0), op=hvd.Average,
                                 name="moving_statistics")
            for variable, mean in zip(statistics, tf.split(flat, [int(np.prod(v.shape)) for v in statistics])):
                variable.assign(tf.reshape(mean, variable.shape))
        if not horovod.no_allreduce:
            # Horovod: each gradient's allreduce starts as soon as backprop produces it.
            tape = hvd.DistributedGradientTape(tape, compression=compression, op=reduce_op)
        grads = tape.gradient(loss, model.trainable_variables)
        # Horovod: after the allreduce every rank holds the same gradients, so every rank
        # applies them, or skips a non-finite update, alike.
        applied = apply_if_finite(optimizer, grads, model.trainable_variables)
        return loss_sum, tf.reduce_sum(weights), applied

    return train_step


class HorovodAgreement:
    """How ring ranks agree on a sum, a gather or a broadcast: Horovod's own collectives."""

    def __init__(self, hvd, in_lockstep=True):
        self.hvd, self.rank, self.size, self.in_lockstep = hvd, hvd.rank(), hvd.size(), in_lockstep
        self._hosts = None

    def sum(self, values):
        import tensorflow as tf
        # Horovod: one small allreduce for a log line or the test counts, not one per step.
        return [float(v) for v in self.hvd.allreduce(tf.constant(values, tf.float64), op=self.hvd.Sum).numpy()]

    def gather(self, obj, gone=None):
        return self.hvd.allgather_object(obj)

    def broadcast(self, obj):
        return self.hvd.broadcast_object(obj, root_rank=0)

    def hosts(self):
        if self._hosts is None:
            import socket
            self._hosts = self.hvd.allgather_object(socket.gethostname())
        return self._hosts

    def evaluation_share(self):
        return self.rank, self.size
