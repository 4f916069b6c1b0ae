"""Throughput measurement and the final JSON summary, one format for both modes.

Throughput is measured, never extrapolated: every worker times its own steps
(warm-up steps excluded) in fixed windows, and the global rate is all timed
samples over the slowest worker's timed seconds.
"""
import json
import math
import os
import socket
import sys
import time

from ringtrain.workloads import threadcpu
from ringtrain.workloads.numbers import percentile, quantiles

# Set by a launcher that reads a task's summary from its output: the printed
# line then holds everything, per-window rates included.
FULL_SUMMARY_LINE_ENV = "RINGTRAIN_FULL_SUMMARY_LINE"
WARMUP_STEPS = 3   # tracing, graph optimisation and first negotiations are not throughput
WINDOW_STEPS = 10  # steps per timed window; windows give the confidence interval


def interface_bytes():
    """(rx, tx) bytes so far of every interface but loopback in this process's
    network namespace: on a host of a cluster, what crossed its wire."""
    rx = tx = 0
    try:
        with open("/proc/net/dev") as f:
            for line in f.readlines()[2:]:
                name, counters = line.split(":", 1)
                if name.strip() != "lo":
                    fields = counters.split()
                    rx, tx = rx + int(fields[0]), tx + int(fields[8])
    except OSError:
        pass
    return rx, tx


class StepTimer:
    """One worker's timing: call step_done(samples) after every step. It also
    counts the bytes its host's interfaces moved during the timed steps."""

    def __init__(self, warmup_steps=WARMUP_STEPS, window_steps=WINDOW_STEPS):
        self.warmup_steps, self.window_steps = warmup_steps, window_steps
        self._net_start = self._net_end = None
        # per-thread CPU, read when windows close (cheap enough every 10 steps, not every step)
        self._cpu_start = self._cpu_end = None
        self._cpu_reading = threadcpu.SplitReader()
        self._cpu_start_time = self._cpu_end_time = None
        self.steps = 0
        self.samples = 0.0
        self.seconds = 0.0
        self.windows = []  # images/sec of each complete window
        self.step_seconds = []  # each timed step, end to end: its distribution
        self._last_step_end = time.perf_counter()
        self._updates = [None, None]  # the update counter at the start and the end of the timed steps
        self._window_start = self._window_samples = self._window_steps = None
        # wall-clock [start, end, samples] of each window: comparable across processes
        self.window_spans_unix = []
        self._last_step_end_unix = time.time()
        if warmup_steps == 0:
            self._start_window(self._last_step_end)

    def step_done(self, samples, update=None):
        """`update`: where the job's update counter (a PS global step) stood
        after this step, for the rate of updates over the timed steps."""
        now = time.perf_counter()
        previous, self._last_step_end = self._last_step_end, now
        self._last_step_end_unix = time.time()
        self.steps += 1
        if self.steps <= self.warmup_steps:
            if self.steps == self.warmup_steps:
                self._start_window(now)
                self._updates = [update, update]
            return
        self.step_seconds.append(now - previous)
        self._updates[1] = update
        self._window_samples += samples
        self._window_steps += 1
        self._net_end = interface_bytes()
        if self._window_steps == self.window_steps:
            self._close_window(now)

    def _start_window(self, now):
        if self._net_start is None:
            self._net_start = self._net_end = interface_bytes()
            self._cpu_start, self._cpu_start_time = self._cpu_reading(), now
        self._window_start, self._window_samples, self._window_steps = now, 0.0, 0
        self._window_start_unix = self._last_step_end_unix

    def _close_window(self, now):
        elapsed = now - self._window_start
        self.samples += self._window_samples
        self.seconds += elapsed
        self.windows.append(self._window_samples / elapsed if elapsed > 0 else 0.0)
        self.window_spans_unix.append([self._window_start_unix, self._last_step_end_unix, self._window_samples])
        self._cpu_end, self._cpu_end_time = self._cpu_reading(), now
        self._start_window(now)

    def report(self):
        """This worker's timed totals. A trailing partial window counts too,
        closed at the end of the last step, whenever report() is called."""
        # CPU covers the full windows only: a trailing partial window is closed
        # after the last step, when evaluation may already have run.
        cpu = threadcpu.percent_of_a_core(self._cpu_start, self._cpu_end,
                                          (self._cpu_end_time or 0) - (self._cpu_start_time or 0))
        if self._window_start is not None and self._window_steps:
            self._close_window(self._last_step_end)
        timed_steps = self.steps - max(self.warmup_steps, 0)
        net = [end - start for start, end in zip(self._net_start, self._net_end)] \
            if self._net_start else [0, 0]
        return {"samples": self.samples, "seconds": self.seconds, "windows": self.windows,
                "step_time_sec": self.seconds / timed_steps if timed_steps > 0 else 0.0,
                "window_spans_unix": self.window_spans_unix, "host": socket.gethostname(),
                "timed_steps": max(timed_steps, 0), "net_rx_bytes": net[0], "net_tx_bytes": net[1],
                "cpu_pct_of_core": cpu, "step_time_p50_sec": percentile(self.step_seconds, 50),
                "step_time_p99_sec": percentile(self.step_seconds, 99),
                # (to the microsecond: 100 numbers a worker, whatever the run's length)
                "step_time_quantiles_sec": [round(q, 6) for q in quantiles(self.step_seconds) or []] or None,
                "updates_timed": (self._updates[1] - self._updates[0]
                                  if None not in self._updates else None)}


def measured_throughput(reports):
    """Global numbers from every worker's StepTimer.report()."""
    slowest = max((r["seconds"] for r in reports), default=0.0)
    total = float(sum(r["samples"] for r in reports))
    return {
        "images_per_sec": total / slowest if slowest > 0 else 0.0,
        # (None for a worker that timed no step, e.g. a PS worker that made no more than
        # its warm-up while the others made the updates: not measured is not 0 img/s)
        "images_per_sec_per_worker": [r["samples"] / r["seconds"] if r["seconds"] > 0 else None
                                      for r in reports],
        "window_images_per_sec": [r["windows"] for r in reports],
        "step_time_sec": [r["step_time_sec"] for r in reports],
        "timed_samples": total,
        "timed_seconds": slowest,
        "window_spans_unix": [r.get("window_spans_unix") for r in reports],
        # each worker's host, and what that host's interfaces moved during its timed steps
        "network": [{"host": r.get("host"), "timed_steps": r.get("timed_steps"),
                     "rx_bytes": r.get("net_rx_bytes"), "tx_bytes": r.get("net_tx_bytes")} for r in reports],
        # each worker's CPU during its full timed windows, as % of one core
        "cpu_pct_of_core": [r.get("cpu_pct_of_core") for r in reports],
        # each worker's distribution of timed step times (a straggler's peers wait in theirs)
        "step_time_p50_sec": [r.get("step_time_p50_sec") for r in reports],
        "step_time_p99_sec": [r.get("step_time_p99_sec") for r in reports],
        # and the whole of it, as 100 equally likely values (what a synchronous step waits for)
        "step_time_quantiles_sec": [r.get("step_time_quantiles_sec") for r in reports],
    }


def build_summary(mode, config, dataset, *, world_size, steps, epochs, train_loss, evaluation,
                  wall_seconds, reports, **mode_fields):
    """The final summary, one format for every mode: what ran (`config`: the
    run's workloads.config.RunConfig), how well it learned (`evaluation`:
    workloads.evaluation.Evaluation over the whole test split), and the
    throughput measured from every worker's `reports` (StepTimer.report()).
    Mode-specific fields (controller, num_ps, staleness, placement...) come in
    as keywords."""
    return {
        "mode": mode, "model": config.model.name, "data": config.flags.get("data"),
        "data_source": getattr(dataset, "where", None), "world_size": world_size, "steps": int(steps), "epochs": epochs,
        "train_loss": train_loss, "test_accuracy": evaluation.accuracy, "test_loss": evaluation.loss,
        "test_samples": int(evaluation.samples), "wall_time_sec": wall_seconds,
        **measured_throughput(reports), **mode_fields, "config": config.flags,
    }


def strict(value):
    """`value` with every non-finite float as None: JSON has no NaN or Infinity,
    and a parser that follows the standard rejects them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def dumps(value, **kw):
    """json.dumps, strict: NaN and infinities become null; a parsed flag value
    (e.g. --straggler's) is written as its text."""
    return json.dumps(strict(value), allow_nan=False, default=str, **kw)


# Left out of the printed line (mpirun's output forwarding splits lines near 2 KB),
# kept in the --summary-json file.
FILE_ONLY_FIELDS = ("window_images_per_sec", "window_spans_unix", "step_time_quantiles_sec", "config")


def emit(summary, path=None, stream=None):
    """Print the summary as the last stdout line, less what only the file
    keeps (FILE_ONLY_FIELDS); write all of it atomically to path."""
    stream = stream or sys.stdout
    shown = summary if os.environ.get(FULL_SUMMARY_LINE_ENV) else \
        {k: v for k, v in summary.items() if k not in FILE_ONLY_FIELDS}
    stream.write(dumps(shown, sort_keys=True) + "\n")
    stream.flush()
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # checked at start-up
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(dumps(summary, sort_keys=True) + "\n")
        os.replace(tmp, path)
