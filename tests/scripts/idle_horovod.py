"""Run on N ranks: after hvd.init(), sit idle and measure the CPU that
Horovod's background thread (named hvd_background by patch 0004) takes over
5 s, from /proc per-thread accounting. Rank 1 is stopped for 0.3 s as the
window opens: one late wake-up, as a loaded machine gives them. Prints one
JSON line per rank."""
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import horovod.tensorflow as hvd  # noqa: E402

from ringtrain.workloads import threadcpu  # noqa: E402

hvd.init()
hvd.allreduce(hvd.mpi_ops.tf.ones([4])).numpy()  # one real round first: the loop is up and has worked
time.sleep(1)


def background():
    return [s for name, s in threadcpu.cpu_seconds_by_thread().values() if name == threadcpu.HOROVOD_THREAD]


start, t0 = background(), time.monotonic()
if hvd.rank() == 1:  # (a process cannot continue itself: a child stops it and continues it)
    subprocess.run([sys.executable, "-c", "import os, signal, sys, time; pid = int(sys.argv[1]); "
                    "os.kill(pid, signal.SIGSTOP); time.sleep(0.3); os.kill(pid, signal.SIGCONT)",
                    str(os.getpid())], check=True)
time.sleep(5)
end, seconds = background(), time.monotonic() - t0
# Both ranks read before either shuts down: a rank's exit ends the other's background thread too.
hvd.allreduce(hvd.mpi_ops.tf.ones([4])).numpy()
sys.stdout.write(json.dumps({"rank": hvd.rank(), "threads": len(end),
                             "loop": os.environ.get("HOROVOD_EVENT_DRIVEN_LOOP", "1"),
                             "cpu_pct": 100 * (sum(end) - sum(start)) / seconds}) + "\n")
sys.stdout.flush()
