"""The few statistics and number formats the summaries and the bench share."""
import math
import statistics


def median(values):
    """The median of the values that are not None; None if there are none."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def mean(values):
    values = [v for v in (values or []) if v is not None]
    return sum(values) / len(values) if values else None


def percentile(values, q):
    """Nearest-rank percentile q (0-100) of `values`; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def quantiles(values, count=100):
    """`count` equally likely values that stand for the distribution of `values`:
    the nearest-rank percentiles at the middles of `count` equal slices (None if
    empty). Bounded in size however many values there are."""
    if not values:
        return None
    ordered = sorted(values)
    return [ordered[min(len(ordered) - 1, int((i + 0.5) / count * len(ordered)))] for i in range(count)]


def histogram_percentile(histogram, q):
    """Nearest-rank percentile of {value: count}; None if empty."""
    total, seen = sum(histogram.values()), 0
    for value in sorted(histogram):
        seen += histogram[value]
        if seen >= q / 100 * total:
            return value
    return None


def percent(value, signed=False, digits=0, fraction=False):
    """'12%' (or '+12%'), 'n/a' for None; fraction=True: value is a fraction (0.12)."""
    if value is None:
        return "n/a"
    value = 100 * value if fraction else value
    return f"{value:+.{digits}f}%" if signed else f"{value:.{digits}f}%"
