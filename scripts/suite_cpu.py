"""Where the test suite's CPU goes: each test file's CPU seconds, summed over
every process that ran while its tests did, from the kernel's process
accounting (acct(2), one record per ended process). For DEVELOPERS.md 4.13.

    python scripts/suite_cpu.py record build/suite-cpu -- make test   (root)
    python scripts/suite_cpu.py report build/suite-cpu

`record` turns accounting on, runs the command with this module as a pytest
plugin (it writes each test's start, end and pytest process), and turns it
off however the command ends. A process is a test's when a pytest worker
running that test is its ancestor; one started elsewhere (by a simulated
host's sshd, a SLURM daemon) is shared out among the tests running as it
started. Accounting is machine-wide: run nothing else meanwhile."""
import collections
import ctypes
import json
import os
import struct
import subprocess
import sys
import time

# linux/acct.h, struct acct_v3: flag, version, tty, exit code, uid, gid, pid,
# ppid, start (s), elapsed (ticks, float), then 8 comp_t counters and the command's name
RECORD = struct.Struct("<BBHIIIIIIf8H16s")
TICKS = 100  # AHZ: the counters' ticks a second
TF_SIZED = 3.0  # CPU seconds: a process that loaded TensorFlow (its import alone is 4-9 s here)


def comp_t(value):
    """A comp_t: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def records(data):
    """Each ended process of an acct_v3 file's bytes: pid, ppid, start, seconds, cpu, name."""
    for offset in range(0, len(data) - RECORD.size + 1, RECORD.size):
        fields = RECORD.unpack_from(data, offset)
        assert fields[1] == 3, "not an acct_v3 record"
        yield {"pid": fields[6], "ppid": fields[7], "start": fields[8], "seconds": fields[9] / TICKS,
               "cpu": (comp_t(fields[10]) + comp_t(fields[11])) / TICKS,
               "name": fields[18].split(b"\0")[0].decode(errors="replace")}


def by_test(processes, tests):
    """{test id: CPU seconds} and what no test ran beside: `tests` are this
    plugin's records. PIDs are reused within a run (pid_max is 32768 here),
    so a parent is the process of that PID alive when its child started."""
    workers = {t["pid"]: [] for t in tests}
    for t in tests:
        workers[t["pid"]].append(t)
    by_pid = collections.defaultdict(list)
    for p in processes:
        by_pid[p["pid"]].append(p)

    def alive(pid, at):
        return next((p for p in by_pid.get(pid, ()) if p["start"] - 1 <= at <= p["start"] + p["seconds"] + 1), None)

    def running(candidates, at):  # (start is whole seconds: a second's slack)
        return [t["id"] for t in candidates if t["start"] - 1 <= at <= t["end"] + 1]

    cpu, elsewhere = collections.Counter(), 0.0
    for p in processes:
        if p["pid"] in workers:
            continue  # (a pytest process itself: its own CPU is nobody's test)
        ancestor, hops = p, 0
        while ancestor and ancestor["ppid"] not in workers and hops < 64:
            ancestor, hops = alive(ancestor["ppid"], ancestor["start"]), hops + 1
        ids = running(workers[ancestor["ppid"]] if ancestor and ancestor["ppid"] in workers else tests, p["start"])
        for test in ids:
            cpu[test] += p["cpu"] / len(ids)
        if not ids:
            elsewhere += p["cpu"]
    return cpu, elsewhere


def report(directory, out=sys.stdout):
    with open(os.path.join(directory, "pacct"), "rb") as f:
        processes = list(records(f.read()))
    with open(os.path.join(directory, "tests.jsonl")) as f:
        tests = [json.loads(line) for line in f]
    first, last = min(t["start"] for t in tests), max(t["end"] for t in tests)
    workers = {t["pid"] for t in tests}
    during = [p for p in processes if first - 1 <= p["start"] <= last + 1 and p["pid"] not in workers]
    cpu, elsewhere = by_test(during, tests)
    files, wall = collections.Counter(), collections.Counter()
    for test, seconds in cpu.items():
        files[test.split("::")[0]] += seconds
    for t in tests:
        wall[t["id"].split("::")[0]] += t["end"] - t["start"]
    total = sum(p["cpu"] for p in during)
    sized = [p["cpu"] for p in during if p["cpu"] >= TF_SIZED]
    print(f"{len(tests)} tests in {(last - first) / 60:.1f} min; {len(during)} processes, {total / 60:.1f} "
          f"core-minutes ({total / max(last - first, 1):.2f} cores busy on average)", file=out)
    print(f"{len(sized)} processes of {TF_SIZED:g} s of CPU or more (TensorFlow's): {sum(sized) / 60:.1f} "
          f"core-minutes, median {sorted(sized)[len(sized) // 2] if sized else 0:.1f} s each; "
          f"no test's: {elsewhere / 60:.1f}", file=out)
    print(f"{'file':44s} {'CPU s':>7s} {'test s':>7s}", file=out)
    for name, seconds in files.most_common():
        print(f"{name:44s} {seconds:7.0f} {wall[name]:7.0f}", file=out)


# This module as a pytest plugin, under `record`: each test's start, end and process.
_plugin = {}


def pytest_configure(config):
    _plugin["config"] = config


def pytest_runtest_logstart(nodeid, location):
    _plugin[nodeid] = time.time()


def pytest_runtest_logfinish(nodeid, location):
    if _plugin["config"].pluginmanager.hasplugin("dsession"):
        return  # (an xdist controller relays its workers' tests: they write their own)
    with open(os.path.join(os.environ["SUITE_CPU_DIR"], "tests.jsonl"), "a") as f:
        f.write(json.dumps({"id": nodeid, "pid": os.getpid(), "start": _plugin.pop(nodeid), "end": time.time()}) + "\n")


def record(directory, command):
    os.makedirs(directory, exist_ok=True)
    pacct, tests = (os.path.join(directory, name) for name in ("pacct", "tests.jsonl"))
    for path in (pacct, tests):
        open(path, "w").close()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(pacct.encode()) != 0:
        sys.exit(f"suite_cpu: cannot turn process accounting on: {os.strerror(ctypes.get_errno())} (run it as root)")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, SUITE_CPU_DIR=os.path.abspath(directory),
               PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])),
               PYTEST_ADDOPTS=" ".join(filter(None, [os.environ.get("PYTEST_ADDOPTS"), "-p suite_cpu"])))
    try:
        return subprocess.call(command, env=env)
    finally:
        libc.acct(None)


def main(argv):
    if argv[:1] == ["record"] and len(argv) > 3 and argv[2] == "--":
        code = record(argv[1], argv[3:])
        report(argv[1])
        return code
    if argv[:1] == ["report"] and len(argv) == 2:
        return report(argv[1])
    print("usage: suite_cpu.py record DIR -- COMMAND... | report DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
