"""`ringtrain-bench scaling`: ring against PS, each configuration run through
its real launcher, one table row per (mode, N). Column definitions:
bench/COLUMNS.md."""
import json
import os
import statistics
import sys

from bench import launch, stats, tables
from bench.environment import describe, usable_cores

MODES = ("ring", "ring-gloo", "ps-sync", "ps-async", "independent")
RING_MODES = ("ring", "ring-gloo")  # mpirun (MPI controller) and horovodrun --gloo
COLUMNS = [
    ("mode", "mode"), ("n", "N (PS)"), ("procs", "cores/procs/thr"),
    ("per_worker", "per-worker img/s (95% CI)"), ("total", "total img/s"),
    ("speedup", "speedup"), ("efficiency", "efficiency"), ("ceiling", "% of independent"),
    ("step_ms", "step ms"),
    ("compute_ms", "compute ms"), ("comm_ms", "exposed comm ms"),
    ("predicted_ms", "α-β step ms"), ("scaling", "scaling"),
]
CSV_KEYS = ["mode", "workers", "num_ps", "processes", "cores", "threads_per_worker",
            "oversubscribed", "per_worker_images_per_sec_mean", "per_worker_images_per_sec_ci95",
            "rounds", "total_images_per_sec", "speedup", "efficiency", "efficiency_min",
            "efficiency_max", "fraction_of_independent", "step_time_ms", "compute_time_ms",
            "exposed_comm_ms", "predicted_comm_ms", "predicted_step_time_ms", "scaling",
            "global_batch", "per_worker_batch", "timed_windows", "steps", "train_loss",
            "test_accuracy", "staleness_mean", "staleness_max", "summary_json", "log"]


def training_flags(cfg, batch):
    flags = ["--model", cfg["model"], "--dataset", cfg["data"], "--batch-size", str(batch),
             "--steps", str(cfg["steps"]), "--threads", str(cfg["threads"])]
    return flags + (["--data-dir", cfg["data_dir"]] if cfg.get("data_dir") else [])


def command(mode, workers, cfg, batch, summary):
    """The launcher command for one configuration, as an argument list."""
    if mode == "independent":  # the machine's ceiling: N single-rank trainers, no launcher
        return [sys.executable, "-m", "bench.independent", "--np", str(workers),
                "--summary-json", summary, "--", launch.tool("ringtrain")] + training_flags(cfg, batch)
    train = training_flags(cfg, batch) + ["--summary-json", summary]
    if mode in RING_MODES:
        extra = []
        for flag, key in (("--cycle-time-ms", "cycle_time_ms"), ("--fusion-threshold-mb", "fusion_threshold_mb")):
            if cfg.get(key) is not None:
                extra += [flag, f"{cfg[key]:g}"]
        trainer = [launch.tool("ringtrain")] + train + extra
        if mode == "ring-gloo":
            return launch.horovodrun(workers, trainer, gloo=True)
        # plain mpirun: the same ranks as horovodrun's, without its ~8 s of start-up checks
        return launch.mpirun(workers, trainer, usable_cores())
    sync = ["--sync"] if mode == "ps-sync" else []
    return [launch.tool("ps-baseline"), "launch", "--num-ps", str(cfg["num_ps"]),
            "--num-workers", str(workers)] + sync + train


def per_worker_batch(cfg, workers):
    if cfg["scaling"] == "strong":
        return max(1, cfg["global_batch"] // workers)
    return cfg["batch_size"]


def run_one(mode, workers, cfg, out_dir, log, round_=0):
    tag = f"{mode}-n{workers}-r{round_ + 1}"
    summary = os.path.join(out_dir, "runs", f"{tag}.json")
    logf = os.path.join(out_dir, "runs", f"{tag}.log")
    if os.path.exists(summary):
        os.remove(summary)
    cmd = command(mode, workers, cfg, per_worker_batch(cfg, workers), summary)
    log(f"ringtrain-bench: {tag}: {' '.join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd))}")
    rc = launch.run(cmd, logf, cfg["timeout"])
    if rc != 0 or not os.path.exists(summary):
        raise RuntimeError(f"{tag} failed (exit {rc}); last lines of {logf}:\n{launch.tail(logf)}")
    with open(summary) as f:
        result = json.load(f)
    result["_summary_json"], result["_log"] = summary, logf
    return result


def load_alpha_beta(path):
    """(ring fit, PS fit, gradient bytes) from an allreduce.json, if there is one."""
    if not path or not os.path.exists(path):
        return None, None, None
    with open(path) as f:
        ar = json.load(f)
    fits = ar.get("alpha_beta", {})
    return (fits.get(ar.get("alpha_beta_used_for_predictions")),
            fits.get(ar.get("alpha_beta_used_for_ps_predictions")),
            ar.get("config", {}).get("gradient_bytes"))


def run(cfg, out_dir, log=print):
    """Every (mode, N) run, then the table, CSV, JSON and plots."""
    os.makedirs(os.path.join(out_dir, "runs"), exist_ok=True)
    cfg = dict(cfg, environment=describe(threads_per_worker=cfg["threads"]))  # load before our runs
    fit, ps_fit, grad_bytes = load_alpha_beta(cfg.get("alpha_beta_json"))
    if grad_bytes is None:
        from bench.allreduce import gradient_shapes
        import numpy as np
        grad_bytes = 4 * sum(int(np.prod(s)) for s in gradient_shapes(cfg["model"]))
    summaries = {}
    # N independent trainers are every row's compute baseline and ceiling: always run.
    modes = list(cfg["modes"]) + ([] if "independent" in cfg["modes"] else ["independent"])
    # Rounds: every configuration once per round, so that a slow spell on a
    # shared machine hits one round of all of them, not all runs of one.
    for r in range(cfg.get("repeats", 1)):
        for n in cfg["np"]:
            for mode in modes:
                summaries.setdefault((mode, n), []).append(run_one(mode, n, cfg, out_dir, log, round_=r))
    result = build(summaries, cfg, fit, grad_bytes, ps_fit)
    result["environment"]["load_average_at_end"] = list(os.getloadavg())
    write(result, out_dir)
    return result


def build(summaries, cfg, fit, grad_bytes, ps_fit=None):
    """Table rows from launcher summaries, a list of runs (one per round) for
    each (mode, N): pure arithmetic, unit-tested on recorded summaries.
    fit: the Horovod allreduce α-β fit (ring rows); ps_fit: the gRPC push/pull
    fit (PS rows)."""
    cores = cfg.get("cores") or usable_cores()
    rows = []
    for (mode, n), runs in summaries.items():
        windows = [w for s in runs for per_worker in s.get("window_images_per_sec", []) for w in per_worker]
        mean, ci = stats.mean_ci95(windows)
        num_ps = runs[0].get("num_ps", cfg["num_ps"]) if mode.startswith("ps-") else 0
        procs = n + num_ps
        step = _median([_mean(s.get("step_time_sec")) for s in runs])
        # compute: N trainers that exchange nothing, on the same machine, at the same N
        comp = None if mode == "independent" else \
            _median([_mean(s.get("step_time_sec")) for s in summaries.get(("independent", n), [])])
        model = fit if mode in RING_MODES else ps_fit if mode.startswith("ps-") else None
        if model and grad_bytes:
            a, b = model["alpha_sec"], model["beta_sec_per_byte"]
            comm = (stats.ring_allreduce_seconds(grad_bytes, n, a, b) if mode in RING_MODES
                    else stats.ps_exchange_seconds(grad_bytes, n, num_ps, a, b))
        else:
            comm = None
        rows.append({
            "mode": mode, "workers": n, "num_ps": num_ps, "processes": procs, "cores": cores,
            "threads_per_worker": cfg["threads"], "oversubscribed": procs * max(cfg["threads"], 1) > cores,
            "per_worker_images_per_sec_mean": mean, "per_worker_images_per_sec_ci95": ci,
            "rounds": len(runs), "total_images_per_sec_runs": [s["images_per_sec"] for s in runs],
            "total_images_per_sec": _median([s["images_per_sec"] for s in runs]),
            "step_time_ms": _ms(step), "compute_time_ms": _ms(comp),
            "exposed_comm_ms": _ms(step - comp) if step is not None and comp is not None else None,
            "predicted_comm_ms": _ms(comm),
            "predicted_step_time_ms": _ms(comp + comm) if comp is not None and comm is not None else None,
            "scaling": cfg["scaling"], "per_worker_batch": per_worker_batch(cfg, n),
            "global_batch": per_worker_batch(cfg, n) * n, "timed_windows": len(windows),
            "steps": runs[0].get("steps"), "train_loss": runs[-1].get("train_loss"),
            "test_accuracy": runs[-1].get("test_accuracy"), "staleness_mean": runs[-1].get("staleness_mean"),
            "staleness_max": runs[-1].get("staleness_max"),
            "summary_json": runs[-1].get("_summary_json"), "log": runs[-1].get("_log"),
        })
    for r in rows:
        base = next((b for b in rows if b["mode"] == r["mode"] and b["workers"] == 1), None)
        # the ratio within each round (whose T_N and T_1 ran minutes apart), then the median
        ratios = [t / t1 for t, t1 in zip(r["total_images_per_sec_runs"], base["total_images_per_sec_runs"])
                  if t1 > 0] if base else []
        r["speedup"] = _median(ratios)
        r["efficiency"] = r["speedup"] / r["workers"] if ratios else None
        r["efficiency_min"] = min(ratios) / r["workers"] if ratios else None
        r["efficiency_max"] = max(ratios) / r["workers"] if ratios else None
        # against N independent trainers in the same round: what exchanging gradients
        # costs, net of what N processes cost this machine anyway
        ceiling = next((b for b in rows if b["mode"] == "independent" and b["workers"] == r["workers"]), None)
        r["fraction_of_independent"] = _median(
            [t / c for t, c in zip(r["total_images_per_sec_runs"], ceiling["total_images_per_sec_runs"])
             if c > 0]) if ceiling else None
    order = list(cfg["modes"]) + ["independent"]
    rows.sort(key=lambda r: (order.index(r["mode"]) if r["mode"] in order else 9, r["workers"]))
    return {"rows": rows, "gaps": gaps(rows), "alpha_beta": fit, "alpha_beta_ps": ps_fit,
            "gradient_bytes": grad_bytes,
            "config": {k: v for k, v in cfg.items() if k not in ("cores", "environment")},
            "environment": cfg.get("environment") or describe(threads_per_worker=cfg["threads"])}


def gaps(rows):
    """Ring against sync PS at each N: measured and predicted step-time gap."""
    out = []
    by = {(r["mode"], r["workers"]): r for r in rows}
    for (mode, n), ring in sorted(by.items()):
        ps = by.get(("ps-sync", n))
        if mode not in RING_MODES or not ps:
            continue
        measured = ps["step_time_ms"] - ring["step_time_ms"]
        predicted = (ps["predicted_step_time_ms"] - ring["predicted_step_time_ms"]
                     if ps["predicted_step_time_ms"] is not None and ring["predicted_step_time_ms"] is not None
                     else None)
        out.append({"ring_mode": mode, "workers": n, "ring_step_ms": ring["step_time_ms"], "ps_sync_step_ms": ps["step_time_ms"],
                    "measured_gap_ms": measured, "predicted_gap_ms": predicted,
                    "gap_error_pct": 100 * abs(predicted - measured) / abs(measured)
                    if predicted is not None and measured else None,
                    "ring_over_ps_throughput": ring["total_images_per_sec"] / ps["total_images_per_sec"]})
    return out


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _mean(values):
    values = [v for v in (values or []) if v is not None]
    return sum(values) / len(values) if values else None


def _ms(seconds):
    return None if seconds is None else 1e3 * seconds


def markdown(result):
    rows = []
    for r in result["rows"]:
        ci = r["per_worker_images_per_sec_ci95"]
        rows.append({
            "mode": r["mode"], "n": f"{r['workers']} ({r['num_ps']})" if r["num_ps"] else str(r["workers"]),
            "procs": f"{r['cores']}/{r['processes']}/{r['threads_per_worker']}"
                     + (" over" if r["oversubscribed"] else ""),
            "per_worker": f"{tables.fmt(r['per_worker_images_per_sec_mean'], 0)} ± {tables.fmt(ci, 0)}",
            "total": tables.fmt(r["total_images_per_sec"], 0), "speedup": tables.fmt(r["speedup"]),
            "efficiency": efficiency_text(r),
            "ceiling": "n/a" if r["fraction_of_independent"] is None else f"{100 * r['fraction_of_independent']:.0f}%",
            "step_ms": tables.fmt(r["step_time_ms"]), "compute_ms": tables.fmt(r["compute_time_ms"]),
            "comm_ms": tables.fmt(r["exposed_comm_ms"]), "predicted_ms": tables.fmt(r["predicted_step_time_ms"]),
            "scaling": f"{r['scaling']} (B={r['per_worker_batch']}/worker)",
        })
    cfg, env, fit = result["config"], result["environment"], result["alpha_beta"]
    load = env.get("load_average_at_start"), env.get("load_average_at_end")
    rounds = max((r["rounds"] for r in result["rows"]), default=1)
    text = (f"# Ring against PS: {cfg['model']} on {cfg['data']} data, {cfg['steps']} steps per run\n\n"
            f"Columns are defined in bench/COLUMNS.md. Totals are measured (all workers' timed images / "
            f"slowest worker's timed seconds), never rank 0 x N; warm-up steps excluded. "
            f"Every configuration ran {rounds} time(s), in rounds; total img/s is the median run, and "
            f"speedup and efficiency are the median over rounds of that round's T_N / T_1"
            + (" (efficiency min–max over rounds in brackets)" if rounds > 1 else "") + ". "
            f"`independent` is N single-rank trainers at once with nothing exchanged: this machine's "
            f"ceiling for N processes. "
            f"Machine: {env.get('cores')} cores ({env.get('cpu_model')}), no GPU: N counts worker "
            f"processes, each with {cfg['threads']} TF thread(s); 'over' marks more processes x threads "
            f"than cores. Load average (1 min) at start/end: "
            f"{tables.fmt(load[0][0] if load[0] else None)}/{tables.fmt(load[1][0] if load[1] else None)} "
            f"(other work on the machine skews every number).\n\n")
    text += tables.markdown(COLUMNS, rows)
    if fit or result.get("alpha_beta_ps"):
        text += f"\nα-β models from the allreduce bench (gradients {result['gradient_bytes'] / 1e6:.2f} MB per step):\n"
        for label, f in (("ring rows, Horovod allreduce (horovod-mpi)", fit),
                         ("PS rows, TF gRPC push + pull (grpc-ps)", result.get("alpha_beta_ps"))):
            if f:
                text += f"- {label}: α = {f['alpha_sec'] * 1e6:.1f} us, 1/β = {f['bandwidth_gb_per_sec'] or 0:.2f} GB/s\n"
    if result["gaps"]:
        text += "\nRing against sync PS (step-time gap = PS step - ring step):\n\n"
        text += tables.markdown(
            [("mode", "ring mode"), ("n", "N"), ("ring", "ring img/s ÷ PS img/s"), ("measured", "measured gap ms"),
             ("predicted", "α-β gap ms"), ("error", "gap error")],
            [{"mode": g["ring_mode"], "n": str(g["workers"]), "ring": tables.fmt(g["ring_over_ps_throughput"]),
              "measured": tables.fmt(g["measured_gap_ms"]), "predicted": tables.fmt(g["predicted_gap_ms"]),
              "error": "n/a" if g["gap_error_pct"] is None else f"{g['gap_error_pct']:.0f}%"}
             for g in result["gaps"]])
    return text


def efficiency_text(r):
    if r["efficiency"] is None:
        return "n/a"
    text = f"{100 * r['efficiency']:.0f}%"
    if r["rounds"] > 1 and r["workers"] > 1:
        text += f" ({100 * r['efficiency_min']:.0f}–{100 * r['efficiency_max']:.0f})"
    return text


def write(result, out_dir):
    text = markdown(result)
    with open(os.path.join(out_dir, "scaling.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out_dir, "scaling.csv"), "w") as f:
        f.write(tables.csv_text(CSV_KEYS, result["rows"]))
    with open(os.path.join(out_dir, "scaling.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    from bench import plots
    plots.scaling_plots(result["rows"], os.path.join(out_dir, "scaling_throughput.png"),
                        os.path.join(out_dir, "scaling_efficiency.png"))
    return text
