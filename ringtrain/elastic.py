"""`ringtrain --elastic`: ring training that goes on when ranks go away or
come, under horovodrun's elastic mode:

    horovodrun --gloo -np 3 --min-np 2 --max-np 4 --host-discovery-script S ringtrain --elastic ...

Horovod's elastic API (hvd.elastic.run) re-enters `run(state)` after every
change of the world: on a lost rank, from the last commit (`--commit-every
K` steps), on a host added or removed by the discovery script, from the
present step. Everything that depends on the rank count is rebuilt on each
entry: the lr scaling, each rank's data shard (from the same sample
position), and the traced train step (the rank count is a constant in it).
A rank that joins gets the weights, optimizer state and position from rank 0.
"""
import time

import numpy as np

from ringtrain import knobs
from ringtrain.chief import Chief
from ringtrain.train import LossWindow, build, global_evaluation, make_train_step, non_finite_step
from ringtrain.workloads import models, pipeline
from ringtrain.workloads.checkpoints import Progress
from ringtrain.workloads.evaluation import Evaluation
from ringtrain.workloads.outputs import parent_made
from ringtrain.workloads.sharding import steps_per_epoch
from ringtrain.workloads.summary import StepTimer, build_summary
from ringtrain.workloads.tfenv import set_threads


def train(args, dataset):
    knobs.apply_before_init(args)
    import horovod.tensorflow as hvd

    hvd.init()
    set_threads(args.threads)
    model, optimizer = build(args)
    # No collective before the elastic loop: a rank that joins later would meet the
    # others' state sync with it. Rank 0's --resume position and weights reach the
    # others in that sync instead.
    start = Chief(args, model, optimizer, hvd.rank() == 0, None, hvd.size()).restore()
    state = ring_state(hvd, list(model.variables) + list(optimizer.variables), step=start.step,
                       epoch=start.epoch, samples_in_epoch=start.samples_in_epoch, world_sizes=[hvd.size()])
    state.register_reset_callbacks([lambda: state.world_sizes.append(hvd.size())])
    return elastic_run(hvd, run)(state, args, dataset, hvd, model, optimizer)


def ring_state(hvd, variables, **progress):
    """Horovod's elastic state: the variables (weights and optimizer slots)
    and the progress, saved at each commit, restored after a lost rank, and
    sent from rank 0 at every (re)start. (hvd.elastic.TensorFlowState
    broadcasts as it is built, a collective a joining rank must not make, and
    in eager mode not on sync, when a joining rank needs it.)"""
    from horovod.common.elastic import ObjectState

    class State(ObjectState):
        def __init__(self):
            self.variables, self._values = variables, [v.numpy() for v in variables]
            super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **progress)

        def save(self):
            self._values = [v.numpy() for v in self.variables]
            super().save()

        def restore(self):
            for variable, value in zip(self.variables, self._values):
                variable.assign(value)
            super().restore()

        def sync(self):
            hvd.broadcast_variables(self.variables, root_rank=0)
            self._values = [v.numpy() for v in self.variables]
            super().sync()

    return State()


def elastic_run(hvd, func):
    """hvd.elastic.run, also for the failures of grouped allreduces (the
    gradients'), whose op names its own check does not know."""
    import tensorflow as tf
    from horovod.common.elastic import run_fn
    from horovod.common.exceptions import HorovodInternalError

    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as e:
            if "Horovod" in (e.message or ""):
                raise HorovodInternalError(e) from None
            raise

    def reset():
        hvd.shutdown()
        hvd.init()

    return run_fn(wrapper, reset)


def run(state, args, dataset, hvd, model, optimizer):
    """Training from the state's position on, at the present rank count."""
    size, rank = hvd.size(), hvd.rank()
    per_epoch = steps_per_epoch(len(dataset.train_labels), size, args.batch_size)
    lr_at = knobs.learning_rate_schedule(args, size, per_epoch)
    train_step = make_train_step(args, hvd, model, optimizer)  # traced anew: the rank count is in it
    chief = Chief(args, model, optimizer, rank == 0, per_epoch, size)
    progress = Progress(state.step, state.epoch, state.samples_in_epoch)
    chief.console.line(f"elastic: {size} rank(s) from step {progress.step} (epoch {progress.epoch + 1}); "
                       f"committing every {args.commit_every} steps")
    batches = pipeline.batches_from(dataset, rank, size, args.batch_size, args.seed, progress.epoch,
                                    progress.batches_done(size, args.batch_size), args.threads)
    timer, losses, wall_start = StepTimer(args.warmup_steps), LossWindow(), time.perf_counter()
    skipped, step, where = 0, progress.step, (progress.epoch, 0)
    for epoch, done_in_epoch, batch in batches:
        if finished(args, state):
            break
        step = state.step + 1
        optimizer.learning_rate.assign(lr_at(step - 1))
        loss_sum, samples, finite = train_step(*batch)
        if not finite:
            skipped += non_finite_step(args, hvd, chief, step, loss_sum)
        timer.step_done(float(samples))
        losses.add(loss_sum, samples)
        where, at = (epoch, done_in_epoch), Progress.at(step, epoch, done_in_epoch, per_epoch, size, args.batch_size)
        state.step, state.epoch, state.samples_in_epoch = at.step, at.epoch, at.samples_in_epoch
        if step % args.log_every == 0:
            chief.log_step(step, args.steps or args.epochs * per_epoch, epoch, *losses.global_mean(hvd),
                           lr_at(step - 1))
        chief.checkpoint(step, epoch, done_in_epoch)
        if step % args.commit_every == 0:
            state.commit()  # Horovod: a restore point; raises here if hosts were added or removed
    wall_seconds = time.perf_counter() - wall_start

    evaluation = Evaluation() if models.is_simulated(model) else global_evaluation(hvd, model, dataset)
    reports = hvd.allgather_object(timer.report())
    chief.checkpoint(step, *where, final=True)
    summary = build_summary(
        "ring", args, dataset, world_size=size, steps=step, epochs=step / per_epoch, train_loss=losses.last,
        evaluation=evaluation, wall_seconds=wall_seconds, reports=reports, controller="gloo",
        hosts=[r["host"] for r in reports], checkpoint=chief.ckpt.latest, skipped_steps=skipped,
        elastic={"world_sizes": list(state.world_sizes), "commit_every": args.commit_every},
        throughput_measured_at=f"the last {size} rank(s), since the last change of the world")
    chief.console.finish(summary, args.summary_json)
    if args.dump_weights:
        np.savez(parent_made(args.dump_weights.format(rank=rank)), *[v.numpy() for v in model.variables])
    return 0


def finished(args, state):
    return state.step >= args.steps if args.steps else state.epoch >= args.epochs
