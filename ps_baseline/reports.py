"""Each worker's end-of-training report, which the chief gathers for the
summary (throughput is every worker's own measurement, never the chief's rate
times N), and the staleness of async updates."""
import json
from dataclasses import asdict, dataclass, field


@dataclass
class WorkerReport:
    task_index: int
    local_steps: int
    timer: dict                  # StepTimer.report()
    loss_sum: float = 0.0        # over the last --log-every steps
    loss_count: float = 0.0
    staleness: list = field(default_factory=lambda: [0, 0, 0])  # [sum, count, max]
    staleness_histogram: dict = field(default_factory=dict)     # {staleness: updates}
    straggler_wait_sec: float = 0.0                             # --straggler: seconds waited

    def to_json(self):
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text):
        return cls(**json.loads(text))


class Staleness:
    """Global-step difference between reading the weights and applying the
    gradient: how many other updates landed in between."""

    def __init__(self):
        self.total, self.count, self.max = 0, 0, 0
        self.histogram = {}

    def add(self, read_step, applied_step):
        stale = max(int(applied_step) - int(read_step) - 1, 0)  # minus our own update
        self.total, self.count, self.max = self.total + stale, self.count + 1, max(self.max, stale)
        self.histogram[str(stale)] = self.histogram.get(str(stale), 0) + 1

    def as_list(self):
        return [self.total, self.count, self.max]


def staleness_fields(reports):
    """Async summary fields: mean and max staleness over every reported update."""
    total = sum(r.staleness[0] for r in reports)
    count = sum(r.staleness[1] for r in reports)
    histogram = {}
    for r in reports:
        for stale, n in r.staleness_histogram.items():
            histogram[int(stale)] = histogram.get(int(stale), 0) + n
    return {"staleness_mean": total / count if count else 0.0,
            "staleness_max": max((r.staleness[2] for r in reports), default=0),
            "staleness_p50": _percentile(histogram, 50), "staleness_p99": _percentile(histogram, 99),
            "staleness_histogram": {str(k): histogram[k] for k in sorted(histogram)}}


def _percentile(histogram, q):
    """Nearest-rank percentile of {value: count}; None if empty."""
    total, seen = sum(histogram.values()), 0
    for value in sorted(histogram):
        seen += histogram[value]
        if seen >= q / 100 * total:
            return value
    return None
