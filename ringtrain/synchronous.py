"""What Horovod's ring (ringtrain/train.py) and TF's collective all-reduce
(ringtrain/collective.py) share as modes: every worker holds the whole model,
reads its own disjoint shard of every epoch, takes a step on its batch, and
all-reduces the gradients, so that all apply the same update. They differ in
their agreement (whose collectives), their train step and their summary
fields; everything here is the same for both. (Imported before TensorFlow
loads: what imports it is imported where it is used.)"""
from ringtrain.workloads.checkpoints import ObjectStore, Progress
from ringtrain.workloads.evaluation import metrics_of
from ringtrain.workloads.mode import Identity, Mode, StepResult
from ringtrain.workloads.schedule import learning_rate_schedule
from ringtrain.workloads.sharding import steps_per_epoch


class SynchronousMode(Mode):
    """A worker of synchronous data parallelism. `agree` must also
    broadcast_variables(variables) from worker 0; `train_step(images, labels,
    weights, global_count)` returns (loss sum, samples, applied)."""

    def __init__(self, config, dataset, model, optimizer, agree, train_step, identity, schedule):
        """identity: workloads.mode.Identity fields (the name, prog, ...);
        schedule: the mode's flags with lr_scaling and warmup_epochs."""
        self.config, self.dataset, self.model, self.optimizer = config, dataset, model, optimizer
        self.agree, self.train_step = agree, train_step
        rank, size, b = agree.rank, agree.size, config.data.batch_size
        self.identity = Identity(workers=size, local_workers=(rank,), speaks=rank == 0, **identity)
        self.store = ObjectStore(config.loop.keep_checkpoints, model=model, optimizer=optimizer)
        self.steps_per_epoch = steps_per_epoch(len(dataset.train_labels), size, b)
        self.describe = f"{size} {self.identity.worker_word}(s) x batch {b}"
        # the lr grows with the worker count, after a warm-up (Goyal et al., 2017)
        self.lr_at = learning_rate_schedule(config.optimizer.lr, size, self.steps_per_epoch,
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
        return pipeline.batches_from(self.dataset, self.agree.rank, self.agree.size, c.batch_size, c.seed,
                                     start.epoch, start.batches_done(self.agree.size, c.batch_size), c.threads)

    def step(self, number, batch, straggler):
        self.optimizer.learning_rate.assign(self.lr_at(number - 1))
        loss_sum, samples, applied = self.train_step(*batch)
        return StepResult(loss_sum, samples, bool(applied), job_samples=float(batch[3]))

    def learning_rate(self, number):
        return self.lr_at(number - 1)

    def weights(self):
        from ringtrain.workloads import models
        return models.named_weights(self.model)

    def summary_fields(self, reports):
        from ringtrain.workloads import models
        return {"gradient_bytes": models.gradient_bytes(self.model)}
