"""The remote end of a process started over ssh: ties the command's life to
the ssh connection, so that no process outlives the job on any host.

    ssh HOST python -m ringtrain.multihost.guard --cwd DIR --env K=V -- CMD ARGS...

It runs CMD in a process group of its own and watches its own stdin, which
is the ssh channel: when that closes (the launcher stopped the task, died, or
lost the connection), or when the guard gets SIGTERM or SIGHUP, it ends the
whole group: SIGTERM, then SIGKILL after a grace period. A line `signal N`
on stdin forwards signal N to the group instead (ssh carries no signals: this
is how a launcher passes a scheduler's signal on). It exits with CMD's
status, or 128 + N when a signal N ended CMD (the shell's convention).
"""
import argparse
import os
import signal
import subprocess
import sys
import threading
import time

from ringtrain.multihost.procs import dies_with_parent, terminate_tree

GRACE_SEC = 5.0


def end_group(pgid, grace=GRACE_SEC):
    """SIGTERM (and SIGCONT) to the group, SIGKILL to whatever is left after `grace`."""
    terminate_tree(pgid)
    for _ in range(int(grace * 10)):
        if not _group_alive(pgid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ringtrain.multihost.guard")
    p.add_argument("--cwd")
    p.add_argument("--env", action="append", default=[], metavar="K=V")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command after --")
    env = dict(os.environ)
    env.update(item.split("=", 1) for item in args.env)
    try:
        child = subprocess.Popen(command, cwd=args.cwd, env=env, stdin=subprocess.DEVNULL,
                                 start_new_session=True,
                                 preexec_fn=dies_with_parent(signal.SIGKILL))  # if the guard is killed
    except OSError as e:
        sys.stderr.write(f"{os.uname().nodename}: cannot start {command[0]}: {e.strerror}\n")
        return 127
    stopping = threading.Event()

    def stop(*_):
        stopping.set()
        end_group(child.pid)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: threading.Thread(target=stop, daemon=True).start())

    def watch_connection():
        # `signal N`: pass it on; EOF on stdin: the ssh channel closed, so nobody waits for this task any more.
        for line in sys.stdin:
            words = line.split()
            if len(words) == 2 and words[0] == "signal" and words[1].isdigit():
                try:
                    os.killpg(child.pid, int(words[1]))
                except (ProcessLookupError, ValueError):
                    pass
        stop()

    threading.Thread(target=watch_connection, daemon=True).start()
    code = child.wait()
    end_group(child.pid, grace=1.0 if not stopping.is_set() else GRACE_SEC)  # what the command left behind
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
