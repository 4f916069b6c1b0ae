"""What Horovod's ring (ringtrain/train.py) and TF's collective all-reduce
(ringtrain/collective.py) share as modes: every worker holds the whole model,
reads its own disjoint shard of every epoch, takes a step on its batch, and
all-reduces the gradients, so that all apply the same update. They differ in
their agreement (whose collectives), their train step and their summary
fields; everything here is the same for both. (Imported before TensorFlow
loads: what imports it is imported where it is used.)"""

from ringtrain.workloads import preemption
from ringtrain.workloads.checkpoints import ObjectStore, Progress
from ringtrain.workloads.evaluation import metrics_of
from ringtrain.workloads.mode import Identity, Mode, StepResult
from ringtrain.workloads.schedule import learning_rate_schedule
from ringtrain.workloads.sharding import updates_per_epoch


class SynchronousMode(Mode):
    """A worker of synchronous data parallelism. `agree` must also
    broadcast_variables(variables) from worker 0; `train_step(images, labels,
    weights, global_count, lr, vote)` (an update's K micro-batches, the step's
    learning rate, this worker's stop vote) returns (loss sum, samples,
    applied, overflowed, every worker's votes summed). The lr and the votes ride
    in the step itself: an eager assignment and a collective of their own
    between steps cost 5-7 % of a 180 ms step here (DEVELOPERS.md 4.15)."""

    def __init__(self, config, dataset, model, optimizer, agree, train_step, identity, schedule, loss_scale=None):
        """identity: workloads.mode.Identity fields (the name, prog, ...);
        schedule: the mode's flags with lr_scaling and warmup_epochs;
        loss_scale: float16's (workloads.gradients.LossScale), checkpointed with the model."""
        self.config, self.dataset, self.model, self.optimizer = config, dataset, model, optimizer
        self.agree, self.train_step = agree, train_step
        rank, size, b, k = agree.rank, agree.size, config.data.batch_size, config.data.accumulate
        self.identity = Identity(workers=size, local_workers=(rank,), speaks=rank == 0, **identity)
        self.store = ObjectStore(config.loop.keep_checkpoints, model=model, optimizer=optimizer,
                                 **(loss_scale.variables() if loss_scale else {}))
        self.steps_per_epoch = updates_per_epoch(dataset, size, b, k)
        self.describe = f"{size} {self.identity.worker_word}(s) x batch {b}"
        # the lr grows with the global batch (N workers x K micro-batches), after a warm-up (Goyal et al., 2017)
        self.lr_at = learning_rate_schedule(config.optimizer.lr, size * k, self.steps_per_epoch,
                                            scale=schedule.lr_scaling, warmup_epochs=schedule.warmup_epochs)
        self.evaluate = metrics_of(model)

    def start(self, restored):
        # every worker starts from worker 0's weights, optimizer state and progress
        progress = self.agree.broadcast(restored) or Progress()
        self.agree.broadcast_variables(list(self.model.variables) + list(self.optimizer.variables))
        return progress

    def batches(self, start):
        from ringtrain.workloads import pipeline
        # each worker reads its own disjoint shard of every epoch
        c = self.config.data
        return pipeline.batches_from(self.dataset, self.agree.rank, self.agree.size, c, start.epoch,
                                     start.batches_done(self.agree.size, c.per_update))

    def step(self, number, batch, straggler):
        import tensorflow as tf
        # (tensors: a tf.function traces again for every new Python float, and converting
        # numpy values in its call took 0.5 ms more of the training thread: DEVELOPERS.md 4.15)
        lr, vote = (tf.constant(v, tf.float32) for v in (self.lr_at(number - 1), preemption.vote()))
        loss_sum, samples, applied, overflow, votes = self.train_step(*batch, lr, vote)
        return StepResult(loss_sum, samples, bool(applied), job_samples=float(batch[3]), overflow=bool(overflow),
                          stop_votes=float(votes))

    def learning_rate(self, number):
        return self.lr_at(number - 1)

    def weights(self):
        from ringtrain.workloads import models
        return models.named_weights(self.model)

    def summary_fields(self, reports):
        from ringtrain.workloads import models
        return {"gradient_bytes": models.gradient_bytes(self.model)}
