"""No silent hang, in every mode: a worker that stops stepping, or a server
task that stops answering, is named, and the job ends, or goes on without
it where training can. One watchdog thread per training process.

Progress is counted in training steps. A frozen process still accepts TCP
connections (the kernel answers for it) and keeps its sockets, so neither a
port check nor the frameworks' own stall warnings can see it: Horovod's
runs in its background thread, which waits in the same collective as
everyone else. So every training process sends the chief its step each
second over a channel of its own, and the chief answers with its own step:

- the chief names a worker whose step has not moved for --stall-timeout
  seconds (it stopped answering: frozen or gone; or it answers but does not
  step); where training waits for every worker (ring, sync PS with every
  worker per update), that ends the job; elsewhere the chief says so once
  and goes on without it;
- when nobody steps, the gRPC server tasks a mode depends on are asked, and
  one that does not answer (a frozen PS task, say) is named;
- a worker whose chief stops answering ends the job;
- the server tasks a process depends on (PS tasks, an in-graph client)
  are pinged every second: one that is gone ends the job at once.

The chief listens on the address it reaches the other workers' hosts from
(on one host, 127.0.0.1) and drops any message without the job's random
token, which travels by the mode's own broadcast.
"""
import os
import secrets
import signal
import socket
import sys
import threading
import time

from ringtrain.multihost.net import grpc_answers, is_listening
from ringtrain.common.errors import EXIT_STOPPED, exit_now, first_line
from ringtrain.workloads.mode import Topology

BEAT = 1.0          # seconds between heartbeats
SILENT_BEATS = 5    # a peer silent this long is taken as stopped
PING_MISSES = 2     # consecutive failed connects before a server task counts as gone
FINISHED = -1       # a worker that is done says so, not to be taken for frozen
# How much longer a framework's own timeout for a silent peer (TF's coordination heartbeat,
# Gloo's) waits than --stall-timeout, so that the watchdog names the peer first: TF's own
# default heartbeat timeout (coordination_service.cc).
AFTER_THE_WATCHDOG = 10.0  # s


class StallWatchdog:
    """`agree`: the mode's Agreement (rank, size, broadcast, hosts of its
    processes); `timeout`: --stall-timeout (0: progress is not watched);
    `topology`: who the processes are (workloads.mode.Topology): what to call
    process r ("rank 1 (h2)", "worker 1 at h2:2222"), whether training stops
    without any one worker, the TF gRPC servers it depends on (pinged: gone
    ends the job; asked when nobody steps: a frozen one is named), more servers
    to ask then, and how to go on after the job ended."""

    def __init__(self, agree, timeout, prog, topology=Topology()):
        self.rank, self.size, self.timeout, self.prog = agree.rank, agree.size, timeout, prog
        self.waits_for_all, self.servers, self.advice = topology.waits_for_all, list(topology.servers), topology.advice
        self.asked = list(dict.fromkeys(list(topology.servers) + list(topology.frozen_candidates)))
        self.names = topology.name
        self.step = 0
        now = self.progress_at = time.monotonic()  # when this process last finished a step
        # chief: process -> [step, when last heard, when its step last moved]
        self.peers = {r: [0, now, now] for r in range(1, self.size)} if self.rank == 0 else {}
        self.chief = [0, now]  # other processes: the chief's step, and when it last answered
        self.pids = {}         # chief: each process's PID, from its heartbeats
        self.warned, self.lock, self.done = set(), threading.Lock(), threading.Event()
        # (other processes: beat now, not at the next beat; the chief has heard "finished")
        self.beat_now, self.finish_heard = threading.Event(), threading.Event()
        self.judged = 0.0  # when progress was last judged (once a beat)
        self.first_step_at = None  # nobody is stuck from before this process took its first step
        self.woke = None   # when this process woke from a freeze of its own (a long gap between rounds)
        self.address = None
        self.listener = None
        if self.size > 1 and timeout:
            self.hosts, address = agree.hosts(), None  # (every process: it may be a collective)
            if self.rank == 0:
                self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                self.listener.bind((listen_address(self.hosts), 0))
                self.listener.listen(self.size)
                address = (*self.listener.getsockname(), secrets.token_hex(16))
            # every process learns where the chief listens, and the token, from the chief
            self.address = agree.broadcast(address)

    def describe(self):
        if not self.address:
            return None
        host, port, _ = self.address
        return (f"stall watchdog: {self.names(0)} listens on {host}:{port} for the heartbeats of the others "
                f"(token-checked); a worker with no step for {self.timeout:g} s is named (--stall-timeout)")

    def start(self):
        if not (self.timeout or self.servers):
            return self
        targets = [self._judge]
        if self.address:
            targets.append(self._accept if self.rank == 0 else self._heartbeat)
        for target in targets:
            threading.Thread(target=target, daemon=True, name="ringtrain-stall-watchdog").start()
        return self

    def step_done(self, step):
        self.step, self.progress_at = step, time.monotonic()
        if self.first_step_at is None:
            self.first_step_at = self.progress_at

    def training_done(self):
        """This process has finished its steps: it is no longer watched for
        progress. Another process stops its watchdog after one more beat, which
        tells the chief; the chief goes on watching the others until close()."""
        self.step = FINISHED
        if self.rank != 0:
            if self.address:
                self.beat_now.set()
                self.finish_heard.wait(BEAT * 1.5)
            self.done.set()

    def explain(self, error):
        """The training thread failed because a peer is gone (TF's
        UnavailableError, say): give the pings time to find which one and end
        the job naming it; otherwise end it with TF's own first line."""
        if self.servers and not self.done.is_set():
            time.sleep(BEAT * (PING_MISSES + 2))
        self._end(f"a task this one depends on stopped answering ({first_line(error)}); training cannot go on")

    def close(self):
        self.done.set()
        if self.listener:
            self.listener.close()

    def gone(self):
        """The workers the chief need not wait for: named and left behind, or
        silent for a few beats (dead or frozen) and not finished."""
        now = time.monotonic()
        with self.lock:
            silent = {r for r, (step, heard, _) in self.peers.items()
                      if step != FINISHED and now - heard > BEAT * SILENT_BEATS}
            return set(self.warned) | silent

    # --- the chief -------------------------------------------------------------------------

    def _accept(self):
        self.listener.settimeout(BEAT)
        while not self.done.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        token = self.address[2]
        with conn, conn.makefile("rw") as stream:
            for line in stream:
                parts = line.split()
                if len(parts) != 4 or parts[0] != token or not parts[1].isdigit() \
                        or not parts[2].lstrip("-").isdigit() or not parts[3].isdigit():
                    return  # not one of ours
                rank, step, now = int(parts[1]), int(parts[2]), time.monotonic()
                with self.lock:
                    self.pids[rank] = int(parts[3])
                    if rank in self.peers:
                        entry = self.peers[rank]
                        entry[2] = now if step != entry[0] else entry[2]
                        entry[0], entry[1] = step, now
                stream.write(f"{self.step} {os.getpid()}\n")
                stream.flush()

    # --- the other processes ---------------------------------------------------------------

    def _heartbeat(self):
        host, port, token = self.address
        while not self.done.is_set():
            try:
                with socket.create_connection((host, port), timeout=BEAT * SILENT_BEATS) as conn, \
                        conn.makefile("rw") as stream:
                    while not self.done.is_set():
                        step = self.step
                        stream.write(f"{token} {self.rank} {step} {os.getpid()}\n")
                        stream.flush()
                        answer = stream.readline().split()
                        if len(answer) != 2 or not answer[0].lstrip("-").isdigit() or not answer[1].isdigit():
                            break
                        with self.lock:
                            self.chief = [int(answer[0]), time.monotonic()]
                            self.pids[0] = int(answer[1])
                        if step == FINISHED:
                            self.finish_heard.set()
                        self.beat_now.wait(BEAT)
                        self.beat_now.clear()
            except OSError:
                pass
            time.sleep(BEAT)

    # --- every process --------------------------------------------------------------------

    def _judge(self):
        misses = {address: 0 for _, address in self.servers}
        seen, wait, last_round = set(), 0, time.monotonic()
        while not self.done.wait(wait):
            if time.monotonic() - last_round > BEAT * SILENT_BEATS:
                self.woke = time.monotonic()  # this process was frozen itself: its peers went on without it
            last_round = time.monotonic()
            # A server task counts only once it has answered: a client may start before its servers.
            # Until every one has, look often: one that dies a second in must not go unseen.
            wait = BEAT if len(seen) == len(misses) else BEAT / 4
            for who, address in self.servers:
                if is_listening(address):
                    misses[address] = 0
                    seen.add(address)
                elif address in seen:
                    misses[address] += 1
                if misses[address] >= PING_MISSES and not self.done.is_set():
                    self._end(f"{who} at {address} stopped answering; training cannot go on")
            now = time.monotonic()
            if not self.timeout or now - self.judged < BEAT:
                continue
            self.judged = now
            if self.rank == 0:
                self._judge_workers(now)
            else:
                with self.lock:
                    chief_heard, chief_step = self.chief[1], self.chief[0]
                # A few beats after the chief would have spoken: a process that was frozen itself
                # (and is woken, SIGCONT, to be ended) must not blame the chief first.
                if self.address and chief_step != FINISHED and now - chief_heard > self.timeout + SILENT_BEATS * BEAT:
                    self._end_frozen_here([0])
                    self._end(f"the chief, {self.names(0)}, stopped answering {now - chief_heard:.0f} s ago at "
                              f"step {chief_step}: it is frozen or gone ({self.names(self.rank)} is at step "
                              f"{self.step})")

    def _judge_workers(self, now):
        with self.lock:
            # (a peer's step is judged from the chief's first step on: the first step traces the graph)
            since = self.first_step_at or now
            active = {r: [entry[0], entry[1], max(entry[2], since)] for r, entry in self.peers.items()
                      if entry[0] != FINISHED and r not in self.warned}
        stuck = {r for r, entry in active.items() if now - entry[2] > self.timeout}
        training = self.step != FINISHED  # (once the chief is done, nobody is waited for)
        if training and now - self.progress_at > self.timeout and stuck == set(active):
            self._end(self._verdict(now, active))  # nobody steps
        if stuck and training and self.waits_for_all:
            self._end(self._verdict(now, active))
        for r in sorted(stuck):
            with self.lock:
                self.warned.add(r)
            self._say(f"{self._what(r, now, active[r])} (--stall-timeout {self.timeout:g}); training goes on "
                      "without it")

    def _what(self, r, now, entry):
        step, heard, moved = entry
        if now - heard > BEAT * SILENT_BEATS:
            return f"{self.names(r)} stopped answering {now - heard:.0f} s ago at step {step}: it is frozen or gone"
        return f"{self.names(r)} answers but took no step for {now - moved:.0f} s (at step {step})"

    def _verdict(self, now, peers):
        silent = [r for r, entry in sorted(peers.items())
                  if now - entry[2] > self.timeout and now - entry[1] > BEAT * SILENT_BEATS]
        frozen = [self._what(r, now, peers[r]) for r in silent]
        self._end_frozen_here(silent)
        if not frozen:
            # A frozen process accepts connections (its kernel does), but its gRPC server says nothing.
            frozen = [f"{who} at {address} does not answer (frozen or overloaded)"
                      for who, address in self.asked if not grpc_answers(address)][:1]
        steps = ", ".join(f"{self.names(r)}: {s}" for r, s in
                          sorted({0: self.step, **{r: entry[0] for r, entry in peers.items()}}.items()))
        what = "; ".join(frozen) or ("every worker answers, but none steps" if peers else
                                     "the training step has not returned")
        if self.waits_for_all and peers:
            what += "; every update waits for every worker"
        return f"no training step for {self.timeout:g} s (--stall-timeout): {what} (steps reached: {steps})"

    def _end_frozen_here(self, ranks):
        """Frozen processes on this host are ended (SIGKILL, by their PID): they
        would hold their launcher (horovodrun's elastic driver waits for every rank
        to report after a failure), or be left behind by a job started by hand."""
        here = socket.gethostname()
        for r in ranks:
            if self.hosts[r] == here and self.pids.get(r):
                try:
                    os.kill(self.pids[r], signal.SIGKILL)
                except OSError:
                    pass

    def _say(self, what):
        sys.stdout.write(f"{self.prog}: {what}\n")
        sys.stdout.flush()

    def _end(self, what):
        if self.woke is not None and time.monotonic() - self.woke < self.timeout + BEAT * SILENT_BEATS * 2:
            # Frozen itself a moment ago (and woken to be ended): what it sees missing went on
            # without it, and whoever named it has spoken. Not a word from here.
            exit_now(EXIT_STOPPED)
        sys.stderr.write(f"{self.prog}: error: {what}; ending the job: {self.advice}\n")
        exit_now(EXIT_STOPPED)


def listen_address(hosts):
    """Where the chief listens: 127.0.0.1 when every process is on its host;
    else the local address its routes use towards the other hosts (a UDP
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
