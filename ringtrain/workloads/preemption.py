"""A scheduler's signal stops training cleanly, in every mode, at the cost of
at most a step: SIGTERM (SLURM's scancel and KillWait, a Kubernetes eviction,
mpirun's own end), SIGUSR1 (SLURM's early warning: `sbatch --signal`) or
SIGINT (Ctrl-C), reaching every process of the job or only one of them.

- Before training starts, a signal ends the process at once with one line:
  there is nothing to save yet, and a process waiting for its peers (a
  rendezvous) would not notice a request.
- Once training runs, the handler only records the signal. Every few steps
  (about every CHECK_SECONDS) the processes agree whether any of them was
  asked to stop, through the mode's own agreement (a collective where they
  step together, a flag on the PS where each steps on its own), so that all
  of them stop after the same step. The loop finishes that step, the chief
  writes a checkpoint there, one line names the signal and the step, and
  the job exits with EXIT_PREEMPTED (common/errors.py: Preempted).
- A second signal while the checkpoint is written is recorded and ignored:
  the write completes (TensorFlow writes a checkpoint under a temporary name
  and renames it when whole).
"""
import os
import signal
import sys
import time

from ringtrain.common.errors import EXIT_PREEMPTED, exit_now

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
CHECK_SECONDS = 0.2  # how often, in training time, the processes agree on a stop


class Preemption:
    """The signals this process was sent, once its handlers are installed."""

    def __init__(self):
        self.prog, self.signal, self.at, self.training, self._stderr = None, None, None, False, None

    def install(self, prog):
        """At the start of a training command, before anything that may wait."""
        self.prog = prog
        if self._stderr is None:  # (TF's quiet import points fd 2 elsewhere for a while: keep the real one)
            self._stderr = os.dup(2)
        for sig in SIGNALS:
            signal.signal(sig, self._handle)

    def defer(self):
        """From here on a signal is recorded, for the process to act on (the
        loop, once training runs; a server task, from its start). The handlers
        are installed again: a framework may have taken one over since (TF's
        collective mode takes SIGTERM for its own preemption notifier)."""
        self.training = True
        if self.prog:
            self.install(self.prog)

    @property
    def requested(self):
        return self.signal is not None

    def wait(self, seconds):
        """Whether a signal came within `seconds` (at once if one came before)."""
        deadline = time.monotonic() + seconds
        while not self.requested and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.requested

    def _handle(self, signum, frame):
        if self.signal is not None:
            return  # (a second signal, during the stop: the save must complete)
        self.signal, self.at = signal.Signals(signum).name, time.monotonic()
        if not self.training:
            sys.stdout.flush()
            os.write(self._stderr, f"{self.prog}: stopped by {self.signal} before training started: nothing to "
                                   f"save; run the same command again to start (exit {EXIT_PREEMPTED})\n".encode())
            exit_now(EXIT_PREEMPTED)


PREEMPTION = Preemption()


def vote(preemption=PREEMPTION):
    """This process's stop vote for the step it is about to run (1.0: it was
    asked to stop), for a step whose own collectives sum the votes
    (StepResult.stop_votes)."""
    return 1.0 if preemption.requested else 0.0


class StopAgreement:
    """When the processes of a run agree whether any was asked to stop. Where
    the step itself sums every process's vote() in its own collectives (the
    all-reduce modes), after every step, at no cost of its own. Otherwise, in
    lockstep: every step until the chief knows its step time, then every K
    steps, K the steps of about CHECK_SECONDS, which the chief tells the others
    in the same agreement (processes in lockstep must make the collective at
    the same steps). Where each process steps on its own (between-graph PS),
    each raises and reads a flag on its own cadence."""

    def __init__(self, agree, preemption=PREEMPTION):
        self.agree, self.preemption = agree, preemption
        self.next_check, self.every, self.last = 1, 1, None

    def stop_after(self, number, result=None):
        """Whether training stops after step `number` (checked when due);
        `result`: that step's StepResult, whose stop_votes answer where it has them."""
        if result is not None and result.stop_votes is not None:
            return result.stop_votes > 0
        now = time.monotonic()
        step_seconds, self.last = (now - self.last if self.last else None), now
        if number < self.next_check:
            return False
        mine = 1.0 if self.preemption.requested else 0.0
        if self.agree.in_lockstep and self.agree.size > 1:
            proposal = max(1, int(CHECK_SECONDS / step_seconds)) if step_seconds and self.agree.rank == 0 else 0
            raised, every = self.agree.sum([mine, float(proposal)])
            self.every = max(1, int(every))
        else:
            raised = self.agree.stop_raised(bool(mine))
            self.every = max(1, int(CHECK_SECONDS / step_seconds)) if step_seconds else 1
        self.next_check = number + self.every
        return raised > 0
