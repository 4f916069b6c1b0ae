"""The TF gRPC servers, the PS task's life, and the watchdog that turns a
vanished PS or chief into a clear error instead of a silent hang."""
import os
import socket
import sys
import threading

from ringtrain.multihost.net import is_listening, wait_for
from ringtrain.ps_baseline.options import PROG
from ringtrain.workloads.errors import UsageError, first_line
from ringtrain.workloads.tfenv import session_config

WATCH_INTERVAL_SEC = 2.0
WATCH_MISSES = 2  # consecutive failed connects before a peer counts as dead


def start_server(tf, cluster, job_name, task_index, threads, inter_op_threads=None):
    address = cluster.address(job_name, task_index)
    config = session_config(tf, threads, inter_op_threads=inter_op_threads)
    try:
        return tf.distribute.Server(tf.train.ClusterSpec(cluster.as_dict()), job_name=job_name,
                                    task_index=task_index, config=config)
    except (tf.errors.OpError, ValueError) as e:
        raise UsageError(f"cannot start the gRPC server of {job_name} task {task_index} "
                         f"at {address}: {first_line(e)}") from None


def shutdown_queue(tf, job, task_index):
    """A queue living on task `job`/`task_index`: the chief (or in-graph client)
    enqueues into it when training is over, which lets that task exit instead
    of joining forever."""
    name = f"ps_baseline_shutdown_{job}_{task_index}"
    with tf.compat.v1.device(f"/job:{job}/task:{task_index}"):
        return tf.compat.v1.FIFOQueue(1, tf.int32, shared_name=name, name=name)


def serve(tf, server, job, task_index, threads, log, watch=None):
    """Serve (variables on a PS task, a tower on an in-graph worker) until the
    chief says training is over, or forever, as server.join() in the seeds, if
    it never does. `watch`: (who, address) of a client whose death ends this
    task with one line."""
    graph = tf.Graph()
    with graph.as_default():
        wait_for_shutdown = shutdown_queue(tf, job, task_index).dequeue()
    config = session_config(tf, threads, [f"/job:{job}/task:{task_index}"])
    sess = tf.compat.v1.Session(server.target, graph=graph, config=config)
    log(f"{job} task {task_index} serving at {server.target}")
    watchdog = Watchdog(PROG, [watch], "Restart the cluster to resume from the last checkpoint.") if watch else None
    if watchdog:
        watchdog.start()
    # The blocking dequeue runs in a thread, so that Ctrl-C still reaches Python.
    waiter = threading.Thread(target=sess.run, args=(wait_for_shutdown,), daemon=True)
    waiter.start()
    while waiter.is_alive():
        waiter.join(0.5)
    if watchdog:
        watchdog.stop()
    log(f"{job} task {task_index}: training is over, shutting down")
    return 0


class Watchdog(threading.Thread):
    """Polls peers' ports; if one stops answering, says which and exits 3.

    TF would otherwise retry a dead PS for a long time (MonitoredTrainingSession
    recovers from UnavailableError by recreating its session, forever)."""

    def __init__(self, prog, peers, advice):
        super().__init__(daemon=True)
        self.prog, self.peers, self.advice = prog, peers, advice  # peers: [(who, address)]
        self._stop_event = threading.Event()

    def run(self):
        # A peer counts only once it has answered: a client may start after its servers.
        # Until every peer has, look often, so a short-lived one is not missed.
        misses, seen = {address: 0 for _, address in self.peers}, set()
        while not self._stop_event.wait(WATCH_INTERVAL_SEC if len(seen) == len(misses) else 0.25):
            for who, address in self.peers:
                if is_listening(address):
                    misses[address] = 0
                    seen.add(address)
                elif address in seen:
                    misses[address] += 1
                if misses[address] >= WATCH_MISSES and not self._stop_event.is_set():
                    sys.stderr.write(f"{self.prog}: error: {who} at {address} stopped answering; "
                                     f"training cannot go on. {self.advice}\n")
                    sys.stderr.flush()
                    sys.stdout.flush()
                    os._exit(3)

    def stop(self):
        self._stop_event.set()


def wait_for_tasks(cluster, job, timeout):
    """Wait until every task of `job` accepts connections; one line if one does not."""
    for i, address in enumerate(getattr(cluster, job)):
        host, port = address.rsplit(":", 1)
        try:
            socket.getaddrinfo(host, int(port))
        except socket.gaierror:
            raise UsageError(f"{job} task {i} at {address}: cannot resolve host {host}: fix --{job}_hosts "
                             "(or the hostfile), or its entry in /etc/hosts") from None
        if not wait_for(lambda: is_listening(address), timeout):
            raise UsageError(f"{job} task {i} at {address} did not come up within {timeout:g}s "
                             "(--startup-timeout): start it, or check the host lists")
