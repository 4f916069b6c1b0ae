"""The TF gRPC servers, and the life of a task that only serves (a PS task,
an in-graph tower worker): it serves until the chief says training is over,
or ends with one line when the client it serves is gone."""
import json
import os
import socket
import threading
import time

from ringtrain.multihost.net import is_listening, wait_for
from ps_baseline.options import PROG, RESUME
from ringtrain.common.errors import EXIT_PREEMPTED, UsageError, first_line
from ringtrain.workloads.mode import Alone, Topology
from ringtrain.workloads.preemption import PREEMPTION
from ringtrain.workloads.tfenv import session_config


# Set by `launch` for its tasks: each says, as data, what it computes on (launch puts it in the summary).
TASK_DATA_ENV = "PS_BASELINE_TASK_DATA"


def pin_task(cluster, job, task):
    """PS: a worker task computes on the GPU of its place among its host's
    workers; a PS task, and TF2's coordinator, on none. Returns what it took,
    and tells `launch` as data."""
    from ringtrain.workloads.devices import local_index, pin_gpu
    device = pin_gpu(local_index(cluster.worker, task) if job == "worker" else None)
    if os.environ.get(TASK_DATA_ENV):
        print(json.dumps({"pinned": {"job": job, "task": task, "device": device}}), flush=True)
    return device


def start_server(tf, cluster, job_name, task_index, threads, inter_op_threads=None):
    address = cluster.address(job_name, task_index)
    config = session_config(tf, threads, inter_op_threads=inter_op_threads)
    try:
        return tf.distribute.Server(tf.train.ClusterSpec(cluster.as_dict()), job_name=job_name,
                                    task_index=task_index, config=config)
    except (tf.errors.OpError, ValueError) as e:
        raise UsageError(f"cannot start the gRPC server of {job_name} task {task_index} "
                         f"at {address}: {first_line(e)}") from None


SHUTDOWN_TIMEOUT_MS = 30_000
LEAVE_AFTER_SEC = 15


def shutdown_queue(tf, job, task_index):
    """A queue living on task `job`/`task_index`: the chief (or in-graph client)
    enqueues into it when training is over, which lets that task exit instead
    of joining forever."""
    name = f"ps_baseline_shutdown_{job}_{task_index}"
    with tf.compat.v1.device(f"/job:{job}/task:{task_index}"):
        return tf.compat.v1.FIFOQueue(1, tf.int32, shared_name=name, name=name)


def shutdown_ops(tf, tasks):
    """The ops that tell the serving tasks [(job, index)] that training is
    over: one message into each one's shutdown queue."""
    return [shutdown_queue(tf, job, i).enqueue(1) for job, i in tasks]


STOP_QUEUE = "ps_baseline_stop"
SERVE_AFTER_STOP_SEC = 25  # a task sent a signal serves this long for the chief to save (SLURM waits 30 s)


class StopFlag:
    """The job's stop flag: a queue on PS task 0, which every task of the job
    can reach. A task sent a scheduler's signal puts one message in it; the
    training processes read its size every few steps (through `target`, a
    server of theirs), so that a signal to any task stops the whole job."""

    def __init__(self, tf, target, config=None):
        graph = tf.Graph()
        with graph.as_default(), tf.compat.v1.device("/job:ps/task:0"):
            queue = tf.compat.v1.FIFOQueue(1024, tf.int32, shared_name=STOP_QUEUE, name=STOP_QUEUE)
            self._raise, self._size = queue.enqueue(1), queue.size()
        self.session, self.raised_here = tf.compat.v1.Session(target, graph=graph, config=config), False
        self._options = tf.compat.v1.RunOptions(timeout_in_ms=SHUTDOWN_TIMEOUT_MS)

    def raise_once(self):
        if not self.raised_here:
            self.session.run(self._raise, options=self._options)
            self.raised_here = True

    def raised(self):
        return self.session.run(self._size, options=self._options) > 0


class SharedStop:
    """An agreement's stop_raised() through the job's StopFlag (made when first needed)."""

    def __init__(self, make_flag):
        self._make, self._flag = make_flag, None

    def __call__(self, mine):
        if self._flag is None:
            self._flag = self._make()
        if mine:
            self._flag.raise_once()
        return self._flag.raised()


class Coordinating(Alone):
    """One process drives every worker (the in-graph client, the TF2
    coordinator), and the job's server tasks may be sent the signal."""

    def __init__(self, make_flag):
        self.stop_raised = SharedStop(make_flag)


def shut_down(tf, target, tasks):
    """Run shutdown_ops through the server at `target` ("grpc://host:port"),
    for a program without a graph of its own (the TF2 coordinator's is eager)."""
    graph = tf.Graph()
    with graph.as_default():
        enqueues = shutdown_ops(tf, tasks)
    with tf.compat.v1.Session(target, graph=graph) as session:
        # (a deadline: a task that ends as it takes its message may never confirm it)
        session.run(enqueues, options=tf.compat.v1.RunOptions(timeout_in_ms=SHUTDOWN_TIMEOUT_MS))


def serve_task(tf, cluster, job, task, threads, log, watch=None):
    """A task that only serves (a PS task; an in-graph tower worker): its
    server, on no GPU for a PS task, on its place among its host's workers for
    a worker; until worker 0 says training is over. `watch`: as in serve()."""
    from ringtrain.workloads.tfenv import set_threads
    set_threads(threads)
    pin_task(cluster, job, task)
    server = start_server(tf, cluster, job, task, threads)
    return serve(tf, server, job, task, threads, log, watch=watch, told_by=cluster.worker[0])


def serve(tf, server, job, task_index, threads, log, watch=None, told_by=None):
    """Serve (variables on a PS task, a tower on an in-graph worker) until the
    chief says training is over, or forever, as server.join() in the classic
    tutorials, if it never does. `watch`: (who, address) of a client whose
    death ends this task with one line. `told_by`: the address of the task
    that says training is over; this one stays until that one has gone (at
    most LEAVE_AFTER_SEC), whose own end (closing its session, TF's clean-up
    of its remote functions) still talks to this task."""
    from ringtrain.workloads.stall import StallWatchdog
    graph = tf.Graph()
    with graph.as_default():
        wait_for_shutdown = shutdown_queue(tf, job, task_index).dequeue()
    config = session_config(tf, threads, [f"/job:{job}/task:{task_index}"])
    sess = tf.compat.v1.Session(server.target, graph=graph, config=config)
    log(f"{job} task {task_index} serving at {server.target}")
    watchdog = StallWatchdog(Alone(), 0, PROG, Topology(servers=(watch,) if watch else (), advice=RESUME)).start()
    # The blocking dequeue runs in a thread, so that a signal still reaches Python.
    waiter = threading.Thread(target=sess.run, args=(wait_for_shutdown,), daemon=True)
    waiter.start()
    PREEMPTION.defer()
    stop_by = None
    while waiter.is_alive():
        waiter.join(0.5)
        if PREEMPTION.requested and stop_by is None:
            # a scheduler's signal: the job stops at an agreed step, and its chief saves through this task
            watchdog.close()  # (from here, the chief's end is this task's too, not a failure)
            log(f"{job} task {task_index}: {PREEMPTION.signal}: the job stops; serving while its chief saves")
            stop_by = time.monotonic() + SERVE_AFTER_STOP_SEC
            try:
                StopFlag(tf, server.target, session_config(tf, threads, [f"/job:{job}/task:{task_index}",
                                                                         "/job:ps/task:0"])).raise_once()
            except tf.errors.OpError:
                pass  # (PS task 0 is gone: the job is ending anyway)
        if stop_by and (time.monotonic() > stop_by or (told_by and not is_listening(told_by))):
            return EXIT_PREEMPTED  # the chief is done (or did not finish in time): nothing left to serve
    watchdog.close()
    log(f"{job} task {task_index}: training is over, shutting down")
    if told_by:
        wait_for(lambda: not is_listening(told_by), LEAVE_AFTER_SEC, poll=0.1)
    return 0


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
