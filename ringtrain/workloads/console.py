"""What a user sees of a run, the same in every mode: a start line, then
progress (a bar when stdout is a terminal, a line every --log-every steps
otherwise), a short summary for people, and the machine-readable JSON line
last. Only the process that speaks for the run (rank 0, the PS chief) shows
the bar and the summary."""
import json
import os
import sys
import time

from ringtrain.workloads.summary import FULL_SUMMARY_LINE_ENV, emit

BAR_WIDTH = 24
# Set by a launcher that shows the chief's progress itself (ps-baseline launch): the
# chief writes its progress as data, one JSON line {"progress": {...}} each time.
PROGRESS_AS_DATA_ENV = "RINGTRAIN_PROGRESS_AS_DATA"


class Console:
    def __init__(self, enabled=True, prefix="", stream=None, bar=None):
        self.stream = stream or sys.stdout
        self.enabled, self.prefix = enabled, prefix
        self.as_data = enabled and bar is not False and bool(os.environ.get(PROGRESS_AS_DATA_ENV))
        self.bar = enabled and not self.as_data and (on_a_terminal(self.stream) if bar is None else bar)
        self._bar_open = False
        self._since = time.perf_counter()

    def line(self, text, prefixed=True):
        if not self.enabled:
            return
        self._close_bar()
        # One write per line: launchers that prefix each rank's output split partial writes.
        self.stream.write(f"{self.prefix if prefixed else ''}{text}\n")
        self.stream.flush()

    def begin(self, text):
        """The run's first line; img/s counts from here."""
        self.line(text)
        self._since = time.perf_counter()

    def progress(self, step, total, text, samples=None):
        """Step `step` of `total`; `samples`: all workers' samples since the
        last call, for the img/s shown."""
        now = time.perf_counter()
        if samples is not None and now > self._since:
            text += f" {samples / (now - self._since):,.0f} img/s"
        self._since = now
        if self.as_data:
            self.line(json.dumps({"progress": {"step": step, "total": total, "text": self.prefix + text}}),
                      prefixed=False)
            return
        if not self.bar:
            self.line(text)
            return
        done = int(BAR_WIDTH * min(step / total, 1.0)) if total else BAR_WIDTH
        self.stream.write(f"\r{self.prefix}[{'#' * done}{'.' * (BAR_WIDTH - done)}] {text}\033[K")
        self.stream.flush()
        self._bar_open = True
        if step >= total:
            self._close_bar()

    def _close_bar(self):
        if self._bar_open:
            self.stream.write("\n")
            self._bar_open = False

    def finish(self, summary, path=None):
        """A few lines for people, then the JSON summary as the last line."""
        if not self.enabled:
            return
        if not os.environ.get(FULL_SUMMARY_LINE_ENV):  # (a launcher reads it and summarises itself)
            for text in human_summary(summary, path):
                self.line(text)
        self._close_bar()
        emit(summary, path, self.stream)


def on_a_terminal(stream):
    """Whether a person watches `stream`. OpenMPI gives every rank a pty,
    whatever mpirun's own output is, so under a launcher (the rank's parent
    is mpirun) that parent's stdout decides."""
    if not stream.isatty():
        return False
    if not any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "HOROVOD_SIZE")):
        return True
    try:
        return os.readlink(f"/proc/{os.getppid()}/fd/1").startswith(("/dev/pts/", "/dev/tty"))
    except OSError:
        return False


def human_summary(s, path=None):
    workers = s.get("world_size")
    lines = [f"{'stopped' if s.get('stopped') else 'done'}: {s.get('steps')} steps ({s.get('epochs') or 0:.2f} epochs) of {s.get('model')} "
             f"in {s.get('wall_time_sec') or 0:.1f} s, {s.get('mode')} mode, {workers} worker(s)"]
    if s.get("test_accuracy") is not None:
        lines.append(f"test accuracy {100 * s['test_accuracy']:.2f} % on {s.get('test_samples')} "
                     f"samples (loss {_number(s.get('test_loss'))})" + _train_loss(s.get("train_loss")))
    lines.append(f"throughput {s.get('images_per_sec') or 0:,.0f} img/s, measured across "
                 f"{workers} worker(s), warm-up excluded")
    if s.get("checkpoint"):
        lines.append(f"checkpoint {s['checkpoint']}")
    if path:
        lines.append(f"summary written to {path}")
    return lines


def _train_loss(value):
    return "" if value is None else f"; train loss {_number(value)}"


def _number(value):
    """A loss, or what it was when it is not a number (strict JSON writes null)."""
    return "not a number" if value is None or value != value else f"{value:.4f}"
