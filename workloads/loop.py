"""The one training loop. Every mode calls it; it owns everything that is
not distribution:

- step timing and the JSON summary;
- the loss window, the log lines, the progress bar, TensorBoard scalars;
- checkpoints: cadence, --resume, falling back past an unreadable newest
  one, a full disk (workloads/checkpoints.py);
- the non-finite policy, --on-nan stop|skip;
- stall detection counted in training steps (workloads/stall.py);
- --straggler, --snapshot-every, the final evaluation, --dump-weights.

A mode supplies only what is its own: how its replicas are built and
placed, what one step runs (`step(step, batch, straggler) -> StepResult`),
and how its processes agree (an Agreement: `Alone` when one process drives
every worker). It calls the loop from its own recipe, as Hugging Face
accelerate lends a training script its helpers: ringtrain/train.py still
reads top to bottom like Horovod's own examples.
"""
import collections
import socket
import time
from dataclasses import dataclass

import numpy as np

from ringtrain.workloads import snapshots as snapshots_
from ringtrain.workloads.checkpoints import Checkpoints, Progress
from ringtrain.workloads.console import Console
from ringtrain.workloads.errors import TrainingStopped
from ringtrain.workloads.evaluation import Evaluation, evaluate
from ringtrain.workloads.outputs import parent_made
from ringtrain.workloads.scalars import Scalars
from ringtrain.workloads.stall import StallWatchdog
from ringtrain.workloads.straggler import Slowdown, summary_fields
from ringtrain.workloads.summary import StepTimer, build_summary


# TF's errors when a task a step or a save depends on is gone or frozen (OutOfRangeError:
# a queue the chief owns, such as sync PS's tokens, was closed as the chief ended)
LOST_PEER_ERRORS = ("UnavailableError", "AbortedError", "DeadlineExceededError", "CancelledError",
                    "OutOfRangeError")


@dataclass
class StepResult:
    """What one step did, as the process that ran it sees it."""
    loss_sum: float          # weighted loss over the samples this process stepped on
    samples: float           # real samples this process stepped on (all its towers)
    applied: bool = True     # False: its gradients were not finite, and the update was not applied
    update: int = None       # the job's update count after it, where the mode keeps one (a PS global step)
    broke: tuple = ()        # the workers whose loss was not finite, of those this process drives
    waited: tuple = ()       # --straggler seconds waited inside the graph, per worker this process drives
    job_samples: float = None  # samples the job's weights took in with it (default: `samples`)


class Deferred:
    """A step whose result arrives later (a TF2 PS coordinator schedules steps
    on remote workers): resolve() blocks until it has, and returns a StepResult."""

    def __init__(self, resolve):
        self.resolve = resolve


class Alone:
    """How the processes of a mode agree, when one process drives every worker
    (towers, the in-graph client, the TF2 coordinator): nobody to agree with."""
    rank, size, in_lockstep = 0, 1, True

    def sum(self, values):
        return [float(v) for v in values]

    def gather(self, obj, gone=None):
        return [obj]

    def broadcast(self, obj):
        return obj

    def hosts(self):
        return [socket.gethostname()]

    def evaluation_share(self):
        """(share, of how many): this process's part of the test split; None: no part."""
        return 0, 1


@dataclass
class Mode:
    """What the loop needs to know of a mode, besides its step."""
    name: str                       # the summary's "mode"
    prog: str                       # the command, for its messages
    workers: int                    # the job's workers (ranks, PS worker tasks, towers)
    local_workers: tuple = (0,)     # the workers this process drives
    worker_word: str = "worker"     # "rank", "tower": what a user calls them
    speaks: bool = True             # this process logs (the chief adds the bar and the summary)
    prefix: str = ""                # its log lines' prefix
    waits_in_graph: bool = False    # --straggler waits inside the step (the step is given the factors)
    waits_for_all: bool = True      # training stops without any one worker (for the stall watchdog)
    names: object = None            # process rank -> what to call it in a stall message
    servers: tuple = ()             # (who, host:port) of gRPC servers the process depends on: the watchdog pings them
    frozen_candidates: tuple = ()   # more gRPC servers the watchdog asks when nobody steps
    advice: str = "resume with --resume from the last checkpoint"
    samples_per_update: int = 0     # where steps report the job's update count: samples each update applies
    device: str = None              # what this process computes on (workloads.devices.pin_gpu)


class Training:
    """One run of training. A mode makes one, calls resume() before its
    replicas first agree, then run() with its step."""

    def __init__(self, config, mode, dataset, steps_per_epoch, agree=None, store=None):
        self.config, self.mode, self.dataset, self.per_epoch = config, mode, dataset, steps_per_epoch
        self.agree = agree or Alone()
        self.chief = self.agree.rank == 0
        self.checkpoints = Checkpoints(config.loop.checkpoint_dir if self.chief else None, store,
                                       config.loop.checkpoint_every, config.loop.resume)
        self.console = Console(enabled=mode.speaks, prefix=mode.prefix, bar=None if self.chief else False)

    def resume(self):
        """The chief's restored progress (--resume), or None for a fresh start
        or where the mode keeps its position in its graph. Others get None."""
        return self.checkpoints.resume() if self.chief else None

    def total_steps(self, start):
        """Where training ends: --steps, or the end of the last epoch from `start` (a Progress)."""
        c = self.config.loop
        skip = start.batches_done(self.mode.workers, self.config.data.batch_size)
        return c.steps or start.step + (c.epochs - start.epoch) * self.per_epoch - skip

    def run(self, step, batches, *, start=0, total=None, until_updates=False, lag=0, describe="",
            learning_rate=None, metrics=None, read_weights=None, epochs=None, fields=None, after_step=None,
            report=None):
        """Train: call step(number, batch, straggler) for each (epoch, batches
        of that epoch done, batch) of `batches`, until step `total` (with
        until_updates: until the job's update count reaches it), then finish
        the run. `start`: where training stands (a Progress, or a step count);
        `lag`: how many steps a Deferred result may stay unresolved; `learning_rate(step)`: logged
        beside the loss; `metrics(float images, labels) -> (correct, loss
        sum)`: the test evaluation (None: nothing worth evaluating);
        `read_weights() -> [(name, value)]`: for snapshots and
        --dump-weights; `epochs(steps)`: epochs done; `fields(reports)`: the
        mode's own summary fields; `after_step(number, (epoch, batches of it
        done), update)`: after each finished step; `report()`: the mode's own
        fields of this process's end-of-run report. Returns the summary on the chief."""
        c, mode = self.config.loop, self.mode
        position = start if isinstance(start, Progress) else Progress(start)
        start = position.step
        total = self.total_steps(position) if total is None else total
        self.console.begin(f"{mode.prog}: {self.config.model.name} on {self.dataset.source} "
                           f"({len(self.dataset.train_labels)} train, {len(self.dataset.test_labels)} test), "
                           f"{describe}{', ' if describe else ''}{self.per_epoch} steps/epoch, "
                           f"steps {start}..{total}")
        watchdog = StallWatchdog(self.agree, c.stall_timeout, mode.prog, names=mode.names,
                                 waits_for_all=mode.waits_for_all, servers=mode.servers,
                                 frozen_candidates=mode.frozen_candidates, advice=mode.advice)
        if watchdog.describe():
            self.console.line(watchdog.describe())
        watchdog.start()
        try:
            return self._train(step, batches, watchdog, total, until_updates, start, lag, learning_rate, metrics,
                               read_weights, epochs, fields, after_step, report)
        except Exception as e:
            if type(e).__name__ in LOST_PEER_ERRORS:
                watchdog.explain(e)  # a task this one depends on is gone: the watchdog names it
            raise
        finally:
            watchdog.close()

    def _train(self, step, batches, watchdog, total, until_updates, start, lag, learning_rate, metrics,
               read_weights, epochs, fields, after_step, report):
        c, mode = self.config.loop, self.mode
        state = _LoopState(self, total, until_updates, start, learning_rate, read_weights, after_step)
        slowdown = Slowdown(c.straggler, None if mode.waits_in_graph else mode.local_workers[0])
        pending = collections.deque()
        state.snapshots.start_clock()
        wall_start = time.perf_counter()
        for epoch, done_in_epoch, batch in batches:
            if state.finished():
                break
            number = state.started = state.started + 1
            factors = ([c.straggler.extra(w, number) if c.straggler else 0.0 for w in mode.local_workers]
                       if mode.waits_in_graph else None)
            with slowdown.step(number):  # --straggler, where this process's own loop waits
                result = step(number, batch, factors)
            pending.append((number, (epoch, done_in_epoch), result))
            while len(pending) > lag:
                state.finish_step(watchdog, *pending.popleft())
        while pending:
            state.finish_step(watchdog, *pending.popleft())
        wall_seconds = time.perf_counter() - wall_start
        watchdog.training_done()

        evaluation = self._evaluate(metrics)
        waits = state.waited + slowdown.waited
        mine = dict(state.timer.report(), waited_per_worker=waits.tolist(), loss_sum=state.losses.last_sum,
                    loss_count=state.losses.last_count, skipped_steps=state.skipped, rank=self.agree.rank,
                    device=mode.device,
                    **(report() if report else {}))
        reports = self.agree.gather(mine, gone=watchdog.gone)
        watchdog.close()  # (before the final checkpoint: a slow disk is no stall)
        if c.dump_weights and read_weights:
            np.savez(parent_made(c.dump_weights.format(rank=self.agree.rank)),
                     *[value for _, value in read_weights()])
        if reports is None:
            return None
        reports = sorted(reports, key=lambda r: r["rank"])
        own = fields(reports) if fields else {}
        steps = own.pop("steps", state.update)  # (a PS job's updates, once every worker has reported)
        final = state.final_checkpoint(steps)
        if evaluation.samples:
            state.scalars.write(state.update, {"test/accuracy": evaluation.accuracy, "test/loss": evaluation.loss})
        state.scalars.close()
        count = sum(r["loss_count"] for r in reports)
        shared = dict(hosts=[r["host"] for r in reports], worker_devices=[r["device"] for r in reports],
                      checkpoint=final or self.checkpoints.latest,
                      skipped_steps=max(r["skipped_steps"] for r in reports),
                      **summary_fields(c.straggler, [w for r in reports for w in r["waited_per_worker"]]))
        summary = build_summary(
            mode.name, self.config, self.dataset, world_size=mode.workers, steps=steps,
            epochs=epochs(steps) if epochs else steps / self.per_epoch,
            # (a non-finite loss crossed strict JSON as null: it is still not a number)
            train_loss=sum(float("nan") if r["loss_sum"] is None else r["loss_sum"] for r in reports) / count
            if count else None,
            evaluation=evaluation, wall_seconds=wall_seconds, reports=reports,
            **dict(shared, **own))  # (a mode's own fields win)
        self.console.finish(summary, c.summary_json)
        return summary

    def stop_on_non_finite(self, number, result):
        """A step whose gradients were not finite (its update was not applied):
        with --on-nan skip, say so and go on; else stop, the chief saying in one
        line where, on which workers, and what to resume from."""
        if self.config.loop.on_nan == "skip":
            self.console.line(f"step {number}: non-finite gradients; update skipped (--on-nan skip)")
            return
        mine = list(result.broke) or (list(self.mode.local_workers) if not np.isfinite(float(result.loss_sum))
                                      else [])
        # Workers in lockstep reached this step together: every one names those whose loss broke.
        broke = sorted(w for ws in self.agree.gather(mine) for w in ws) if self.agree.in_lockstep else mine
        word = self.mode.worker_word
        who = f"{word}(s) {broke}" if broke else f"every {word} (loss finite, gradients not)"
        latest = self.checkpoints.last_good if self.chief else None
        resume = (f"the last good checkpoint is {latest}: resume with --resume and a lower --lr"
                  if latest else "no checkpoint was written yet (--checkpoint-dir)")
        raise TrainingStopped(f"non-finite loss at step {number} on {who}; training stopped before "
                              f"applying it, {resume}, or pass --on-nan skip",
                              quiet=self.agree.in_lockstep and not self.chief)

    def _evaluate(self, metrics):
        """The test split, each process its share, the counts summed over them."""
        share = self.agree.evaluation_share()
        mine = evaluate(metrics, self.dataset, *share) if metrics and share else Evaluation()
        if not metrics:
            return mine
        correct, loss_sum, samples = self.agree.sum([mine.correct, mine.loss_sum, mine.samples])
        return Evaluation(correct, loss_sum, int(samples))


class _LoopState:
    """What the loop keeps between steps (one instance per run)."""

    def __init__(self, training, total, until_updates, start, learning_rate, read_weights, after_step):
        c = training.config.loop
        self.training, self.total, self.until_updates = training, total, until_updates
        self.learning_rate, self.read_weights, self.after_step = learning_rate, read_weights, after_step
        self.started = self.done = start  # steps started, and finished
        self.update, self.where, self.seen, self.skipped = start, None, 0.0, 0
        self.timer, self.losses = StepTimer(c.warmup_steps), LossWindow(training.agree)
        self.scalars = Scalars(c.log_dir if training.chief else None)
        self.snapshots = snapshots_.Snapshots(c.snapshot_dir if training.chief else None, c.snapshot_every)
        self.waited = np.zeros(len(training.mode.local_workers))

    def finished(self):
        return (self.update if self.until_updates else self.started) >= self.total

    def finish_step(self, watchdog, number, where, result):
        t, c = self.training, self.training.config.loop
        result = result.resolve() if isinstance(result, Deferred) else result
        self.done, self.where = number, where
        self.update = int(result.update) if result.update is not None else number
        if not result.applied:
            self.skipped += 1
            t.stop_on_non_finite(number, result)
        self.timer.step_done(float(result.samples), update=result.update)
        watchdog.step_done(number)
        self.losses.add(result.loss_sum, result.samples)
        if result.waited is not None and len(result.waited):
            self.waited += np.asarray(result.waited, float)
        # what the job's weights took in so far: every update's global batch
        self.seen = self.update * t.mode.samples_per_update if result.update is not None else \
            self.seen + (result.job_samples if result.job_samples is not None else float(result.samples))
        last = self.update >= self.total if self.until_updates else number >= self.total
        if number % c.log_every == 0 or last:
            loss, samples = self.losses.global_mean()
            lr = f" lr {self.learning_rate(number):.3g}" if self.learning_rate else ""
            t.console.progress(number, self.total, f"epoch {where[0] + 1} step {number}/{self.total}"
                               + (f" global step {self.update}" if result.update is not None else "")
                               + f" loss {loss:.4f}{lr}", samples)
            self.scalars.write(self.update, {"train/loss": loss, **(
                {"train/learning_rate": self.learning_rate(number)} if self.learning_rate else {})})
        if t.checkpoints.due(self.update):
            self._save()
        if self.snapshots.due(number) and self.read_weights:
            self.snapshots.take(number, self.seen, self.read_weights,
                                **({"global_step": self.update} if result.update is not None else {}))
        if self.after_step:
            self.after_step(number, where, self.update)

    def _save(self, number=None):
        t = self.training
        number = self.update if number is None else number
        return t.checkpoints.save(number, Progress.at(number, *self.where, t.per_epoch, t.mode.workers,
                                                      t.config.data.batch_size))

    def final_checkpoint(self, steps):
        """The chief's checkpoint at the end (numbered by the job's steps), if it trained at all."""
        if self.training.checkpoints.directory and self.where is not None:
            return self._save(steps)
        return None


class LossWindow:
    """This process's weighted-loss sum and sample count since the last log
    line; global_mean() sums them over the processes (one small collective
    per log line, not per step)."""

    def __init__(self, agree):
        self.agree = agree
        self.loss_sum = self.count = 0.0
        self.last, self.last_sum, self.last_count = None, 0.0, 0.0

    def add(self, loss_sum, count):
        self.loss_sum += float(loss_sum)
        self.count += float(count)

    def global_mean(self):
        """(mean loss over the samples of every process since the last call, those samples)."""
        self.last_sum, self.last_count = self.loss_sum, self.count
        total, count = self.agree.sum([self.loss_sum, self.count])
        if count > 0:
            self.last = total / count
        self.loss_sum = self.count = 0.0
        return self.last, count
