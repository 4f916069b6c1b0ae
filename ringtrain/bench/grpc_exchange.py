"""The parameter-server data path, timed: one worker pushes S bytes of
gradient into a variable on a PS task and pulls S bytes of weights back,
over TF's gRPC, as one synchronous PS step does per worker and PS shard.

    python -m ringtrain.bench.grpc_exchange --sizes 4096,1048576 --trials 5 --out rows.json

Starts its own PS task (a TF gRPC server in a child process, on a free port)
and a worker server in this process; the PS child is ended by PID on exit.
The rows feed the PS α-β fit: t(S) = 2·α + 2·S·β (one push, one pull).
"""
import argparse
import json
import os
import socket
import sys
import time

from ringtrain.bench.allreduce_worker import iterations, pattern, row, wrong_elements
from ringtrain.multihost import procs
from ringtrain.multihost.net import free_ports, is_listening, wait_for
from ringtrain.workloads.summary import interface_bytes


def serve(cluster, threads):
    """The PS task: a gRPC server and nothing else, as a ps job of the classic tutorials."""
    from ringtrain.workloads.tfenv import import_tensorflow_quietly, session_config
    tf = import_tensorflow_quietly()
    tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="ps", task_index=0,
                         config=session_config(tf, threads)).join()


def measure(cluster, sizes, trials, warmup, threads):
    from ringtrain.workloads.tfenv import import_tensorflow_quietly, session_config
    tf = import_tensorflow_quietly()
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    config = session_config(tf, threads)
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="worker", task_index=0,
                                  config=config)
    rows = []
    for nbytes in sizes:
        graph = tf.Graph()
        with graph.as_default():
            with tf1.device("/job:ps/task:0"):
                weights = tf1.get_variable("weights", [nbytes // 4], initializer=tf1.zeros_initializer(),
                                           use_resource=True)
            with tf1.device("/job:worker/task:0"):
                # a known gradient: after k steps the weights hold exactly k times it
                grads = tf1.get_variable("grads", initializer=pattern(nbytes // 4), use_resource=True,
                                         collections=[tf1.GraphKeys.LOCAL_VARIABLES])
                push = weights.assign_add(grads, read_value=False)  # runs on the PS: S bytes in
                with tf.control_dependencies([push]):
                    pulled = tf.identity(weights.read_value())  # S bytes back to the worker
                step = pulled[:1]  # fetch one element: the pull, not a copy into Python
            init = tf1.group(tf1.global_variables_initializer(), tf1.local_variables_initializer())
        with tf1.Session(server.target, graph=graph, config=config) as sess:
            sess.run(init)
            for _ in range(warmup):
                sess.run(step)
            iters = iterations(nbytes)
            seconds, moved, wrong, steps = [], 0, 0, warmup
            for _ in range(trials):
                before, start = sum(interface_bytes()), time.perf_counter()
                for _ in range(iters):
                    sess.run(step)
                seconds.append((time.perf_counter() - start) / iters)
                moved += sum(interface_bytes()) - before
                steps += iters
                wrong += wrong_elements(sess.run(weights), steps * pattern(nbytes // 4))
        # the worker's host sends S (push) and receives S (pull) per step
        rows.append(row("grpc-ps", nbytes, seconds, 2, iters, moved / (trials * iters), wrong,
                        note="one push of S bytes to a PS variable and one pull of S bytes back"))
    return rows


def wait_until_serving(ps, address, timeout=120):
    """TF sessions wait for a missing PS forever: fail instead, with one line."""
    if not wait_for(lambda: ps.poll() is not None or is_listening(address), timeout):
        raise RuntimeError(f"the PS task did not listen at {address} within {timeout} s")
    if ps.poll() is not None:
        raise RuntimeError(f"the PS task exited with status {ps.returncode} before serving at {address}")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ringtrain.bench.grpc_exchange")
    p.add_argument("--sizes", required=True, help="comma list of byte counts")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ps-host", default="localhost", help="where the PS task runs (over ssh if not here)")
    p.add_argument("--out", required=True)
    p.add_argument("--serve", help=argparse.SUPPRESS)  # internal: run the PS task of this cluster JSON
    args = p.parse_args(argv)
    if args.serve:
        serve(json.loads(args.serve), args.threads)
        return 0
    here = "localhost" if args.ps_host == "localhost" else socket.gethostname()
    if here == "localhost":  # one draw: two could hand both tasks the same just-freed port
        ps_port, worker_port = free_ports(2, host="")
    else:
        ps_port, worker_port = procs.free_ports_on(args.ps_host, 1)[0], free_ports(1, host="")[0]
    cluster = {"ps": [f"{args.ps_host}:{ps_port}"], "worker": [f"{here}:{worker_port}"]}
    ps = procs.Process([sys.executable, "-m", "ringtrain.bench.grpc_exchange", "--serve", json.dumps(cluster),
                        "--threads", str(args.threads), "--sizes", "0", "--out", os.devnull],
                       host=args.ps_host, cwd=os.getcwd())
    try:
        wait_until_serving(ps, cluster["ps"][0])
        rows = measure(cluster, [int(s) for s in args.sizes.split(",")], args.trials, args.warmup,
                       args.threads)
    finally:
        ps.stop()
    with open(args.out, "w") as f:
        json.dump({"rows": rows}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
