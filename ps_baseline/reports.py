"""The staleness of async PS updates: how many other updates landed
between a worker's read of the weights and its own update."""


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
    """Async summary fields from the workers' reports (each with `staleness`,
    [sum, count, max], and `staleness_histogram`): mean, max, p50, p99 and
    the histogram over every reported update."""
    from ringtrain.workloads.numbers import histogram_percentile
    total = sum(r["staleness"][0] for r in reports)
    count = sum(r["staleness"][1] for r in reports)
    histogram = {}
    for r in reports:
        for stale, n in r.get("staleness_histogram", {}).items():
            histogram[int(stale)] = histogram.get(int(stale), 0) + n
    return {"staleness_mean": total / count if count else 0.0,
            "staleness_max": max((r["staleness"][2] for r in reports), default=0),
            "staleness_p50": histogram_percentile(histogram, 50),
            "staleness_p99": histogram_percentile(histogram, 99),
            "staleness_histogram": {str(k): histogram[k] for k in sorted(histogram)}}
