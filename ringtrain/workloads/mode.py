"""The seam between the shared loop (workloads/loop.py) and the modes: what
a mode supplies, and nothing else.

Modes differ in how they build and place their replicas, what one step runs,
which batches each process reads, how their processes agree and where a run
resumes from. Everything else (timing, logs, checkpoints, --on-nan, the stall
watchdog, --straggler, snapshots, the evaluation, the summary) is the loop's,
and the loop never asks which mode it runs. As PyTorch Lightning's
`Strategy` lends its one `fit` loop setup, reduction and barriers, and
`tf.distribute.Strategy` lends a custom loop `run` and `reduce`, a mode lends
the loop one `Mode` object:

    run = loop.Training(config, dataset, mode)
    summary = run.run()

- `Agreement`: how the processes agree: a broadcast from the chief, a gather
  to it, a sum over processes in lockstep. About the collective subset
  Lightning's strategies and tf.distribute offer a loop.
- `Topology`: who the processes are, as the stall watchdog needs them.
- `Mode`: the protocol itself: what the run is (its identity), and the
  methods the loop calls: session(), start(), batches(), step(), and a few
  that read the model for the end of the run.
"""
import abc
import contextlib
import socket
from dataclasses import dataclass
from enum import Enum


class Agreement(abc.ABC):
    """How the processes of one run agree. Every process of the run makes the
    same calls in the same order. `in_lockstep`: every process runs every step,
    so a collective between steps meets every peer (ring ranks); processes that
    step on their own (between-graph PS workers) only broadcast at the start and
    gather at the end."""
    rank: int = 0
    size: int = 1
    in_lockstep: bool = True

    @abc.abstractmethod
    def broadcast(self, obj):
        """The chief's (rank 0's) obj, on every process."""

    @abc.abstractmethod
    def gather(self, obj, gone=frozenset):
        """Every process's obj, in rank order, on the chief; on the others too
        where the processes are in lockstep, else None there. `gone()`: the
        ranks not to wait for (dead or frozen), where processes step on their own."""

    @abc.abstractmethod
    def hosts(self):
        """Every process's host name, in rank order."""

    def sum(self, values):
        """Each of `values` summed over the processes; in lockstep only."""
        raise NotImplementedError(f"{type(self).__name__}: processes that step on their own cannot sum between "
                                  "steps")

    def stop_raised(self, mine):
        """Whether any process of the run was sent a scheduler's signal (`mine`:
        this one was), where the processes do not step together: a flag each
        raises and reads. One process alone: its own."""
        if self.size > 1:
            raise NotImplementedError(f"{type(self).__name__}: a stop flag its processes share")
        return mine

    def over_processes(self, values):
        """`values` summed over the processes where they are in lockstep; where
        each steps on its own, this process's own (it speaks for itself)."""
        return self.sum(values) if self.in_lockstep else [float(v) for v in values]

    def evaluation_share(self):
        """(share, of how many) of the test split this process evaluates, or
        None: a share each in lockstep, else the chief evaluates it all."""
        if self.in_lockstep:
            return self.rank, self.size
        return (0, 1) if self.rank == 0 else None


class Alone(Agreement):
    """One process drives every worker (towers, the in-graph client, the TF2
    coordinator): nobody to agree with."""

    def broadcast(self, obj):
        return obj

    def gather(self, obj, gone=frozenset):
        return [obj]

    def hosts(self):
        return [socket.gethostname()]

    def sum(self, values):
        return [float(v) for v in values]


@dataclass(frozen=True)
class Topology:
    """Who the processes of a run are, as the stall watchdog needs to know them."""
    names: object = None            # rank -> what to call that process in a message ("rank 1 (h2)")
    waits_for_all: bool = True      # training stops without any one worker
    servers: tuple = ()             # (who, "host:port") of gRPC servers the process depends on: pinged
    frozen_candidates: tuple = ()   # more gRPC servers asked when nobody steps
    advice: str = "resume with --resume from the last checkpoint"  # how to go on after the job ended

    def name(self, rank):
        return self.names(rank) if self.names else f"rank {rank}"


class StragglerWait(Enum):
    """Where --straggler's wait happens (workloads/straggler.py holds the one policy)."""
    IN_LOOP = "the loop sleeps after this process's own step"
    IN_STEP = "the step waits in its graph, by the factors the loop hands it, per worker it drives"
    ON_WORKERS = "each remote worker waits in its own graph, by the same policy"


@dataclass(frozen=True)
class Identity:
    """What a run is, as the loop, its messages and its summary name it."""
    name: str                       # the summary's "mode"
    prog: str                       # the command, for its messages
    workers: int                    # the job's workers (ranks, PS worker tasks, towers)
    local_workers: tuple = (0,)     # the workers this process drives
    worker_word: str = "worker"     # "rank", "tower": what a user calls them
    speaks: bool = True             # this process logs (the chief adds the bar and the summary)
    prefix: str = ""                # its log lines' prefix
    device: str = None              # what this process computes on (workloads.devices.pin_gpu)


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
    overflow: bool = False   # not applied because float16's loss scale overflowed (the scale halves): not divergence
    stop_votes: float = None  # where the step's own collectives agree on a stop: the processes asked to stop


class Deferred:
    """A step whose result arrives later (a TF2 PS coordinator schedules steps
    on remote workers): resolve() blocks until it has, and returns a StepResult."""

    def __init__(self, resolve):
        self.resolve = resolve


class Mode(abc.ABC):
    """What a mode supplies to the loop. A mode sets the attributes it must
    (`REQUIRED`) and implements the abstract methods; the rest have defaults.

    identity: what the run is (Identity).
    agree: how its processes agree (an Agreement; Alone where one process drives every worker).
    store: how its checkpoints are written (workloads.checkpoints: ObjectStore, GraphStore).
    steps_per_epoch: updates of one worker's shard of an epoch (each K micro-batches, --accumulate K).
    topology: who its processes are, for the stall watchdog (Topology).
    straggler: where --straggler waits (StragglerWait).
    scheduled: workers whose steps this process schedules one at a time (the TF2
        coordinator: each loop step is one worker's); 1 where a loop step is a step of
        every worker this process drives.
    until_updates: training ends when the job's update count (steps' `update`)
        reaches the total, not this process's own steps (sync PS).
    identical_updates: every process applies the same update each step, so a
        non-finite one is every process's at once (not so with ring mode's
        --no-allreduce, where each rank applies its own gradients).
    samples_per_update: samples one update applies (default: a global batch).
    lag: steps a Deferred result may stay unresolved.
    describe: the run's first line's account of its workers.
    """
    REQUIRED = ("identity", "agree", "store", "steps_per_epoch")
    topology = Topology()
    straggler = StragglerWait.IN_LOOP
    scheduled = 1
    until_updates = False
    identical_updates = True
    samples_per_update = None
    lag = 0
    describe = ""
    evaluate = None  # f(float images, labels) -> (correct, loss sum) of a test batch; None: nothing worth it

    def session(self):
        """What training runs inside, entered after the chief chose its checkpoint
        (a graph mode's MonitoredSession); by default nothing."""
        return contextlib.nullcontext()

    @abc.abstractmethod
    def start(self, restored):
        """Where training resumes from (a checkpoints.Progress), given what the
        chief restored (its Progress, or None: a fresh start, or a store that
        keeps the position in the graph). Every process gets there alike: the
        replicas agree on their weights here."""

    @abc.abstractmethod
    def batches(self, start):
        """(epoch, batches of that epoch done after this one, batch), from `start` on, without end."""

    @abc.abstractmethod
    def step(self, number, batch, straggler):
        """Run step `number` (from 1) on `batch`; `straggler`: with
        StragglerWait.IN_STEP, how many times its compute each worker this
        process drives waits after it. Returns a StepResult or a Deferred."""

    @abc.abstractmethod
    def weights(self):
        """[(name, value)] of the model's variables: snapshots and --dump-weights."""

    def say(self, text):
        """One line of this process's own, before training starts (what it
        restores, what it waits for), as the loop's lines are written."""
        from ringtrain.workloads.console import Console
        Console(enabled=self.identity.speaks, prefix=self.identity.prefix, bar=False).line(text)

    def learning_rate(self, number):
        """The lr of step `number`, for the log; None: not logged."""
        return None

    def summary_fields(self, reports):
        """The mode's own summary fields, from every process's report (rank order)."""
        return {}

    def report(self):
        """This process's own fields of its end-of-run report."""
        return {}

    def on_stop(self):
        """Training stops early on a signal, at this process's agreed step: free
        what may hold another process in the middle of its step (sync PS: tokens)."""

    def close(self):
        """After training, done or stopped by a signal, out of its session: what the
        mode does last (a PS chief tells its server tasks that training is over)."""

    def after_step(self, number, progress):
        """After each finished step `number`; `progress`: where training stands
        after it (a checkpoints.Progress: the job's update count, its epoch and
        the samples into it), as a checkpoint there would record it."""
