"""One rank of `ringtrain-bench allreduce`, started by mpirun or horovodrun.

    mpirun -np 2 python -m bench.allreduce_worker --impls mpi4py,ring,memcpy,horovod --sizes 4K..256M --out rank.json
    horovodrun --gloo -np 2 -H localhost:2 python -m bench.allreduce_worker --impls horovod ...

Every timed number is the slowest rank's mean time per operation over a trial
of `iters` back-to-back operations, after warm-up operations that are not timed;
several trials per size are kept so that the parent can report a median.
Rank 0 writes the rows as JSON to --out.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

TRIAL_BYTES = 64 << 20  # bytes moved per trial: enough iterations to swamp timer noise
MAX_ITERS, MIN_ITERS = 100, 3


def iterations(nbytes):
    return int(min(MAX_ITERS, max(MIN_ITERS, TRIAL_BYTES // max(nbytes, 1))))


def time_trials(run, nbytes, trials, warmup, barrier, slowest):
    """Per-op seconds of each trial, max over ranks; warm-up ops excluded."""
    return time_interleaved({"x": run}, nbytes, trials, warmup, barrier, slowest)["x"]


def time_interleaved(runs, nbytes, trials, warmup, barrier, slowest):
    """Trials of several implementations taken in turn (a, b, c, a, b, c, ...),
    so that a burst of load from elsewhere hits them alike."""
    iters = iterations(nbytes)
    for run in runs.values():
        for _ in range(warmup):
            run()
    out = {name: [] for name in runs}
    for _ in range(trials):
        for name, run in runs.items():
            barrier()
            start = time.perf_counter()
            for _ in range(iters):
                run()
            out[name].append(slowest((time.perf_counter() - start) / iters))
    return out


def row(impl, nbytes, seconds, world, iters, note=""):
    return {"impl": impl, "bytes": int(nbytes), "count": int(nbytes // 4), "dtype": "float32",
            "world_size": world, "iters": iters, "trial_seconds": seconds, "note": note}


def mpi_rows(impls, sizes, trials, warmup):
    from mpi4py import MPI
    from bench.ring_reference import ring_allreduce
    comm = MPI.COMM_WORLD
    world = comm.Get_size()
    slowest = lambda t: comm.allreduce(t, op=MPI.MAX)
    rows = []
    for nbytes in sizes:
        send = np.ones(nbytes // 4, np.float32)
        recv = np.empty_like(send)
        runs = {
            "mpi4py": lambda: comm.Allreduce(send, recv, op=MPI.SUM),
            "ring": lambda: ring_allreduce(comm, send),
            # every rank copies at once: the memory system is shared, as it is in an allreduce
            "memcpy": lambda: np.copyto(recv, send),
        }
        chosen = {impl: runs[impl] for impl in impls if impl in runs}
        timed = time_interleaved(chosen, nbytes, trials, warmup, comm.Barrier, slowest)
        rows += [row(impl, nbytes, timed[impl], world, iterations(nbytes)) for impl in chosen]
    return rows


def horovod_rows(sizes, trials, warmup, grad_shapes, label):
    """Horovod as training uses it: inside a tf.function (graph mode), and
    eagerly for comparison; plus the model's own gradient list, one
    allreduce per tensor, fused by Horovod's fusion buffer."""
    from workloads.tfenv import import_tensorflow_quietly
    tf = import_tensorflow_quietly()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import horovod.tensorflow as hvd
    hvd.init()
    world = hvd.size()
    flag = tf.constant([0.0])

    def slowest(t):
        return float(hvd.allreduce(tf.constant([t], tf.float64), op=hvd.Max, name="bench.slowest").numpy()[0])

    def barrier():
        hvd.allreduce(flag, op=hvd.Sum, name="bench.barrier")

    rows = []
    for nbytes in sizes:
        x = tf.ones([nbytes // 4], tf.float32)
        graph_allreduce = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, name="bench.graph"))
        eager = lambda: hvd.allreduce(x, op=hvd.Sum, name="bench.eager")
        runs = {f"horovod-{label}": lambda: graph_allreduce(x).numpy(),
                f"horovod-{label}-eager": lambda: eager().numpy()}
        timed = time_interleaved(runs, nbytes, trials, warmup, barrier, slowest)
        rows += [row(impl, nbytes, timed[impl], world, iterations(nbytes)) for impl in runs]
    if grad_shapes:
        grads = [tf.ones(s, tf.float32) for s in grad_shapes]
        nbytes = 4 * sum(int(np.prod(s)) for s in grad_shapes)

        @tf.function
        def allreduce_gradients(tensors):
            return [hvd.allreduce(g, op=hvd.Average, name=f"bench.grad{i}") for i, g in enumerate(tensors)]

        run = lambda: [g.numpy() for g in allreduce_gradients(grads)][0]
        t = time_trials(run, nbytes, trials, warmup, barrier, slowest)
        rows.append(row(f"horovod-{label}-grads", nbytes, t, world, iterations(nbytes),
                        note=f"{len(grad_shapes)} gradient tensors of the model, fused"))
    return rows, world, hvd.rank()


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.allreduce_worker")
    p.add_argument("--impls", required=True, help="comma list: mpi4py,ring,memcpy,horovod")
    p.add_argument("--horovod-label", default="mpi", help="row name suffix: mpi or gloo")
    p.add_argument("--sizes", required=True, help="comma list of byte counts")
    p.add_argument("--grad-shapes", default="", help="JSON list of gradient shapes")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    impls = args.impls.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    rows, rank = [], 0
    if any(i in ("mpi4py", "ring", "memcpy") for i in impls):
        from mpi4py import MPI
        rows += mpi_rows(impls, sizes, args.trials, args.warmup)
        rank = MPI.COMM_WORLD.Get_rank()
    if "horovod" in impls:
        shapes = [tuple(s) for s in json.loads(args.grad_shapes)] if args.grad_shapes else []
        hrows, _, rank = horovod_rows(sizes, args.trials, args.warmup, shapes, args.horovod_label)
        rows += hrows
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "env": {k: v for k, v in os.environ.items()
                                             if k.startswith(("HOROVOD_", "OMPI_MCA_"))}}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
