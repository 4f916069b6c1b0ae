"""The scaling table's rows from the launchers' summaries: pure arithmetic,
unit-tested on recorded summaries. Every column is defined in bench/COLUMNS.md.

With a time dilation K (a simulated cluster whose links run K times slower
than the rate they stand for, and accelerator steps K times longer), every
time is divided by K and every rate multiplied by K: the rows speak of the
emulated cluster."""
from ringtrain.bench import bench_modes, stats
from ringtrain.bench.environment import describe, usable_cores
from ringtrain.workloads.horovod_env import GLOO_RING
from ringtrain.workloads.gradients import ring_buckets, tf_buckets
from ringtrain.workloads.numbers import mean, median


def build(summaries, cfg, fit, ps_fit=None, site=None, environment=None, tf_fit=None, gloo_fit=None):
    """summaries: {(mode, N, P): [summary of each round]}. fit: the ring α-β
    fit (Horovod's allreduce on one machine, OpenMPI's ring across hosts);
    gloo_fit: Horovod's allreduce over Gloo, for the ring rows whose gradients
    Gloo carried (without it, those use `fit`); ps_fit: the gRPC push/pull fit;
    tf_fit: TF's own collective all-reduce's (without it, TF's collective rows
    are predicted with the fit of mode ring's transport)."""
    site = site or {"label": "this machine", "across_hosts": False, "link_rate": None, "dilation": 1.0,
                    "hosts": 1}
    cores = cfg.get("cores") or usable_cores()
    if any(bench_modes.all_reduces(mode) for mode, _, _ in summaries) and not cfg.get("layer_bytes"):
        cfg = dict(cfg, layer_bytes=layer_bytes(cfg["model"]))
    fits = {"mpi": fit, "gloo": gloo_fit, "tf": tf_fit, "ps": ps_fit}
    rows = [row(summaries, mode, n, p, runs, cfg, fits, site, cores) for (mode, n, p), runs in summaries.items()]
    for r in rows:
        add_ratios(r, rows)
    order = list(cfg["modes"]) + ["independent"]
    rows.sort(key=lambda r: (order.index(r["mode"]) if r["mode"] in order else 9, r["num_ps"], r["workers"]))
    return {"rows": rows, "gaps": gaps(rows), "alpha_beta": fit, "alpha_beta_ps": ps_fit, "alpha_beta_tf": tf_fit,
            "alpha_beta_gloo": gloo_fit,
            "gradient_bytes": next((s[-1].get("gradient_bytes") for s in summaries.values()
                                    if s[-1].get("gradient_bytes")), cfg.get("gradient_bytes")),
            "site": site,
            "config": {k_: v for k_, v in cfg.items() if k_ not in ("cores", "environment")},
            "environment": environment or cfg.get("environment") or describe(threads_per_worker=cfg["threads"])}


def transport_fit(algorithm, fit, gloo_fit):
    """The fit of what carried a Horovod run's gradients (its `algorithm`, as
    its summary says): Horovod over Gloo where Gloo did (ring-gloo, and ring
    under mpirun across hosts: --cpu-operations auto) and the run has that
    fit, else `fit`."""
    return gloo_fit if gloo_fit and algorithm == GLOO_RING else fit


def rings_fit(summaries, n, fits):
    """The fit of what carried mode ring's gradients at N = n (at any N, in a run
    without ring at n), which TF's rows are set beside."""
    runs = summaries.get(("ring", n, 0)) or next((r for (mode, _, _), r in summaries.items() if mode == "ring"), [{}])
    return transport_fit(runs[-1].get("allreduce_algorithm"), fits["mpi"], fits["gloo"])


def row(summaries, mode, n, p, runs, cfg, fits, site, cores):
    """The table's row of (mode, N, P) from its rounds' summaries; fits: build's."""
    k = site.get("dilation") or 1.0
    # in-graph, TF2 PS and towers: one process times every worker's samples; per worker is its share
    share = n if bench_modes.one_timer(mode) else 1
    windows = [w / share for s in runs for per_worker in s.get("window_images_per_sec", []) for w in per_worker]
    window_mean, ci = stats.mean_ci95(windows)
    step = median([mean(s.get("step_time_sec")) for s in runs])
    base = compute_runs(summaries, mode, n, p, not shares_cores(site))
    compute, wait = compute_seconds(base), wait_for_slowest(mode, n, base)
    tf = bench_modes.exchange(mode) == "tf"
    horovods = rings_fit(summaries, n, fits) if tf else None
    own = (fits["tf"] or horovods) if tf else transport_fit(runs[-1].get("allreduce_algorithm"), fits["mpi"],
                                                            fits["gloo"])

    def priced(fit):  # α-β's step on a fit: the compute, what of the exchange shows, the wait for the slowest
        alpha_beta = predicted_step_seconds(mode, runs[-1], compute, fit, fits["ps"], site, cfg)
        return None if alpha_beta is None else alpha_beta + (wait or 0.0)
    predicted = priced(own)
    comm = predicted - compute - (wait or 0.0) if predicted is not None else None
    kernel = exchange_kernel_seconds(summaries, mode, n, runs)
    on_compute = kernel / cores if kernel is not None and compute_shares_cores(site) else None
    with_kernel = predicted + on_compute if predicted is not None and on_compute is not None else None
    # (TF's exchange priced on Horovod's fit as well: the report splits TF's step into overlap and transport)
    on_horovods_fit = priced(horovods) if tf else None
    wire = median([measured_wire_bytes(s) for s in runs]) if site["across_hosts"] else None
    theory = theory_wire_bytes(mode, runs[-1]) if site["across_hosts"] else None
    procs = 1 if mode == "towers" else n + p  # towers: one process, a pool thread per tower
    threads = n * max(cfg["threads"], 1) if mode == "towers" else procs * max(cfg["threads"], 1)
    return {
        "mode": mode, "workers": n, "num_ps": p, "processes": procs, "cores": cores,
        "hosts": len(set(runs[-1].get("hosts") or [])) or 1, "site": site["label"],
        "link_rate": site.get("link_rate"), "time_dilation": k,
        "algorithm": algorithm(mode, runs[-1], p),
        "threads_per_worker": cfg["threads"],
        "oversubscribed": not site["across_hosts"] and threads > cores,
        "per_worker_images_per_sec_mean": window_mean * k, "per_worker_images_per_sec_ci95": _scale(ci, k),
        "rounds": len(runs), "total_images_per_sec_runs": [s["images_per_sec"] * k for s in runs],
        "total_images_per_sec": median([s["images_per_sec"] for s in runs]) * k,
        "step_time_ms": _ms(step, k), "compute_time_ms": _ms(compute, k), "sync_wait_ms": _ms(wait, k),
        "exposed_comm_ms": _ms(step - compute, k) if step is not None and compute is not None else None,
        "predicted_comm_ms": _ms(comm, k), "predicted_step_time_ms": _ms(predicted, k),
        "predicted_step_on_horovod_fit_ms": _ms(on_horovods_fit, k),
        "prediction_error_pct": error_pct(predicted, step),
        "exchange_kernel_cpu_ms": _ms(kernel, k), "kernel_on_compute_ms": _ms(on_compute, k),
        "predicted_with_kernel_ms": _ms(with_kernel, k),
        "error_with_kernel_pct": error_pct(with_kernel, step),
        "wire_bytes_per_step": wire, "wire_bytes_theory": theory,
        "wire_bytes_pct_of_theory": 100 * wire / theory if wire is not None and theory else None,
        "scaling": cfg["scaling"], "per_worker_batch": per_worker_batch(cfg, n),
        "global_batch": per_worker_batch(cfg, n) * n, "timed_windows": len(windows),
        "steps": runs[0].get("steps"), "train_loss": runs[-1].get("train_loss"),
        "test_accuracy": runs[-1].get("test_accuracy"), "staleness_mean": runs[-1].get("staleness_mean"),
        "staleness_max": runs[-1].get("staleness_max"),
        "cpu_horovod_thread_pct": median([cpu_per_worker(s, "horovod_thread") for s in runs]),
        "cpu_other_threads_pct": median([cpu_per_worker(s, "other_threads") for s in runs]),
        "cpu_host_kernel_pct": median([cpu_per_worker(s, "host_kernel") for s in runs]),
        "summary_json": runs[-1].get("_summary_json"), "log": runs[-1].get("_log"),
    }


def error_pct(predicted, measured):
    """How far a prediction was from the measured value, in % of the measured."""
    return 100 * (predicted - measured) / measured if predicted is not None and measured else None


def layer_bytes(model):
    """Each layer's gradient bytes, in forward order: when backprop makes them
    (bench/stats.py, backprop_exchange)."""
    from ringtrain.bench.allreduce import gradient_layer_bytes
    return [sum(layer) for layer in gradient_layer_bytes(model)]


def per_worker_batch(cfg, workers):
    if cfg["scaling"] == "strong":
        return max(1, cfg["global_batch"] // workers)
    return cfg["batch_size"]


def base_key(summaries, mode, p):
    """The same mode at N = 1: P = 1 when P grows with N (one PS per host)."""
    for key in ((mode, 1, p), (mode, 1, min(p, 1))):
        if key in summaries:
            return key
    return None


def shares_cores(site):
    """The workers share this machine's cores: on one machine, or a simulated cluster."""
    return not site["across_hosts"] or bool(site.get("hosts_share_cores"))


def compute_shares_cores(site):
    """The exchange's CPU comes out of the compute's: the workers share the
    cores and compute on them (a simulated accelerator leaves them idle)."""
    return shares_cores(site) and not site.get("simulated_gpu_ms")


def kernel_seconds_per_step(runs):
    """Core-seconds the workers' hosts' kernel spent per step: its share of a
    core over the timed windows, times the step (median over rounds)."""
    values = [cpu_per_worker(s, "host_kernel") / 100 * mean(s["step_time_sec"]) for s in runs
              if cpu_per_worker(s, "host_kernel") is not None and s.get("step_time_sec")]
    return median(values) if values else None


def exchange_kernel_seconds(summaries, mode, n, runs):
    """What the exchange cost the kernel per step (sockets, and on a simulated
    cluster the veths, bridge and shaping between hosts): core-seconds per
    step beyond the N independent trainers', which exchange nothing."""
    if mode == "independent":
        return None
    this, base = kernel_seconds_per_step(runs), kernel_seconds_per_step(summaries.get(("independent", n, 0)) or [])
    return max(0.0, this - base) if this is not None and base is not None else None


def compute_runs(summaries, mode, n, p, own_cores):
    """The runs whose step is this row's without its exchange: where the
    workers share this machine's cores (on one machine, or a simulated
    cluster), N independent trainers at the same N, whose compute contends for
    the cores as the workers' does (at N = 4 on 2 cores, the N = 1 step is no
    bound); across hosts of their own, or a run without those trainers, the
    same mode on one host (nothing on a wire). None for `independent`."""
    if mode == "independent":
        return None
    runs = None if own_cores else summaries.get(("independent", n, 0))
    if not runs:
        key = base_key(summaries, mode, p)
        runs = summaries.get(key) if key else None
    return runs or None


def compute_seconds(runs):
    """The compute runs' step: the median over rounds of their mean step."""
    return median([mean(s.get("step_time_sec")) for s in runs]) if runs else None


def wait_for_slowest(mode, n, runs):
    """A synchronous mode's wait for its slowest worker, a step, from the
    spread of the compute runs' steps (the median over rounds; None where the
    runs did not record it, as before 2026-12-07). Workers that never wait for
    each other (async PS) wait nothing."""
    if not runs:
        return None
    if not bench_modes.synchronous(mode):
        return 0.0
    waits = [stats.sync_wait_seconds([q for worker in s.get("step_time_quantiles_sec") or [] if worker
                                      for q in worker], n) for s in runs]
    return median(waits)


def endpoints(mode, summary, across_hosts):
    """(worker hosts, PS hosts): real host names across hosts; on one machine
    each process is its own endpoint (their transfers are copies between them)."""
    n = summary.get("world_size", 1)
    if not across_hosts:
        return [f"worker{i}" for i in range(n)], [f"ps{i}" for i in range(summary.get("num_ps") or 0)]
    ps = [a.rsplit(":", 1)[0] for a in (summary.get("launch") or {}).get("ps_hosts", [])]
    return list(summary.get("hosts") or []), ps


def predicted_step_seconds(mode, summary, compute, fit, ps_fit, site, cfg):
    """α-β's step: the compute, and what of the exchange does not hide behind
    it (bench/stats.py). Forward and backward are a third and two thirds of
    the simulated accelerator's step, or of the compute when it is real.
    fit: the all-reduce's own (Horovod's, or TF's for TF's collective mode)."""
    if compute is None:
        return None
    simulated = site.get("simulated_gpu_ms")
    busy = simulated / 1e3 * (site.get("dilation") or 1.0) if simulated else compute
    forward, backward = stats.forward_and_backward(busy)
    nbytes, n = summary.get("gradient_bytes"), summary.get("world_size", 1)
    if bench_modes.all_reduces(mode) and fit and nbytes:
        fit = fit_at(fit, n)
        allreduce = lambda b: stats.ring_allreduce_on(fit, b, n)
        layers = cfg["layer_bytes"]  # the exchanged bytes, spread over the layers as the model spreads them
        layers = [b * nbytes / sum(layers) for b in layers]
        bucket = (summary.get("bucket_mb") or 0) * 2**20
        if bench_modes.exchange(mode) == "tf":  # TF's buckets in order (a run before them: one, after backprop)
            buckets = tf_buckets(layers, bucket)
        elif bucket:  # ring mode's buckets (a run before them, or --bucket-mb 0: Horovod's fusion alone)
            buckets = ring_buckets(layers, bucket)
        else:
            return stats.ring_step_seconds(compute, backward, layers, allreduce)
        return compute + stats.exchange_in_buckets(backward, layers, buckets, allreduce)["exposed"]
    if bench_modes.exchange(mode) == "ps" and ps_fit and summary.get("ps_bytes"):
        workers, ps = endpoints(mode, summary, site["across_hosts"])
        # (in-graph: the towers' reads and the client's update, as one sync step; its feeds are not modelled)
        return stats.ps_step_seconds(compute, forward, backward, workers, ps, summary["ps_bytes"],
                                     ps_fit["alpha_sec"], ps_fit["beta_sec_per_byte"],
                                     sync=bench_modes.synchronous(mode))
    return None


def fit_at(fit, n):
    """A ring fit, or {ranks: fit} of fits per rank count ('all': over every
    count): the one at n, else the one over all counts."""
    if "alpha_sec" in fit:
        return fit
    return fit.get(str(n)) or fit.get("all") or next(iter(fit.values()))


def cpu_per_worker(summary, part):
    """A run's mean over workers of one part of their CPU (% of a core): the
    Horovod background thread, or every other thread (workloads/threadcpu.py)."""
    values = [w[part] for w in summary.get("cpu_pct_of_core") or [] if w and w.get(part) is not None]
    return sum(values) / len(values) if values else None


def step_rates(summary):
    """Each worker's steps per second (async workers run at their own pace)."""
    return [1.0 / t if t else 0.0 for t in summary.get("step_time_sec") or []]


def measured_wire_bytes(summary):
    """Bytes the hosts sent per step: all hosts' tx bytes per second (each over
    its first worker's timed steps) over the workers' mean steps per second.
    In sync training every worker steps at once and this is each host's tx
    bytes per step, summed; in async, per round of one step of each worker."""
    rates, seen, bytes_per_sec = step_rates(summary), set(), 0.0
    for entry, rate in zip(summary.get("network") or [], rates):
        if entry.get("host") in seen or not entry.get("timed_steps") or not rate:
            continue
        seen.add(entry["host"])
        bytes_per_sec += entry["tx_bytes"] / entry["timed_steps"] * rate
    return bytes_per_sec / (sum(rates) / len(rates)) if seen and sum(rates) else None


def theory_wire_bytes(mode, summary):
    nbytes = summary.get("gradient_bytes")
    if bench_modes.all_reduces(mode) and nbytes:
        return stats.ring_wire_bytes(summary.get("hosts") or [], nbytes)
    if mode in ("ps-sync", "ps-async") and summary.get("ps_bytes"):
        workers, ps = endpoints(mode, summary, across_hosts=True)
        per_step = stats.ps_wire_bytes(workers, ps, summary["ps_bytes"])
        rates = step_rates(summary) or [1.0] * len(per_step)
        # per round of one step of each worker, each worker weighted by how often it steps (alike in sync)
        return sum(b * r for b, r in zip(per_step, rates)) / (sum(rates) / len(rates)) if sum(rates) else None
    return None


def algorithm(mode, summary, p):
    if bench_modes.all_reduces(mode):
        return summary.get("allreduce_algorithm") or "n/a"
    if mode.startswith("ps-"):
        how = "gRPC, in-graph client" if mode == "ps-ingraph" else "gRPC push/pull"
        return f"{how}, {p} PS" + (f", {summary['placement']}" if p > 1 and summary.get("placement") else "")
    if mode == "towers":
        return "towers, mean on the CPU"
    return "none"


def add_ratios(r, rows):
    """Speedup and efficiency against the same mode at N = 1 (P = 1 when P
    grows with N), taken within each round; share of the independent ceiling."""
    base = next((b for b in rows if b["mode"] == r["mode"] and b["workers"] == 1
                 and b["num_ps"] in (r["num_ps"], min(r["num_ps"], 1))), None)
    ratios = [t / t1 for t, t1 in zip(r["total_images_per_sec_runs"], base["total_images_per_sec_runs"])
              if t1 > 0] if base else []
    r["speedup"] = median(ratios)
    r["efficiency"] = r["speedup"] / r["workers"] if ratios else None
    r["efficiency_min"] = min(ratios) / r["workers"] if ratios else None
    r["efficiency_max"] = max(ratios) / r["workers"] if ratios else None
    # weak scaling: what α-β says N workers can reach against one
    r["predicted_efficiency"] = (base["predicted_step_time_ms"] / r["predicted_step_time_ms"]
                                 if base and base["predicted_step_time_ms"] and r["predicted_step_time_ms"]
                                 and r["scaling"] == "weak" else None)
    ceiling = next((b for b in rows if b["mode"] == "independent" and b["workers"] == r["workers"]), None)
    r["fraction_of_independent"] = median(
        [t / c for t, c in zip(r["total_images_per_sec_runs"], ceiling["total_images_per_sec_runs"])
         if c > 0]) if ceiling else None


def gaps(rows):
    """Ring against sync PS (its fewest PS tasks) at each N: measured and predicted step-time gap."""
    out = []
    by = {}
    for r in rows:
        by.setdefault((r["mode"], r["workers"]), r)  # rows are sorted by P: the fewest first
    for (mode, n), ring in sorted(by.items()):
        ps = by.get(("ps-sync", n))
        if not bench_modes.all_reduces(mode) or not ps:
            continue
        measured = ps["step_time_ms"] - ring["step_time_ms"]
        predicted = (ps["predicted_step_time_ms"] - ring["predicted_step_time_ms"]
                     if ps["predicted_step_time_ms"] is not None and ring["predicted_step_time_ms"] is not None
                     else None)
        out.append({"ring_mode": mode, "workers": n, "num_ps": ps["num_ps"], "ring_step_ms": ring["step_time_ms"],
                    "ps_sync_step_ms": ps["step_time_ms"], "measured_gap_ms": measured, "predicted_gap_ms": predicted,
                    "gap_error_pct": 100 * abs(predicted - measured) / abs(measured)
                    if predicted is not None and measured else None,
                    "ring_over_ps_throughput": ring["total_images_per_sec"] / ps["total_images_per_sec"]})
    return out


def _ms(seconds, dilation=1.0):
    return None if seconds is None else 1e3 * seconds / dilation


def _scale(value, factor):
    return None if value is None else value * factor
