"""`ringtrain-bench straggler`: what one slow worker costs each mode.

Every mode of bench/sync_modes.py runs with one straggler (`--straggler
RANK:F`) at each factor F, in interleaved rounds. Per mode and factor: the
applied throughput and its ratio to the same mode without a straggler (same
round), the healthy workers' and the straggler's own rates and step times
(p50, p99), the gradients sync PS dropped as stale, and async staleness.

The model beside each ratio: the straggler runs at r = E / (E - 1 + F) of
its speed (E: --every). A sync step waits for it, so ring and ps-sync keep r.
Async keeps (W - 1 + r) / W: the others never wait. With a backup worker,
SyncReplicasOptimizer hands out W + 1 tokens per update and every gradient
pushed takes one, so updates come at (pushes per second) / (W + 1): the
ratio is (W + r) / (W + 1), whatever the straggler's gradients are worth.
"""
import os

from ringtrain.bench import plots, scaling, sites, sync_modes, tables
from ringtrain.bench.environment import describe
from ringtrain.bench.scaling_report import findings_table
from ringtrain.workloads.numbers import median

COLUMNS = [("mode", "mode"), ("workers", "workers (K)"), ("factor", "straggler"),
           ("applied", "applied img/s"), ("ratio", "of no straggler"), ("model", "model"),
           ("healthy", "healthy worker img/s"), ("slow", "straggler img/s"),
           ("healthy_steps", "healthy step p50/p99 ms"), ("slow_steps", "straggler step p50/p99 ms"),
           ("dropped", "gradients dropped"), ("staleness", "staleness p50/p99/max")]
CSV_KEYS = ["mode", "workers", "replicas_to_aggregate", "straggler_rank", "factor", "every", "rounds",
            "applied_images_per_sec", "ratio_to_no_straggler", "ratio_min", "ratio_max", "model_ratio",
            "healthy_images_per_sec", "straggler_images_per_sec", "healthy_step_p50_ms", "healthy_step_p99_ms",
            "straggler_step_p50_ms", "straggler_step_p99_ms", "gradients_pushed", "gradients_dropped",
            "staleness_mean", "staleness_p50", "staleness_p99", "staleness_max", "summary_json"]


def model_ratio(mode, workers, factor, every):
    r = every / (every - 1 + factor)  # the straggler's share of its own speed
    if mode == "ps-async":
        return (workers - 1 + r) / workers
    if mode == "ps-sync-backup":
        return (workers + r) / (workers + 1)
    return r


def run(cfg, out_dir, log=print, site=None):
    site = site or sites.this_machine()
    environment = describe(threads_per_worker=cfg["threads"], hostfile=site.label)
    runs = {}
    for round_ in range(cfg["repeats"]):
        for factor in cfg["factors"]:
            for mode in cfg["modes"]:
                extra = [] if factor == 1 else ["--straggler", f"{cfg['rank']}:{factor:g}:{cfg['every']}"]
                tag = f"{mode}-f{factor:g}-r{round_ + 1}"
                runs.setdefault((mode, factor), []).append(
                    sync_modes.run(mode, cfg["np"], cfg, out_dir, tag, log, site, extra))
    result = {"config": cfg, "environment": environment, "site": scaling.site_facts(site, cfg),
              "rows": rows(cfg, runs)}
    result["environment"]["load_average_at_end"] = list(os.getloadavg())
    result["findings"] = findings(result["rows"])
    write(result, out_dir)
    return result


def rows(cfg, runs):
    out = []
    for (mode, factor), summaries in runs.items():
        base = runs.get((mode, 1.0))
        ratios = [sync_modes.applied_images_per_sec(s) / sync_modes.applied_images_per_sec(b)
                  for s, b in zip(summaries, base or []) if sync_modes.applied_images_per_sec(b)]
        mid = sorted(summaries, key=sync_modes.applied_images_per_sec)[len(summaries) // 2]  # the median run
        rank = cfg["rank"]
        rates, p50, p99 = mid["images_per_sec_per_worker"], mid["step_time_p50_sec"], mid["step_time_p99_sec"]
        healthy = [i for i in range(len(rates)) if i != rank]
        timed = [rates[i] for i in healthy if rates[i] is not None]  # (None: a worker that timed no step)
        ms = lambda v: None if v is None else 1000 * v
        out.append({
            "mode": mode, "workers": len(rates), "replicas_to_aggregate": mid.get("replicas_to_aggregate"),
            "straggler_rank": rank if factor != 1 else None, "factor": factor, "every": cfg["every"],
            "rounds": len(summaries), "applied_images_per_sec": sync_modes.applied_images_per_sec(mid),
            "ratio_to_no_straggler": median(ratios), "ratio_min": min(ratios, default=None),
            "ratio_max": max(ratios, default=None),
            "model_ratio": model_ratio(mode, cfg["np"], factor, cfg["every"]),
            "healthy_images_per_sec": sum(timed) / len(timed) if timed else None,
            "straggler_images_per_sec": rates[rank] if rank < len(rates) else None,
            "healthy_step_p50_ms": ms(median([p50[i] for i in healthy])),
            "healthy_step_p99_ms": ms(max((p99[i] for i in healthy if p99[i] is not None), default=None)),
            "straggler_step_p50_ms": ms(p50[rank]) if rank < len(p50) else None,
            "straggler_step_p99_ms": ms(p99[rank]) if rank < len(p99) else None,
            "gradients_pushed": mid.get("gradients_pushed"), "gradients_dropped": mid.get("gradients_dropped"),
            "staleness_mean": mid.get("staleness_mean"), "staleness_p50": mid.get("staleness_p50"),
            "staleness_p99": mid.get("staleness_p99"), "staleness_max": mid.get("staleness_max"),
            "summary_json": mid["_summary_json"]})
    return sorted(out, key=lambda r: (sync_modes.MODES.index(r["mode"]), r["factor"]))


def findings(rows):
    """What a backup worker keeps, and what sync modes keep, at the largest factor."""
    top = max((r["factor"] for r in rows), default=1)
    at = {r["mode"]: r for r in rows if r["factor"] == top}
    out = []
    if top > 1 and "ps-sync-backup" in at:
        r = at["ps-sync-backup"]["ratio_to_no_straggler"]
        out.append((f"ps-sync with one backup worker, a {top:g}x straggler: applied throughput kept",
                    f"{_pct(r)} (model {_pct(at['ps-sync-backup']['model_ratio'])})"))
    for mode in ("ps-sync", "ring", "tf-collective"):
        if top > 1 and mode in at:
            out.append((f"{mode}, a {top:g}x straggler: throughput kept",
                        f"{_pct(at[mode]['ratio_to_no_straggler'])} (1/{top:g} = {_pct(1 / top)})"))
    return out


def _pct(value):
    return "n/a" if value is None else f"{100 * value:.0f}%"


def table_rows(result):
    out = []
    for r in result["rows"]:
        k = r["replicas_to_aggregate"]
        ratio = _pct(r["ratio_to_no_straggler"])
        if r["rounds"] > 1 and r["ratio_min"] is not None and r["factor"] != 1:
            ratio += f" ({_pct(r['ratio_min'])}–{_pct(r['ratio_max'])})"
        out.append({
            "mode": r["mode"], "workers": f"{r['workers']}" + (f" ({k})" if k else ""),
            "factor": "none" if r["factor"] == 1 else f"rank {r['straggler_rank']} x{r['factor']:g}"
                                                       + (f" every {r['every']}" if r["every"] != 1 else ""),
            "applied": tables.fmt(r["applied_images_per_sec"], 0), "ratio": ratio, "model": _pct(r["model_ratio"]),
            "healthy": tables.fmt(r["healthy_images_per_sec"], 0),
            "slow": tables.fmt(r["straggler_images_per_sec"], 0),
            "healthy_steps": f"{tables.fmt(r['healthy_step_p50_ms'], 0)}/{tables.fmt(r['healthy_step_p99_ms'], 0)}",
            "slow_steps": f"{tables.fmt(r['straggler_step_p50_ms'], 0)}/{tables.fmt(r['straggler_step_p99_ms'], 0)}",
            "dropped": "n/a" if r["gradients_dropped"] is None else
            f"{r['gradients_dropped']} of {r['gradients_pushed']}",
            "staleness": "n/a" if r["staleness_p50"] is None else
            f"{r['staleness_p50']}/{r['staleness_p99']}/{r['staleness_max']}"})
    return out


MAIN_COLUMNS = ["mode", "workers", "factor", "applied", "ratio", "model", "healthy", "slow", "healthy_steps",
                "slow_steps", "dropped", "staleness"]


def title(result):
    cfg = result["config"]
    return (f"One straggler in {tables.join(cfg['modes'])}: {cfg['model']}, W = {cfg['np']} workers, "
            f"on {sync_modes.where(result)}")


def method(result):
    cfg, env = result["config"], result["environment"]
    compute = (f"a simulated accelerator of {cfg['simulate_gpu_ms']:g} ms per step (waits that use no CPU, so "
               f"that {cfg['np'] + 1} workers on {env.get('cores')} cores do not slow each other)"
               if cfg.get("simulate_gpu_ms") else "real compute")
    return (f"{cfg['model']} on {cfg['data']} data, {compute}. "
            f"Each row: {cfg['steps']} steps, {cfg['warmup_steps']} of them warm-up, median of {cfg['repeats']} "
            f"round(s). Applied img/s counts the images whose gradients reached the weights (PS: the chief's "
            f"global-step rate x images per update; dropped stale gradients do not count). 'of no straggler' "
            f"compares it with the same mode's run without a straggler in the same round (range over rounds "
            f"in brackets). 'model' is bench/straggler.py's: sync keeps r = E/(E-1+F) (F: factor, E: every), "
            f"async (W-1+r)/W, one backup worker (W+r)/(W+1). Columns: bench/COLUMNS.md.\n")


def notes(result):
    return "\nWhat the rows show:\n\n" + findings_table(result["findings"]) if result["findings"] else ""


def markdown(result):
    return tables.report(title(result), finding_sentences(result), COLUMNS, table_rows(result), notes(result),
                         method(result))


def finding_sentences(result):
    """What the straggler cost each mode at the largest factor, measured and as the model says."""
    rows = result["rows"]
    top = max((r["factor"] for r in rows), default=1)
    out = []
    for r in (r for r in rows if r["factor"] == top and top > 1):
        if r["ratio_to_no_straggler"] is None:
            continue
        extra = f", dropping {r['gradients_dropped']} of {r['gradients_pushed']} gradients" \
            if r.get("gradients_dropped") else ""
        out.append(f"With a {top:g}× straggler, {r['mode']} kept {tables.share(r['ratio_to_no_straggler'])} of its "
                   f"applied throughput (model {tables.share(r['model_ratio'])}){extra}.")
    return out


def write(result, out_dir):
    text = tables.write_report(out_dir, "straggler", markdown(result), CSV_KEYS, result)
    plots.write_index(out_dir, "straggler", plots.straggler_plots(
        result["rows"], os.path.join(out_dir, "straggler_throughput.png"),
        os.path.join(out_dir, "straggler_step_times.png")))
    return text
