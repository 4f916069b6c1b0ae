"""Means with 95% confidence intervals, and the alpha-beta cost model."""
import math

import numpy as np


def mean_ci95(samples):
    """(mean, half-width of the 95% CI) by Student's t; half-width is None
    with fewer than 2 samples."""
    xs = np.asarray([x for x in samples if x is not None and math.isfinite(x)], float)
    if xs.size == 0:
        return float("nan"), None
    if xs.size < 2:
        return float(xs.mean()), None
    from scipy import stats
    half = stats.t.ppf(0.975, xs.size - 1) * xs.std(ddof=1) / math.sqrt(xs.size)
    return float(xs.mean()), float(half)


def expected_slowest(values, n):
    """E[the slowest of n independent draws] from the distribution of
    `values`, each equally likely: exact, as the chance that all n draws fall
    at or below each value is its share to the power n."""
    xs = sorted(values)
    m = len(xs)
    at_or_below = [(i / m) ** n for i in range(m + 1)]  # P(the slowest <= xs[i - 1])
    return float(sum(x * (at_or_below[i + 1] - at_or_below[i]) for i, x in enumerate(xs)))


def sync_wait_seconds(values, n):
    """What a synchronous step of n workers waits beyond their mean compute:
    each step ends with its slowest worker's, E[slowest of n] - mean, the
    compute steps' spread (`values`, equally likely) taken as independent
    between workers and steps."""
    if not values:
        return None
    if n <= 1:
        return 0.0
    return expected_slowest(values, n) - sum(values) / len(values)


def normal_steps(mean, spread, count=100_000):
    """A step of `mean` seconds whose standard deviation is `spread` of it, as
    `count` equally likely values (the normal's quantiles): what
    sync_wait_seconds reads. 100,000 hold the tail that the slowest of 512
    draws reaches (E[it] 3.0435 standard deviations above the mean; 3.0439 by
    numerical integration)."""
    from statistics import NormalDist
    steps = NormalDist(mean, spread * mean)
    return [steps.inv_cdf((i + 0.5) / count) for i in range(count)] if spread else [mean]


def ring_allreduce_seconds(nbytes, ranks, alpha, beta):
    """Ring allreduce of nbytes over `ranks`: 2(n-1) latency-bound steps, and
    2(n-1)/n of the buffer sent and received by every rank."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * nbytes * beta


def ps_exchange_seconds(nbytes, workers, num_ps, alpha, beta):
    """One push and one pull through a PS task's link, the workers one after
    the other: each of P tasks serves W*S/P bytes in and W*S/P out. (The
    single-PS push/pull bench fits α and β with this at W = P = 1.)"""
    return 2 * (workers * alpha + workers * nbytes / num_ps * beta)


def link_loads(worker_hosts, ps_hosts, ps_bytes):
    """Bytes each host sends in one push of every worker's gradients to every
    PS task on another host (a pull sends the same, the other way), and
    receives: ({host: out}, {host: in})."""
    out, into = {}, {}
    for w in worker_hosts:
        for p, nbytes in zip(ps_hosts, ps_bytes):
            if w != p:
                out[w] = out.get(w, 0) + nbytes
                into[p] = into.get(p, 0) + nbytes
    return out, into


def forward_and_backward(seconds):
    """A step's forward and backward passes: a third and two thirds of it."""
    return seconds / 3, seconds * 2 / 3


def ring_step_seconds(compute, backward, layer_bytes, allreduce_seconds):
    """A ring-mode step: Horovod starts allreducing a layer's gradients once
    backprop has made them (backprop_exchange), so only what outlasts the
    backward pass adds to the compute. `layer_bytes`: each layer's gradient
    bytes in forward order; `allreduce_seconds(nbytes)`: one allreduce. (TF's
    collective mode: exchange_in_buckets.)"""
    return compute + backprop_exchange(backward, layer_bytes, allreduce_seconds)["exposed"]


def backprop_exchange(backward, layer_bytes, allreduce_seconds):
    """Horovod's overlap of the exchange with backprop: backprop reaches the
    layers last to first, each in an equal share of `backward`, and a layer's
    gradients are ready when its share ends. One allreduce runs at a time, and
    each takes every gradient ready when it starts (tensor fusion; Horovod's
    cycle time, fusion threshold and negotiation are left out). So the
    gradients backprop makes last are sent after it ends, whatever the link.
    {"exchange": seconds of allreduce in all, "exposed": seconds past the end
    of the backward pass, "allreduces": how many}."""
    ready = [backward * (k + 1) / len(layer_bytes) for k in range(len(layer_bytes))]
    sizes = list(reversed(layer_bytes))
    free, busy, count, k = 0.0, 0.0, 0, 0
    while k < len(sizes):
        start = max(free, ready[k])
        nbytes = 0
        while k < len(sizes) and ready[k] <= start:
            nbytes, k = nbytes + sizes[k], k + 1
        took = allreduce_seconds(nbytes)
        free, busy, count = start + took, busy + took, count + 1
    return {"exchange": busy, "exposed": max(0.0, free - backward), "allreduces": count}


def exchange_in_buckets(backward, layer_bytes, buckets, allreduce_seconds):
    """An exchange in buckets (lists of layer indices): a bucket's all-reduce
    starts once backprop has made its last gradient and the bucket ready
    before it is done (one at a time, in the order they become ready). Ring
    mode's buckets: workloads.gradients.ring_buckets; TF collective mode's:
    tf_buckets. Layers as in backprop_exchange; returns the same fields."""
    n = len(layer_bytes)
    ready = lambda bucket: max(backward * (n - k) / n for k in bucket)  # (backprop: layer k of n, last to first)
    free, busy = 0.0, 0.0
    for bucket in sorted(buckets, key=ready):
        took = allreduce_seconds(sum(layer_bytes[k] for k in bucket))
        free, busy = max(free, ready(bucket)) + took, busy + took
    return {"exchange": busy, "exposed": max(0.0, free - backward), "allreduces": len(buckets)}


def ps_step_seconds(compute, forward, backward, worker_hosts, ps_hosts, ps_bytes, alpha, beta, sync=True):
    """A PS step, the mean over workers. Gradients are pushed as backprop
    produces them and weights pulled as the forward pass reads them, so a
    push of T seconds shows only max(0, T - backward), a pull max(0, T - forward),
    each plus one alpha. Sync: every worker pushes at once, then pulls at once,
    so T is the busiest link's load one way (a PS's inbound link carries every
    remote worker's share) times beta, the same for all. Async: workers are out
    of phase; a worker's own transfers take its own bytes times beta, but a
    round of every remote worker's step cannot beat the busiest link, whose two
    directions now carry pushes and pulls at once; a worker whose PS tasks are
    all on its own host uses no link."""
    out, into = link_loads(worker_hosts, ps_hosts, ps_bytes)
    busiest = max(list(out.values()) + list(into.values()), default=0)
    if not busiest:
        return compute
    exchange = lambda seconds: 2 * alpha + max(0.0, seconds - backward) + max(0.0, seconds - forward)
    if sync:
        return compute + exchange(busiest * beta)
    steps = [max(compute + exchange(out.get(w, 0) * beta), busiest * beta + 2 * alpha) if out.get(w) else compute
             for w in worker_hosts]
    return sum(steps) / len(steps)


def ring_wire_bytes(hosts_by_rank, nbytes):
    """Bytes sent over host links in one ring allreduce of nbytes: each rank
    sends 2(n-1)/n of the buffer to the next rank, which crosses a wire only
    where that rank is on another host."""
    n = len(hosts_by_rank)
    return sum(2 * (n - 1) / n * nbytes for r in range(n) if hosts_by_rank[r] != hosts_by_rank[(r + 1) % n])


def ps_wire_bytes(worker_hosts, ps_hosts, ps_bytes):
    """Bytes each worker's step sends over host links: it pushes its gradient
    share to, and pulls the weights back from, every PS task on another host."""
    return [2 * sum(nbytes for p, nbytes in zip(ps_hosts, ps_bytes) if p != w) for w in worker_hosts]


# Where a fit's second line begins (fit_lines): Horovod over Gloo across simulated hosts took about
# 1 ms a hop for an 80 KB all-reduce, which the line fitted from 1 MB up put at 0.2 ms
# (DEVELOPERS.md 4.14).
SMALL_BELOW = 2**20


def fit_lines(rows, ranks=None, model="ring", small_below=SMALL_BELOW):
    """fit_alpha_beta on the rows of `small_below` bytes and up, where
    bandwidth sets the time; with, as its "small", a second line fitted on
    the rows below, where each hop's latency does. (A line from 1 MB up puts
    α near 0: it cannot price the small all-reduces a step also makes, and
    one line through both ends fits neither.) Without rows on both sides (two
    sizes below), one line."""
    points = as_points(rows, ranks)
    large = [p for p in points if p[0] >= small_below]
    small = [p for p in points if p[0] < small_below]
    fit = fit_alpha_beta(large or points, model=model)
    below = fit_alpha_beta(small, model=model) if fit and large and len({p[0] for p in small}) >= 2 else None
    if below:
        fit["small"] = dict(below, below_bytes=small_below)
    return fit


def ring_allreduce_on(fit, nbytes, ranks):
    """ring_allreduce_seconds on a fit (fit_lines): below its small
    line's bound, the slower of its two lines."""
    seconds = ring_allreduce_seconds(nbytes, ranks, fit["alpha_sec"], fit["beta_sec_per_byte"])
    small = fit.get("small")
    if small and nbytes < small["below_bytes"]:
        seconds = max(seconds, ring_allreduce_seconds(nbytes, ranks, small["alpha_sec"], small["beta_sec_per_byte"]))
    return seconds


def small_line_words(fit):
    """'; below 1 MB: α = 980.1 us, 1/β = 380.2 MB/s', or '' for a fit of one line."""
    small = (fit or {}).get("small")
    if not small:
        return ""
    rate = small["bandwidth_gb_per_sec"]
    return (f"; below {small['below_bytes'] / 2**20:g} MB: α = {small['alpha_sec'] * 1e6:,.1f} us, "
            + (f"1/β = {rate * 1e3:,.1f} MB/s" if rate else "β = 0 (the larger sizes took no longer)"))


def as_points(rows, ranks=None):
    """Timing rows as (bytes, ranks, seconds): a row of (bytes, seconds) is at `ranks` ranks."""
    return [(r[0], ranks, r[1]) if len(r) == 2 else tuple(r) for r in rows]


def fit_alpha_beta(rows, ranks=None, model="ring"):
    """Fit alpha and beta by least squares on relative error (sizes span five
    orders of magnitude) to rows of (bytes, seconds) at `ranks` ranks, or of
    (bytes, ranks, seconds). model "ring": t = 2(n-1)*alpha + 2(n-1)/n * S * beta
    (an allreduce over n ranks); model "ps": t = 2*alpha + 2*S*beta (one push
    and one pull, bench.grpc_exchange: ps_exchange_seconds with one worker and
    one PS). Returns alpha (s), beta (s/byte), and the fit's worst relative error."""
    points = as_points(rows, ranks)
    if model == "ring":
        points = [p for p in points if p[1] and p[1] >= 2]
    if len(points) < 2:
        return None
    S = np.array([p[0] for p in points], float)
    n = np.array([p[1] or 1 for p in points], float)
    t = np.array([p[2] for p in points], float)
    if model == "ring":
        A = np.stack([2 * (n - 1), 2 * (n - 1) / n * S], axis=1)
    else:
        A = np.stack([np.full_like(S, 2.0), 2 * S], axis=1)
    w = 1.0 / t
    (alpha, beta), *_ = np.linalg.lstsq(A * w[:, None], t * w, rcond=None)
    alpha, beta = max(float(alpha), 0.0), max(float(beta), 0.0)
    pred = A @ np.array([alpha, beta])
    return {"alpha_sec": alpha, "beta_sec_per_byte": beta, "model": model,
            "bandwidth_gb_per_sec": 1e-9 / beta if beta > 0 else None,
            "max_relative_error": float(np.max(np.abs(pred - t) / t)),
            "ranks": sorted({int(p[1]) for p in points if p[1]}), "points": len(points)}
