"""The one training loop. Every mode calls it; it owns everything that is
not distribution:

- step timing and the JSON summary;
- the loss window, the log lines, the progress bar, TensorBoard scalars;
- checkpoints: cadence, --resume, falling back past an unreadable newest
  one, a full disk (workloads/checkpoints.py);
- where training ends (--steps, --epochs, from where it resumed);
- the non-finite policy, --on-nan stop|skip;
- stall detection counted in training steps (workloads/stall.py);
- --straggler, --snapshot-every, the final evaluation, --dump-weights.

A mode supplies only what is its own, as one object (workloads/mode.py):
how its replicas are built and placed, what one step runs, its batches, how
its processes agree and where training resumes from. It makes that object in
its own recipe and hands it over: ringtrain/train.py still reads top to
bottom like Horovod's own examples.
"""
import collections
import sys
import time

import numpy as np

from ringtrain.common.errors import EXIT_PREEMPTED, EXIT_STOPPED, Preempted, TrainingStopped
from ringtrain.workloads import snapshots as snapshots_
from ringtrain.workloads.checkpoints import Checkpoints, Progress
from ringtrain.workloads.console import Console
from ringtrain.workloads.evaluation import Evaluation, evaluate
from ringtrain.workloads.mode import Deferred, StragglerWait
from ringtrain.workloads.outputs import parent_made
from ringtrain.workloads.preemption import PREEMPTION, StopAgreement
from ringtrain.workloads.scalars import Scalars
from ringtrain.workloads.sources import synthetic_note
from ringtrain.workloads.stall import StallWatchdog
from ringtrain.workloads.straggler import Slowdown, summary_fields
from ringtrain.workloads.summary import StepTimer, build_summary
from ringtrain.workloads.tfenv import float16_note


# TF's errors when a task a step or a save depends on is gone or frozen (OutOfRangeError:
# a queue the chief owns, such as sync PS's tokens, was closed as the chief ended)
LOST_PEER_ERRORS = ("UnavailableError", "AbortedError", "DeadlineExceededError", "CancelledError",
                    "OutOfRangeError")


class Training:
    """One run of training, of one mode (a workloads.mode.Mode)."""

    def __init__(self, config, dataset, mode, restore=True):
        """restore: whether the chief restores --resume's checkpoint as the run
        starts (an elastic world goes on from its committed state instead)."""
        missing = [name for name in mode.REQUIRED if not hasattr(mode, name)]
        assert not missing, f"{type(mode).__name__} does not set {missing} (workloads/mode.py)"
        self.config, self.dataset, self.mode, self.restores = config, dataset, mode, restore
        self.identity, self.agree = mode.identity, mode.agree
        self.chief = self.agree.rank == 0
        self.checkpoints = Checkpoints(config.loop.checkpoint_dir if self.chief else None, mode.store,
                                       config.loop.checkpoint_every, config.loop.resume)
        self.console = Console(enabled=self.identity.speaks, prefix=self.identity.prefix,
                               bar=None if self.chief else False)
        # A loop step's share of an epoch: one worker's batch where this process schedules
        # every worker's steps one at a time (the TF2 coordinator), else a batch of each.
        self.per_epoch = mode.steps_per_epoch * mode.scheduled
        self.step_workers = self.identity.workers // mode.scheduled

    def restore(self):
        """The chief's restored progress (--resume), or None: a fresh start, or a
        store that keeps the position in the graph. Others get None."""
        return self.checkpoints.resume() if self.chief else None

    def total_steps(self, start):
        """Where training ends, in loop steps: --steps (each worker's), or the
        end of the last epoch from `start` (a Progress)."""
        c, b = self.config.loop, self.config.data.per_update
        if c.steps:
            return c.steps * self.mode.scheduled
        return start.step + (c.epochs - start.epoch) * self.per_epoch - start.batches_done(self.step_workers, b)

    def progress_at(self, number, where):
        """The Progress a checkpoint at step `number` records, `where` (epoch, batches of it done)."""
        return Progress.at(number, *where, self.per_epoch, self.step_workers, self.config.data.per_update)

    def run(self):
        """Train from where the mode resumes to the last step, then finish the
        run. Returns the summary on the chief; after a scheduler's signal,
        raises Preempted once the checkpoint of the agreed step is written."""
        restored = self.restore() if self.restores else None
        try:
            with self.mode.session():
                summary = self._run_from(self.mode.start(restored))
        except Preempted:
            self.mode.close()
            raise
        self.mode.close()
        return summary

    def _run_from(self, start):
        mode, c = self.mode, self.config.loop
        total = self.total_steps(start)
        self.console.begin(f"{self.identity.prog}: {self.config.model.name} on "
                           f"{self.dataset.describe(self.identity.workers)}, {self.describe_step()}"
                           f"{mode.describe}{', ' if mode.describe else ''}{mode.steps_per_epoch} steps/epoch, "
                           f"steps {start.step}..{total}")
        for note in (synthetic_note(self.dataset, self.config.model.name),
                     float16_note(self.config.model.precision, self.identity.device)):
            if note:
                self.console.line(note)
        watchdog = StallWatchdog(self.agree, c.stall_timeout, self.identity.prog, mode.topology)
        if watchdog.describe():
            self.console.line(watchdog.describe())
        watchdog.start()
        PREEMPTION.defer()  # (a signal from here on stops training at an agreed step)
        try:
            return self._train(watchdog, _LoopState(self, total, start))
        except Exception as e:
            if type(e).__name__ in LOST_PEER_ERRORS:
                watchdog.explain(e)  # a task this one depends on is gone: the watchdog names it
            raise
        finally:
            watchdog.close()

    def _train(self, watchdog, state):
        mode, c = self.mode, self.config.loop
        in_step = mode.straggler is StragglerWait.IN_STEP
        slowdown = Slowdown(c.straggler if mode.straggler is StragglerWait.IN_LOOP else None,
                            self.identity.local_workers[0])
        pending, stop = collections.deque(), StopAgreement(self.agree)
        state.snapshots.start_clock()
        wall_start = time.perf_counter()
        for epoch, done_in_epoch, batch in mode.batches(state.start):
            if state.finished() or state.stopped:
                break
            number = state.started = state.started + 1
            factors = ([c.straggler.extra(w, number) if c.straggler else 0.0 for w in self.identity.local_workers]
                       if in_step else None)
            with slowdown.step(number):  # --straggler, where this process's own loop waits
                result = mode.step(number, batch, factors)
            pending.append((number, (epoch, done_in_epoch), result))
            while len(pending) > mode.lag:
                state.finish_step(watchdog, *pending.popleft())
            # a signal: every process stops after the same step
            state.stopped = stop.stop_after(number, result if not isinstance(result, Deferred) else None)
        while pending:
            state.finish_step(watchdog, *pending.popleft())
        if state.stopped:
            mode.on_stop()
        wall_seconds = time.perf_counter() - wall_start
        watchdog.training_done()
        return self._finish(watchdog, state, slowdown, wall_seconds)

    def _finish(self, watchdog, state, slowdown, wall_seconds):
        """The evaluation, every process's report, the final checkpoint and the
        summary; after a signal, no evaluation, and Preempted once all is written."""
        mode, c = self.mode, self.config.loop
        evaluation = Evaluation() if state.stopped else self._evaluate()
        waits = state.waited + slowdown.waited
        mine = dict(state.timer.report(), waited_per_worker=waits.tolist(), loss_sum=state.losses.last_sum,
                    loss_count=state.losses.last_count, skipped_steps=state.skipped, rank=self.agree.rank,
                    loss_scale_skips=state.overflows,
                    device=self.identity.device, **mode.report())
        reports = self.agree.gather(mine, gone=watchdog.gone)
        watchdog.close()  # (before the final checkpoint: a slow disk is no stall)
        if c.dump_weights:
            np.savez(parent_made(c.dump_weights.format(rank=self.agree.rank)), *[value for _, value in mode.weights()])
        if reports is None:
            return self.preempted(state, None) if state.stopped else None
        reports = sorted(reports, key=lambda r: r["rank"])
        own = mode.summary_fields(reports)
        steps = own.pop("steps", state.update)  # (a PS job's updates, once every worker has reported)
        final = state.final_checkpoint(steps)
        if state.stopped:
            final = self.say_stopped(final, steps)
        if evaluation.samples:
            state.scalars.write(state.update, {"test/accuracy": evaluation.accuracy, "test/loss": evaluation.loss})
        state.scalars.close()
        count = sum(r["loss_count"] for r in reports)
        shared = dict(hosts=[r["host"] for r in reports], worker_devices=[r["device"] for r in reports],
                      checkpoint=final or self.checkpoints.latest,
                      skipped_steps=max(r["skipped_steps"] for r in reports),
                      **data_fields(self.config, self.dataset, reports),
                      **summary_fields(c.straggler, [w for r in reports for w in r["waited_per_worker"]]))
        summary = build_summary(
            self.identity.name, self.config, self.dataset, world_size=self.identity.workers, steps=steps,
            epochs=steps * state.samples_per_update / (self.per_epoch * self.step_workers * self.config.data.per_update),
            # (a non-finite loss crossed strict JSON as null: it is still not a number)
            train_loss=sum(float("nan") if r["loss_sum"] is None else r["loss_sum"] for r in reports) / count
            if count else None,
            evaluation=evaluation, wall_seconds=wall_seconds, reports=reports,
            **dict(shared, **own, **self.stop_fields(state, steps)))  # (a mode's own fields win)
        self.console.finish(summary, c.summary_json)
        return self.preempted(state, final) if state.stopped else summary

    @staticmethod
    def stop_fields(state, steps):
        if not state.stopped:
            return {}
        return {"stopped": {"signal": PREEMPTION.signal, "step": steps}}

    def say_stopped(self, final, steps):
        """After a signal, the checkpoint of the agreed step written: the chief's one
        line, at once (mpirun gives its ranks a second between SIGTERM and SIGKILL).
        Processes in lockstep wait for the chief's save first: a launcher that saw
        one of them leave would end the chief in its save. Returns the checkpoint."""
        if self.agree.in_lockstep and self.agree.size > 1:
            final = self.agree.broadcast(final)
        if self.chief:
            where = f"by {PREEMPTION.signal}" if PREEMPTION.requested else "by a signal to another process of the job"
            what = (f"checkpoint {final} written: run the same command with --resume to go on" if final else
                    "no --checkpoint-dir, so nothing was saved: a rerun starts over")
            sys.stderr.write(f"{self.identity.prog}: stopped {where} after step {steps}, agreed by every "
                             f"{self.identity.worker_word}; {what} (exit {EXIT_PREEMPTED if final else EXIT_STOPPED})\n")
            sys.stderr.flush()
        return final

    def preempted(self, state, final):
        """Training stopped on a signal, all written: every process leaves (common/errors.Preempted)."""
        raise Preempted(saved=bool(final), chief=self.chief)

    def describe_step(self):
        """The first line's account of one update: its micro-batches, its precision."""
        d, m = self.config.data, self.config.model
        parts = ([f"{d.accumulate} micro-batches of {d.batch_size} per update"] if d.accumulate > 1 else []) + \
            ([m.precision + (" (loss scaled)" if m.loss_scaled else "")] if m.precision != "float32" else [])
        return "".join(p + ", " for p in parts)

    def stop_on_non_finite(self, number, result):
        """A step whose gradients were not finite (its update was not applied):
        with --on-nan skip, say so and go on; else stop, the chief saying in one
        line where, on which workers, and what to resume from."""
        if self.config.loop.on_nan == "skip":
            self.console.line(f"step {number}: non-finite gradients; update skipped (--on-nan skip)")
            return
        mine = list(result.broke) or (list(self.identity.local_workers) if not np.isfinite(float(result.loss_sum))
                                      else [])
        # Workers that apply one update together reached this step together: every one names those
        # whose loss broke.
        together = self.agree.in_lockstep and self.mode.identical_updates
        broke = sorted(w for ws in self.agree.gather(mine) for w in ws) if together else mine
        word = self.identity.worker_word
        who = f"{word}(s) {broke}" if broke else f"every {word} (loss finite, gradients not)"
        latest = self.checkpoints.last_good if self.chief else None
        resume = (f"the last good checkpoint is {latest}: resume with --resume and a lower --lr"
                  if latest else "no checkpoint was written yet (--checkpoint-dir)")
        raise TrainingStopped(f"non-finite loss at step {number} on {who}; training stopped before "
                              f"applying it, {resume}, or pass --on-nan skip",
                              quiet=together and not self.chief)

    def _evaluate(self):
        """The test split, each process its share, the counts summed over them."""
        metrics, share = self.mode.evaluate, self.agree.evaluation_share()
        mine = evaluate(metrics, self.dataset, *share, threads=self.config.data.threads) if metrics and share \
            else Evaluation()
        if not metrics:
            return mine
        correct, loss_sum, samples = self.agree.over_processes([mine.correct, mine.loss_sum, mine.samples])
        return Evaluation(correct, loss_sum, int(samples))


class _LoopState:
    """What the loop keeps between steps (one instance per run)."""

    def __init__(self, training, total, start):
        c, mode = training.config.loop, training.mode
        self.training, self.mode, self.total, self.start = training, mode, total, start
        self.started = self.done = start.step  # steps started, and finished
        self.stopped = False  # every process agreed to stop on a signal
        self.update, self.where, self.seen, self.skipped, self.overflows = start.step, None, 0.0, 0, 0
        self.samples_per_update = mode.samples_per_update or training.step_workers * training.config.data.per_update
        self.timer, self.losses = StepTimer(c.warmup_steps), LossWindow(training.agree)
        self.scalars = Scalars(c.log_dir if training.chief else None)
        self.snapshots = snapshots_.Snapshots(c.snapshot_dir if training.chief else None, c.snapshot_every)
        self.waited = np.zeros(len(training.identity.local_workers))

    def finished(self):
        return (self.update if self.mode.until_updates else self.started) >= self.total

    def finish_step(self, watchdog, number, where, result):
        t, c = self.training, self.training.config.loop
        result = result.resolve() if isinstance(result, Deferred) else result
        self.done, self.where = number, where
        self.update = int(result.update) if result.update is not None else number
        if result.overflow:
            self.overflows += 1  # (float16's loss scale halves: no divergence)
        elif not result.applied:
            self.skipped += 1
            t.stop_on_non_finite(number, result)
        self.timer.step_done(float(result.samples), update=result.update)
        watchdog.step_done(number)
        self.losses.add(result.loss_sum, result.samples)
        if result.waited is not None and len(result.waited):
            self.waited += np.asarray(result.waited, float)
        # what the job's weights took in so far: every update's global batch
        self.seen = self.update * self.samples_per_update if result.update is not None else \
            self.seen + (result.job_samples if result.job_samples is not None else float(result.samples))
        # Training ends at the job's update count (sync PS) or at this process's own steps.
        position = self.update if self.mode.until_updates else number
        if number % c.log_every == 0 or position >= self.total:
            self._log(number, where, position, result.update is not None)
        if t.checkpoints.due(self.update):
            self._save()
        if self.snapshots.due(number):
            self.snapshots.take(number, self.seen, self.mode.weights,
                                **({"global_step": self.update} if result.update is not None else {}))
        self.mode.after_step(number, self.training.progress_at(self.update, where))

    def _log(self, number, where, position, counts_updates):
        loss, samples = self.losses.global_mean()
        lr = self.mode.learning_rate(number)
        if self.mode.until_updates:
            text = f"epoch {where[0] + 1} global step {self.update}/{self.total} (this worker's step {number})"
        else:
            text = f"epoch {where[0] + 1} step {number}/{self.total}" + (
                f" global step {self.update}" if counts_updates else "")
        self.training.console.progress(position, self.total, text + f" loss {loss:.4f}"
                                       + (f" lr {lr:.3g}" if lr is not None else ""), samples)
        self.scalars.write(self.update, {"train/loss": loss,
                                         **({"train/learning_rate": lr} if lr is not None else {})})

    def _save(self, number=None):
        number = self.update if number is None else number
        return self.training.checkpoints.save(number, self.training.progress_at(number, self.where))

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
        total, count = self.agree.over_processes([self.loss_sum, self.count])
        if count > 0:
            self.last = total / count
        self.loss_sum = self.count = 0.0
        return self.last, count


def data_fields(config, source, reports):
    """The summary's account of the data and of each update."""
    return dict(data=config.flags.get("data"), data_source=source.where,
                skipped_images=[f"{where}: {why}" for where, why in source.skipped],
                precision=config.model.precision, accumulate=config.data.accumulate,
                loss_scale_skips=max(r.get("loss_scale_skips", 0) for r in reports))
