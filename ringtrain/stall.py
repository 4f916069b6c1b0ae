"""`--stall-timeout S`: an out-of-band watchdog that ends a job whose ranks
stop making progress, and names the rank that stopped.

Horovod's own stall inspector runs in its background thread, and that thread
is blocked in the same collective as everyone else when a rank freezes. So
each rank runs its own watchdog threads, with their own channel: every rank
sends rank 0 a heartbeat (its step) each second over TCP, and rank 0 answers
with its own. Rank 0 judges: when no rank has advanced for S seconds, it
names the ranks whose heartbeats stopped (frozen or gone) or, if all are
alive, those furthest behind, and ends the job non-zero, so that it can be
resumed from the last checkpoint. If rank 0 itself is the one that stopped,
the other ranks see its answers stop and say so.

Rank 0 listens on the address it reaches the other ranks' hosts from (on
one host, 127.0.0.1), and drops any message without the job's random token,
which travels over MPI/Gloo's broadcast.
"""
import os
import secrets
import socket
import sys
import threading
import time

BEAT = 1.0          # seconds between heartbeats
SILENT_BEATS = 5    # a peer silent this long is taken as stopped
EXIT_STATUS = 3     # a stopped run: resume it


class StallWatchdog:
    def __init__(self, hvd, timeout, prog="ringtrain"):
        self.rank, self.size, self.timeout, self.prog = hvd.rank(), hvd.size(), timeout, prog
        self.step = 0
        now = self.progress_at = time.monotonic()  # when this rank last finished a step
        # rank 0: rank -> [step, when last heard, when its step last advanced]
        self.peers = {r: [0, now, now] for r in range(1, self.size)} if self.rank == 0 else {}
        self.rank0 = [0, now]  # other ranks: rank 0's step, and when it last answered
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.address = None
        if self.size < 2 or not timeout:
            return
        self.hosts = hvd.allgather_object(socket.gethostname())
        address = None
        if self.rank == 0:
            self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.server.bind((listen_address(self.hosts), 0))
            self.server.listen(self.size)
            address = (*self.server.getsockname(), secrets.token_hex(16))
        # every rank learns where rank 0 listens, and the token, from rank 0
        self.address = hvd.broadcast_object(address, root_rank=0)

    def describe(self):
        if not self.address:
            return None
        host, port, _ = self.address
        return (f"stall watchdog: rank 0 listens on {host}:{port} for the ranks' heartbeats (token-checked); "
                f"no step on any rank for {self.timeout:g} s ends the job (--stall-timeout)")

    def start(self):
        if not self.address:
            return self
        targets = [self._accept] if self.rank == 0 else [self._heartbeat]
        for target in targets + [self._judge]:
            threading.Thread(target=target, daemon=True, name="ringtrain-stall-watchdog").start()
        return self

    def step_done(self, step):
        self.step, self.progress_at = step, time.monotonic()

    def stop(self):
        self.done.set()

    # --- rank 0 -------------------------------------------------------------------------

    def _accept(self):
        self.server.settimeout(BEAT)
        while not self.done.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        token = self.address[2]
        with conn, conn.makefile("rw") as stream:
            for line in stream:
                parts = line.split()
                if len(parts) != 3 or parts[0] != token or not parts[1].isdigit() or not parts[2].isdigit():
                    return  # not one of ours
                rank, step, now = int(parts[1]), int(parts[2]), time.monotonic()
                with self.lock:
                    if rank in self.peers:
                        entry = self.peers[rank]
                        entry[2] = now if step != entry[0] else entry[2]
                        entry[0], entry[1] = step, now
                stream.write(f"{self.step}\n")
                stream.flush()

    # --- other ranks -------------------------------------------------------------------------

    def _heartbeat(self):
        host, port, token = self.address
        while not self.done.is_set():
            try:
                with socket.create_connection((host, port), timeout=BEAT * SILENT_BEATS) as conn, \
                        conn.makefile("rw") as stream:
                    while not self.done.is_set():
                        stream.write(f"{token} {self.rank} {self.step}\n")
                        stream.flush()
                        answer = stream.readline()
                        if not answer.strip().isdigit():
                            break
                        with self.lock:
                            self.rank0 = [int(answer), time.monotonic()]
                        time.sleep(BEAT)
            except OSError:
                pass
            time.sleep(BEAT)

    # --- both --------------------------------------------------------------------------------------

    def _judge(self):
        while not self.done.wait(BEAT):
            now = time.monotonic()
            with self.lock:
                latest = max([self.progress_at] + [entry[2] for entry in self.peers.values()])
                rank0_heard = self.rank0[1]
            if self.rank == 0 and now - latest > self.timeout:
                self._end(self._verdict(now))
            # rank 0 judges; the others speak only if rank 0 went silent, a few beats later
            if self.rank != 0 and now - self.progress_at > self.timeout + BEAT * SILENT_BEATS \
                    and now - rank0_heard > BEAT * SILENT_BEATS:
                self._end(f"no step for {now - self.progress_at:.0f} s, and rank 0 ({self.hosts[0]}) stopped "
                          f"answering {now - rank0_heard:.0f} s ago at step {self.rank0[0]}: it is frozen or "
                          f"gone (rank {self.rank} is at step {self.step})")

    def _verdict(self, now):
        with self.lock:
            steps = {0: self.step, **{r: entry[0] for r, entry in self.peers.items()}}
            silent = {r: now - entry[1] for r, entry in self.peers.items() if now - entry[1] > BEAT * SILENT_BEATS}
        if silent:
            named = ", ".join(f"rank {r} ({self.hosts[r]}), silent for {s:.0f} s, last reported step {steps[r]}"
                              for r, s in sorted(silent.items()))
            what = f"stopped answering: {named}"
        else:
            low = min(steps.values())
            named = ", ".join(f"rank {r} ({self.hosts[r]})" for r, s in sorted(steps.items()) if s == low)
            what = f"{named} stuck at step {low}, alive but not stepping"
        others = ", ".join(f"{r}: {s}" for r, s in sorted(steps.items()) if r not in silent)
        return f"no step for {self.timeout:g} s (--stall-timeout); {what} (steps reached, by rank: {others})"

    def _end(self, what):
        sys.stderr.write(f"{self.prog}: error: {what}; ending the job: resume with --resume from the last "
                         f"checkpoint\n")
        sys.stderr.flush()
        os._exit(EXIT_STATUS)


def listen_address(hosts):
    """Where rank 0 listens: 127.0.0.1 when every rank is on its host; else
    the local address its routes use towards the other ranks' hosts (a UDP
    connect() sends nothing). 0.0.0.0 only if no host resolves."""
    me = socket.gethostname()
    others = [h for h in set(hosts) if h != me]
    if not others:
        return "127.0.0.1"
    for host in others:
        try:
            peer = socket.gethostbyname(host)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((peer, 9))
                return probe.getsockname()[0]
        except OSError:
            continue
    return "0.0.0.0"
