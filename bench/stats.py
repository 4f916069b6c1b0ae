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


def ring_allreduce_seconds(nbytes, ranks, alpha, beta):
    """Ring allreduce of nbytes over `ranks`: 2(n-1) latency-bound steps, and
    2(n-1)/n of the buffer sent and received by every rank."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * nbytes * beta


def ps_exchange_seconds(nbytes, workers, num_ps, alpha, beta):
    """One synchronous PS step: every worker pushes its gradients and pulls
    the weights; each of the P PS tasks holds 1/P of the variables, so each
    serves W*S/P bytes in and W*S/P bytes out, one message per worker."""
    return 2 * (workers * alpha + workers * nbytes / num_ps * beta)


def fit_alpha_beta(rows, ranks, model="ring"):
    """Fit alpha and beta to (bytes, seconds) pairs by least squares on
    relative error (sizes span five orders of magnitude). model "ring":
    t = 2(n-1)*alpha + 2(n-1)/n * S * beta (an allreduce over n ranks);
    model "ps": t = 2*alpha + 2*S*beta (one push and one pull, bench.grpc_exchange:
    ps_exchange_seconds with one worker and one PS).
    Returns alpha (s), beta (s/byte), and the fit's worst relative error."""
    if len(rows) < 2 or (model == "ring" and ranks < 2):
        return None
    S = np.array([r[0] for r in rows], float)
    t = np.array([r[1] for r in rows], float)
    if model == "ring":
        A = np.stack([np.full_like(S, 2 * (ranks - 1)), 2 * (ranks - 1) / ranks * S], axis=1)
    else:
        A = np.stack([np.full_like(S, 2.0), 2 * S], axis=1)
    w = 1.0 / t
    (alpha, beta), *_ = np.linalg.lstsq(A * w[:, None], t * w, rcond=None)
    alpha, beta = max(float(alpha), 0.0), max(float(beta), 0.0)
    pred = A @ np.array([alpha, beta])
    return {"alpha_sec": alpha, "beta_sec_per_byte": beta, "model": model,
            "bandwidth_gb_per_sec": 1e-9 / beta if beta > 0 else None,
            "max_relative_error": float(np.max(np.abs(pred - t) / t)), "ranks": ranks,
            "points": len(rows)}
