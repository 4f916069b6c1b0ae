"""Per-thread CPU of this process, from /proc/self/task/TID/stat (utime+stime),
and the CPU its host's kernel spends, from /proc/stat.

Horovod's background thread is named `hvd_background` by ringtrain's patch
0004, so a rank's CPU splits into that thread and everything else (TF's
compute pools, tf.data, Python). Linux only; elsewhere the readings are empty.
"""
import os

HOROVOD_THREAD = "hvd_background"
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds_by_thread(pid="self"):
    """{tid: (name, cpu seconds)} for every live thread of `pid`."""
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return {}
    # (a thread that ended between listdir and open reads None)
    read = {int(tid): _read_stat(f"{base}/{tid}/stat") for tid in tids}
    return {tid: found for tid, found in read.items() if found}


class SplitReader:
    """(Horovod background thread, every other thread, the host's kernel) CPU
    seconds so far, at each call: the first two of `pid`, the first None in a
    process without that thread (a PS task, say). Cheap enough for every
    timed window: the process's own total (one file) less that thread's,
    found by name at the first call, where reading each of a rank's ~60
    threads took 3 ms idle here and about 6 under load, every 10 steps
    (DEVELOPERS.md 4.15)."""

    def __init__(self, pid="self"):
        self.pid, self._horovod, self._looked = pid, None, False

    def __call__(self):
        if not self._looked:
            self._looked = True
            self._horovod = next((tid for tid, (name, _) in cpu_seconds_by_thread(self.pid).items()
                                  if name == HOROVOD_THREAD), None)
        total = _stat_seconds(f"/proc/{self.pid}/stat")
        horovod = _stat_seconds(f"/proc/{self.pid}/task/{self._horovod}/stat") if self._horovod else None
        if total is None:
            return None
        return horovod, total - (horovod or 0.0), host_kernel_seconds()


def host_kernel_seconds():
    """CPU seconds the kernel has spent on this host, over all its cores: its
    system, irq and softirq time in /proc/stat's first line. Network
    namespaces share /proc/stat, so on a simulated cluster this is the whole
    machine's: where every host's sockets, veths, bridge and shaping run."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()  # cpu user nice system idle iowait irq softirq ...
    except OSError:
        return None
    return (int(fields[3]) + int(fields[6]) + int(fields[7])) / _TICKS


def _stat_seconds(path):
    """utime + stime of a /proc stat file (a process's covers all its threads, ended ones too)."""
    found = _read_stat(path)
    return found[1] if found else None


def _read_stat(path):
    """(name, utime + stime seconds) of a /proc stat file; None if it is gone."""
    try:
        with open(path) as f:
            stat = f.read()
    except OSError:
        return None
    # the name sits in parentheses and may hold spaces: split after the last ')'
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    return name, (int(fields[11]) + int(fields[12])) / _TICKS


def percent_of_a_core(start, end, wall_seconds):
    """{"horovod_thread": %, "other_threads": %, "host_kernel": %} of one core
    between two SplitReader() readings `wall_seconds` apart (None if no time
    passed). The host's kernel, over all its cores, can pass 100 %."""
    if not start or not end or wall_seconds <= 0:
        return None
    share = lambda a, b: None if a is None or b is None else 100.0 * (b - a) / wall_seconds
    return {"horovod_thread": share(start[0], end[0]), "other_threads": share(start[1], end[1]),
            "host_kernel": share(start[2], end[2])}
