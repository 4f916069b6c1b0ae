"""One rank of `ringtrain-bench allreduce`, started by mpirun or horovodrun.

    mpirun -np 2 python -m ringtrain.bench.allreduce_worker --impls mpi4py,ring,memcpy --sizes 4096,1048576 --out rank.json
    mpirun -np 2 python -m ringtrain.bench.allreduce_worker --impls horovod --sizes 4096,1048576 --out rank.json
    mpirun -np 2 python -m ringtrain.bench.allreduce_worker --impls tf-collective --sizes 4096,1048576 --out rank.json
    horovodrun --gloo -np 2 -H localhost:2 python -m ringtrain.bench.allreduce_worker --impls horovod ...

Every timed number is the slowest rank's mean time per operation over a trial
of `iters` back-to-back operations, after warm-up operations that are not timed;
several trials per size are kept so that the parent can report a median.
Rank 0 writes the rows as JSON to --out.

Every result is checked, as nccl-tests does: rank r's buffer holds
(r + 1) * (i mod 7 + 1) at element i, so a sum of n ranks is n(n + 1)/2 times
that pattern and an average (n + 1)/2 times it, exactly in float32. After
each trial, each implementation's output is compared with what it must be;
`wrong` counts the elements that were not, over every rank and trial.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

from ringtrain.workloads.summary import interface_bytes

TRIAL_BYTES = 64 << 20  # bytes moved per trial: enough iterations to swamp timer noise
MAX_ITERS, MIN_ITERS = 100, 3


def iterations(nbytes):
    return int(min(MAX_ITERS, max(MIN_ITERS, TRIAL_BYTES // max(nbytes, 1))))


def pattern(count):
    """i mod 7 + 1 at element i: small integers, exact in float32 when summed."""
    return (np.arange(count) % 7 + 1).astype(np.float32)


def filled(count, rank):
    """What rank `rank` allreduces: (rank + 1) times the pattern."""
    return (rank + 1) * pattern(count)


def expected(count, world):
    """The sum every rank must hold after an allreduce of filled() buffers."""
    return (world * (world + 1) / 2 * pattern(count)).astype(np.float32)


def after(previous, allreduce):
    """allreduce() once `previous` (the last one's result) exists: each starts when the
    last ends, as in back-to-back steps. It sums the same input every time, as training
    sums (each rank's loss divided by the global batch), and so its result stays known
    however many ran, where summing the last result would overflow."""
    import tensorflow as tf
    with tf.control_dependencies(tf.nest.flatten(previous)):
        return allreduce()


def wrong_elements(result, want):
    return int(np.count_nonzero(np.asarray(result).reshape(-1) != want))


def time_interleaved(runs, nbytes, trials, warmup, barrier, slowest, mean, total):
    """Per-op seconds of each trial, max over ranks, for several implementations
    taken in turn (a, b, c, a, b, c, ...), so that a burst of load from elsewhere
    hits them alike; the bytes each rank's host sent per operation (mean over
    ranks); and the wrong elements over every rank and trial. runs: {name:
    (run(k), check())}: run performs k back-to-back operations; check() counts
    this rank's wrong elements in the last one's result."""
    iters = iterations(nbytes)
    for run, _ in runs.values():
        run(warmup)
    seconds, sent, wrong = ({name: [] for name in runs}, {name: 0 for name in runs}, {name: 0 for name in runs})
    for _ in range(trials):
        for name, (run, check) in runs.items():
            barrier()
            tx_before, start = interface_bytes()[1], time.perf_counter()
            run(iters)
            elapsed, tx_after = time.perf_counter() - start, interface_bytes()[1]
            seconds[name].append(slowest(elapsed / iters))
            sent[name] += tx_after - tx_before
            wrong[name] += check()  # (after the timing: a check is not an allreduce)
    return (seconds, {name: mean(total_ / (trials * iters)) for name, total_ in sent.items()},
            {name: int(total(count)) for name, count in wrong.items()})


def repeat(op):
    """k calls of op(), keeping the last result."""
    last = []

    def run(k):
        for _ in range(k):
            last[:] = [op()]
        return last[0]
    return run, last


def row(impl, nbytes, seconds, world, iters, wire_bytes, wrong=0, note=""):
    return {"impl": impl, "bytes": int(nbytes), "count": int(nbytes // 4), "dtype": "float32",
            "world_size": world, "iters": iters, "trial_seconds": seconds,
            "wire_bytes_per_op_per_rank": wire_bytes, "wrong": wrong, "note": note}


def mpi_runs(comm, nbytes):
    """Raw MPI_Allreduce, the reference ring and the memory-copy bound, on
    buffers allocated once, as a training loop's gradient buffers are."""
    from mpi4py import MPI
    from ringtrain.bench.ring_reference import ring_allreduce
    count, world = nbytes // 4, comm.Get_size()
    send = filled(count, comm.Get_rank())
    want, out = expected(count, world), {name: np.empty_like(send) for name in ("mpi4py", "ring", "memcpy")}
    runs = {
        "mpi4py": lambda: comm.Allreduce(send, out["mpi4py"], op=MPI.SUM),
        "ring": lambda: ring_allreduce(comm, send, out=out["ring"]),
        # every rank copies at once: the memory system is shared, as it is in an allreduce
        "memcpy": lambda: np.copyto(out["memcpy"], send),
    }
    return {name: (repeat(op)[0], lambda name=name: wrong_elements(out[name], send if name == "memcpy" else want))
            for name, op in runs.items()}


class HorovodRuns:
    """hvd.allreduce as training calls it: in graph mode, k operations chained
    in one tf.function (so TF's per-call dispatch is not charged to the
    allreduce, as it is paid once per training step whatever the step does);
    and eagerly, one Python call per operation, for comparison."""

    def __init__(self, label):
        from ringtrain.workloads.tfenv import import_tensorflow_quietly, set_threads, step_function
        tf = self.tf = import_tensorflow_quietly()
        set_threads(1)
        import horovod.tensorflow as hvd  # (the launch sets the MPI environment ringtrain trains with)
        self.hvd, self.label = hvd, label
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()

        @step_function
        def chained(x, k):
            body = lambda i, v: (i + 1, after(v, lambda: hvd.allreduce(tf.identity(x), op=hvd.Sum, name="bench.graph")))
            out = tf.while_loop(lambda i, v: i < k, body, (tf.constant(0), x))[1]
            return out[:1], out

        @step_function
        def chained_grads(tensors, k):
            def body(i, *grads):
                return (i + 1,) + after(grads, lambda: tuple(hvd.allreduce(tf.identity(g), op=hvd.Sum,
                                                                           name=f"bench.grad{j}")
                                                             for j, g in enumerate(tensors)))
            out = tf.while_loop(lambda i, *grads: i < k, body, (tf.constant(0),) + tuple(tensors))
            return tf.stack([tf.reshape(g, [-1])[0] for g in out[1:]]), out[1:]

        self.chained, self.chained_grads = chained, chained_grads

    def runs(self, nbytes):
        tf, hvd = self.tf, self.hvd
        count, world = nbytes // 4, hvd.size()
        x = tf.constant(filled(count, hvd.rank()))
        total = expected(count, world)
        last = {}

        def graph(k):
            first, last["graph"] = self.chained(x, tf.constant(k))
            return first.numpy()  # (one element: the call has finished, without copying the buffer)
        eager, eager_last = repeat(lambda: hvd.allreduce(x, op=hvd.Sum, name="bench.eager"))  # returns when done
        return {f"horovod-{self.label}": (graph, lambda: wrong_elements(last["graph"].numpy(), total)),
                f"horovod-{self.label}-eager": (eager, lambda: wrong_elements(eager_last[0].numpy(), total))}

    def grads_run(self, shapes):
        tf, hvd = self.tf, self.hvd
        grads = [tf.constant(filled(int(np.prod(s)), hvd.rank()).reshape(s)) for s in shapes]
        want = [expected(int(np.prod(s)), hvd.size()) for s in shapes]
        last = {}

        def run(k):
            first, last["grads"] = self.chained_grads(grads, tf.constant(k))
            return first.numpy()
        return {f"horovod-{self.label}-grads":
                (run, lambda: sum(wrong_elements(g.numpy(), w) for g, w in zip(last["grads"], want)))}

    def barrier(self):
        self.hvd.allreduce(self.tf.constant([0.0]), op=self.hvd.Sum, name="bench.barrier")

    def slowest(self, t):
        return float(self.hvd.allreduce(self.tf.constant([t], self.tf.float64), op=self.hvd.Max,
                                        name="bench.slowest").numpy()[0])

    def mean(self, x):
        return float(self.hvd.allreduce(self.tf.constant([x], self.tf.float64), op=self.hvd.Average,
                                        name="bench.mean").numpy()[0])

    def total(self, x):
        return float(self.hvd.allreduce(self.tf.constant([x], self.tf.float64), op=self.hvd.Sum,
                                        name="bench.total").numpy()[0])


class TFCollectiveRuns:
    """TF's own collective all-reduce as `ringtrain --backend tf-collective`
    trains: MultiWorkerMirroredStrategy with TF's RING, the workers' cluster
    made from mpirun's ranks. k all-reduces chain in a tf.while_loop around
    strategy.run, in one call (as Keras's steps_per_execution loops do), so
    TF's per-call dispatch is not charged to them. The loop's barriers and
    maxima are the training mode's own agreement (ringtrain.collective)."""

    def __init__(self):
        from ringtrain import collective
        from ringtrain.multihost.slurm_step import DEFAULT_PORT_BASE
        from ringtrain.workloads.tfenv import import_tensorflow_quietly, set_threads, step_function
        self.rank, workers = collective.cluster(DEFAULT_PORT_BASE)  # (TF_CONFIG from the ranks)
        tf = self.tf = import_tensorflow_quietly()
        set_threads(1)
        self.size = len(workers)
        strategy = collective.connect(tf, "RING")
        self.agree = collective.CollectiveAgreement(tf, strategy, self.rank, self.size)
        # (tf.identity: the all-reduce takes its device from its input's, made in the replica)
        total = lambda inputs, *previous: tuple(after(previous, lambda: tf.distribute.get_replica_context().all_reduce(
            "SUM", [tf.identity(v) for v in inputs])))

        @step_function
        def chained(tensors, k):
            # all of a call's tensors go in one all-reduce, packed as TF packs a step's gradients
            out = tf.while_loop(lambda i, *v: i < k, lambda i, *v: (i + 1,) + strategy.run(total, args=(tensors, *v)),
                                (tf.constant(0),) + tuple(tensors))[1:]
            return tf.stack([tf.reshape(t, [-1])[0] for t in out]), out

        self.chained = chained

    def _run(self, tensors):
        last = {}

        def run(k):
            first, last["out"] = self.chained(tensors, self.tf.constant(k))
            return first.numpy()
        return run, last

    def runs(self, nbytes):
        count = nbytes // 4
        run, last = self._run([self.tf.constant(filled(count, self.rank))])
        want = expected(count, self.size)
        return {"tf-ring": (run, lambda: wrong_elements(last["out"][0].numpy(), want))}

    def grads_run(self, shapes):
        tf = self.tf
        run, last = self._run([tf.constant(filled(int(np.prod(s)), self.rank).reshape(s)) for s in shapes])
        want = [expected(int(np.prod(s)), self.size) for s in shapes]
        return {"tf-ring-grads": (run, lambda: sum(wrong_elements(g.numpy(), w) for g, w in zip(last["out"], want)))}

    def barrier(self):
        self.agree.sum([0.0])

    def slowest(self, t):
        return max(self.agree.gather(t))

    def mean(self, x):
        return self.agree.sum([x])[0] / self.size

    def total(self, x):
        return self.agree.sum([x])[0]


def measure(impls, sizes, trials, warmup, grad_shapes, label, mpi_label="mpi4py"):
    """Rows for the requested implementations. Raw MPI rows, Horovod rows and
    TF's rows come from separate launches: Horovod's background thread runs a
    collective every cycle, which would slow MPI calls made beside it in the
    same process. Within a launch, all implementations of a size are timed in
    interleaved trials."""
    framework = HorovodRuns(label) if "horovod" in impls else TFCollectiveRuns() if "tf-collective" in impls \
        else None
    if framework:
        barrier, slowest, mean, total = framework.barrier, framework.slowest, framework.mean, framework.total
        world, rank = framework.size, framework.rank
        runs_at = framework.runs
    else:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        barrier, slowest = comm.Barrier, lambda t: comm.allreduce(t, op=MPI.MAX)
        mean = lambda x: comm.allreduce(x) / comm.Get_size()
        total = comm.allreduce
        world, rank = comm.Get_size(), comm.Get_rank()
        runs_at = lambda nbytes: {k: v for k, v in mpi_runs(comm, nbytes).items() if k in impls}
    rows = []
    for nbytes in sizes:
        runs = runs_at(nbytes)
        timed, wire, wrong = time_interleaved(runs, nbytes, trials, warmup, barrier, slowest, mean, total)
        rows += [row(mpi_label if impl == "mpi4py" else impl, nbytes, timed[impl], world, iterations(nbytes),
                     wire[impl], wrong[impl]) for impl in runs]
    if framework and grad_shapes:
        nbytes = 4 * sum(int(np.prod(s)) for s in grad_shapes)
        runs = framework.grads_run(grad_shapes)
        timed, wire, wrong = time_interleaved(runs, nbytes, trials, warmup, barrier, slowest, mean, total)
        rows += [row(name, nbytes, timed[name], world, iterations(nbytes), wire[name], wrong[name],
                     note=f"{len(grad_shapes)} gradient tensors of the model, Sum, fused")
                 for name in runs]
    return rows, rank


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ringtrain.bench.allreduce_worker")
    p.add_argument("--impls", required=True, help="comma list of mpi4py,ring,memcpy; or horovod; or tf-collective")
    p.add_argument("--horovod-label", default="mpi", help="row name suffix: mpi or gloo")
    p.add_argument("--mpi-label", default="mpi4py", help="row name of the raw MPI_Allreduce rows")
    p.add_argument("--sizes", required=True, help="comma list of byte counts")
    p.add_argument("--grad-shapes", default="", help="JSON list of gradient shapes")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    impls = args.impls.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    shapes = [tuple(s) for s in json.loads(args.grad_shapes)] if args.grad_shapes else []
    rows, rank = measure(impls, sizes, args.trials, args.warmup, shapes, args.horovod_label, args.mpi_label)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "env": {k: v for k, v in os.environ.items()
                                             if k.startswith(("HOROVOD_", "OMPI_MCA_"))}}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
