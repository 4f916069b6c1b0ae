"""Each worker's end-of-training report, and the chief's final summary built
from all of them (throughput is every worker's own measurement, never the
chief's rate times N)."""
import json
from dataclasses import asdict, dataclass, field

from workloads.summary import measured_throughput


@dataclass
class WorkerReport:
    task_index: int
    local_steps: int
    timer: dict                  # StepTimer.report()
    loss_sum: float = 0.0        # over the last --log-every steps
    loss_count: float = 0.0
    staleness: list = field(default_factory=lambda: [0, 0, 0])  # [sum, count, max]

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

    def add(self, read_step, applied_step):
        stale = max(int(applied_step) - int(read_step) - 1, 0)  # minus our own update
        self.total, self.count, self.max = self.total + stale, self.count + 1, max(self.max, stale)

    def as_list(self):
        return [self.total, self.count, self.max]


def summary(mode, args, dataset, num_workers, num_ps, reports, global_step, epochs,
            evaluation, wall_seconds, extra=None):
    """The final JSON summary, in ring mode's format plus num_ps (and staleness
    for async). `evaluation` is (correct, loss_sum, samples) on the test split."""
    correct, test_loss_sum, seen = evaluation
    loss_count = sum(r.loss_count for r in reports)
    result = {
        "mode": mode, "model": args.model, "dataset": args.dataset,
        "data_source": dataset.source, "world_size": num_workers, "num_ps": num_ps,
        "steps": int(global_step), "epochs": epochs,
        "train_loss": sum(r.loss_sum for r in reports) / loss_count if loss_count else None,
        "test_accuracy": correct / seen if seen else None,
        "test_loss": test_loss_sum / seen if seen else None,
        "test_samples": int(seen), "wall_time_sec": wall_seconds,
        "reporting_workers": sorted(r.task_index for r in reports),
        **measured_throughput([r.timer for r in reports]),
        "config": {k: v for k, v in sorted(vars(args).items()) if k != "func"},
    }
    if mode in ("ps-async", "ps-tf2"):
        total = sum(r.staleness[0] for r in reports)
        count = sum(r.staleness[1] for r in reports)
        result["staleness_mean"] = total / count if count else 0.0
        result["staleness_max"] = max((r.staleness[2] for r in reports), default=0)
    result.update(extra or {})
    return result
