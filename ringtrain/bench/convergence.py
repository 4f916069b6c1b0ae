"""`ringtrain-bench convergence`: test accuracy against training time and
against samples seen, for every mode of bench/sync_modes.py, and the time
each takes to reach a target accuracy.

Every mode gets the same budget: --steps S updates of W batches (ring, sync
PS; async: S steps on each of W workers, one batch per update), the same
optimizer and lr on the same global batch. The chief snapshots the weights
every K steps (workloads/snapshots.py: the snapshot's time is off the clock,
and nobody waits for an evaluation); the bench evaluates every snapshot on
the whole test split afterwards, and deletes its weights.
"""
import os
import time

from ringtrain.bench import plots, scaling, sites, sync_modes, tables
from ringtrain.bench.environment import describe
from ringtrain.workloads import snapshots
from ringtrain.workloads.numbers import median, percent

COLUMNS = [("mode", "mode"), ("workers", "workers (K)"), ("time", "seconds to target"),
           ("launch", "from launch"), ("samples", "samples to target"), ("final", "final accuracy"),
           ("best", "best snapshot"),
           ("applied", "applied img/s"), ("reached", "rounds reaching target")]
CSV_KEYS = ["mode", "workers", "replicas_to_aggregate", "rounds", "rounds_reaching_target", "target",
            "seconds_to_target", "seconds_to_target_min", "seconds_to_target_max",
            "seconds_from_launch_to_target", "samples_to_target",
            "final_accuracy", "best_accuracy", "applied_images_per_sec", "training_seconds"]


def run(cfg, out_dir, log=print, site=None):
    site = site or sites.this_machine()
    environment = describe(threads_per_worker=cfg["threads"], hostfile=site.label)
    evaluate = evaluator(cfg)
    runs = {}
    for round_ in range(cfg["repeats"]):
        for mode in cfg["modes"]:
            tag = f"{mode}-r{round_ + 1}"
            folder = os.path.join(out_dir, "runs", f"{tag}-snapshots")
            extra = ["--lr", f"{cfg['lr']:g}", "--snapshot-every", str(cfg["snapshot_every"]),
                     "--snapshot-dir", folder] + (["--straggler", cfg["straggler"]] if cfg.get("straggler") else [])
            launched = time.time()
            summary = sync_modes.run(mode, cfg["np"], cfg, out_dir, tag, log, site, extra)
            summary["_curve"] = curve(folder, evaluate, launched)
            log(f"ringtrain-bench: {tag}: {len(summary['_curve'])} snapshots evaluated")
            runs.setdefault(mode, []).append(summary)
    result = {"config": cfg, "environment": environment, "site": scaling.site_facts(site, cfg),
              "rows": rows(cfg, runs),
              "curves": [{"mode": mode, "round": i + 1, "points": s["_curve"]}
                         for mode, summaries in runs.items() for i, s in enumerate(summaries)]}
    result["environment"]["load_average_at_end"] = list(os.getloadavg())
    result["winner"] = winner(result["rows"])
    result["winner_from_launch"] = winner(result["rows"], "seconds_from_launch_to_target")
    write(result, out_dir)
    return result


def evaluator(cfg):
    """accuracy(weights by name) on the whole test split, in this process."""
    from ringtrain.workloads import catalog, data, models
    from ringtrain.workloads.evaluation import evaluate, metrics_of
    dataset = data.load(cfg["data"], cfg.get("data_dir"), catalog.image_shape(cfg["model"]))
    model = models.build(cfg["model"], seed=0, image_shape=dataset.train_images.shape[1:])
    by_name = {models.variable_name(v): v for v in model.variables}
    metrics = metrics_of(model)

    def accuracy(weights):
        missing = sorted(set(by_name) - set(weights))
        if missing:
            raise RuntimeError(f"a snapshot lacks the model's variables {missing[:3]}...")
        for name, variable in by_name.items():
            variable.assign(weights[name])
        return evaluate(metrics, dataset).accuracy

    return accuracy


def curve(folder, accuracy, launched):
    """[(training seconds, samples seen, test accuracy, seconds since launch)]
    of a run's snapshots (snapshot time excluded); their weights are deleted
    once evaluated."""
    points = []
    for record in snapshots.read(folder):
        since_launch = record["unix_time"] - launched - record["snapshot_seconds_so_far"]
        points.append((record["training_seconds"], record["samples_seen"],
                       accuracy(snapshots.load(folder, record)), since_launch))
        os.remove(os.path.join(folder, record["file"]))
    return points


def to_target(points, target):
    """(training seconds, samples, seconds since launch) at the first snapshot
    at or above target, or None."""
    return next(((s, n, launch) for s, n, acc, launch in points if acc >= target), None)


def rows(cfg, runs):
    out = []
    for mode, summaries in runs.items():
        reached = [to_target(s["_curve"], cfg["target"]) for s in summaries]
        seconds = [r[0] for r in reached if r]
        out.append({
            "mode": mode, "workers": sync_modes.processes(mode, cfg["np"]),
            "replicas_to_aggregate": summaries[0].get("replicas_to_aggregate"), "rounds": len(summaries),
            "rounds_reaching_target": len(seconds), "target": cfg["target"],
            # the median over rounds; a round that never got there counts as slower than any that did
            "seconds_to_target": median(seconds) if len(seconds) * 2 > len(summaries) else None,
            "seconds_to_target_min": min(seconds, default=None), "seconds_to_target_max": max(seconds, default=None),
            "samples_to_target": median([r[1] for r in reached if r])
            if len(seconds) * 2 > len(summaries) else None,
            "seconds_from_launch_to_target": median([r[2] for r in reached if r])
            if len(seconds) * 2 > len(summaries) else None,
            "final_accuracy": median([s["test_accuracy"] for s in summaries]),
            "best_accuracy": max((p[2] for s in summaries for p in s["_curve"]), default=None),
            "applied_images_per_sec": median([sync_modes.applied_images_per_sec(s) for s in summaries]),
            "training_seconds": median([s["wall_time_sec"] for s in summaries])})
    return sorted(out, key=lambda r: sync_modes.MODES.index(r["mode"]))


def winner(rows, key="seconds_to_target"):
    done = [r for r in rows if r[key] is not None]
    return min(done, key=lambda r: r[key])["mode"] if done else None


def table_rows(result):
    out = []
    for r in result["rows"]:
        k = r["replicas_to_aggregate"]
        time = tables.fmt(r["seconds_to_target"], 1)
        if r["rounds"] > 1 and r["seconds_to_target_min"] is not None:
            time += f" ({tables.fmt(r['seconds_to_target_min'], 1)}–{tables.fmt(r['seconds_to_target_max'], 1)})"
        out.append({"mode": r["mode"], "workers": f"{r['workers']}" + (f" ({k})" if k else ""), "time": time,
                    "launch": tables.fmt(r["seconds_from_launch_to_target"], 1),
                    "samples": tables.fmt(r["samples_to_target"], 0),
                    "final": percent(r["final_accuracy"], digits=2, fraction=True), "best": percent(r["best_accuracy"], digits=2, fraction=True),
                    "applied": tables.fmt(r["applied_images_per_sec"], 0),
                    "reached": f"{r['rounds_reaching_target']} of {r['rounds']}"})
    return out


MAIN_COLUMNS = ["mode", "workers", "time", "launch", "samples", "final", "best", "applied", "reached"]


def title(result):
    cfg = result["config"]
    return (f"Time to {100 * cfg['target']:g}% test accuracy in {tables.join(cfg['modes'])}: {cfg['model']} on "
            f"{cfg['data']} data, W = {cfg['np']} workers, on {sync_modes.where(result)}")


def method(result):
    cfg = result["config"]
    return (f"Budget: {cfg['steps']} updates of {cfg['np']} x {cfg['batch_size']} images (async: {cfg['steps']} "
            f"steps per worker, one batch per update); {cfg['optimizer']}, lr {cfg['lr']:g} in every mode"
            + (f"; straggler {cfg['straggler']}" if cfg.get("straggler") else "") +
            f". The chief snapshots the weights every {cfg['snapshot_every']} steps; each snapshot is evaluated "
            f"afterwards on the whole test split. Seconds are training time from the first step (its tracing "
            f"included), start-up and snapshots excluded; 'from launch' counts from the launcher's start "
            f"(TF's import, the cluster's start-up), snapshots excluded; medians over {cfg['repeats']} round(s), "
            f"range in brackets. Samples are those "
            f"whose gradients were applied. Columns: bench/COLUMNS.md.\n")


def notes(result):
    cfg = result["config"]
    win, win_launch = result["winner"], result["winner_from_launch"]
    return (f"\nFirst to {100 * cfg['target']:g}% in training time: **{win}**; counting start-up from the "
            f"launcher's start: **{win_launch}**.\n" if win else
            f"\nNo mode reached {100 * cfg['target']:g}% in most rounds: give more --steps.\n")


def markdown(result):
    return tables.report(title(result), finding_sentences(result), COLUMNS, table_rows(result), notes(result),
                         method(result))


def finding_sentences(result):
    """Each mode's time to the target (or its best snapshot, if it did not get there)."""
    target = f"{100 * result['config']['target']:g} %"
    out = []
    for r in sorted(result["rows"], key=lambda r: (r["seconds_to_target"] is None, r["seconds_to_target"] or 0)):
        if r["seconds_to_target"] is not None:
            out.append(f"{r['mode']} reached {target} test accuracy after {r['seconds_to_target']:,.1f} s of "
                       f"training ({r['seconds_from_launch_to_target']:,.1f} s from launch, "
                       f"{r['samples_to_target']:,.0f} samples).")
        else:
            best = "n/a" if r["best_accuracy"] is None else f"{100 * r['best_accuracy']:.1f} %"
            out.append(f"{r['mode']} did not reach {target} in most rounds; its best snapshot scored {best}.")
    return out


def write(result, out_dir):
    text = tables.write_report(out_dir, "convergence", markdown(result), CSV_KEYS, result)
    plots.write_index(out_dir, "convergence", plots.convergence_plots(
        [(c["mode"], c["points"]) for c in result["curves"]], os.path.join(out_dir, "convergence_time.png"),
        os.path.join(out_dir, "convergence_samples.png"), target=result["config"]["target"]))
    return text
