"""`ringtrain-bench parity`: what ringtrain's loop costs against a plain
Horovod script (examples/plain_horovod.py) on the same Keras Applications
network, batch, optimizer, threads and ranks, both under mpirun.

The two run in alternating rounds (plain first in odd rounds, ringtrain
first in even ones), so that a machine that drifts slows both alike. Each
round gives one ratio; the report gives the median round's. Both measure
images/s the same way: every rank's timed samples over the slowest rank's
timed seconds, the warm-up steps excluded.
"""
import json
import os
import sys

from ringtrain.bench import launch, tables
from ringtrain.bench.environment import describe, usable_cores
from ringtrain.workloads.numbers import median

PLAIN_SCRIPT = os.path.join(launch.REPO, "examples", "plain_horovod.py")
IMPLS = ("plain Horovod script", "ringtrain")
COLUMNS = [("round", "round"), ("plain", "plain Horovod img/s"), ("ringtrain", "ringtrain img/s"),
           ("ratio", "ringtrain ÷ plain"), ("plain_step", "plain step p50 ms"),
           ("ringtrain_step", "ringtrain step p50 ms")]
CSV_KEYS = ["round", "plain_images_per_sec", "ringtrain_images_per_sec", "ratio", "plain_step_p50_ms",
            "ringtrain_step_p50_ms"]


def commands(cfg, summary_path):
    """{impl: its mpirun command}, one rank per process, not bound to cores."""
    app = cfg["model"].split(":", 1)[1]
    height, width, channels = cfg["image_shape"]
    shared = ["--batch-size", str(cfg["batch_size"]), "--steps", str(cfg["steps"]),
              "--warmup-steps", str(cfg["warmup_steps"]), "--lr", f"{cfg['lr']:g}", "--threads", str(cfg["threads"])]
    plain = [sys.executable, PLAIN_SCRIPT, "--model", app, "--image-shape", f"{height}x{width}x{channels}",
             *shared]
    ours = [launch.tool("ringtrain"), "--model", cfg["model"], "--dataset", "synthetic",
            "--image-shape", f"{height}x{width}x{channels}", "--optimizer", "sgd", "--no-lr-scaling",
            "--warmup-epochs", "0", "--log-every", str(cfg["steps"]), "--summary-json", summary_path, *shared]
    return {name: launch.mpirun(cfg["np"], cmd, usable_cores()) for name, cmd in zip(IMPLS, (plain, ours))}


def run(cfg, out_dir, log=print):
    runs_dir = os.path.join(out_dir, "runs")
    os.makedirs(runs_dir, exist_ok=True)
    environment = describe(threads_per_worker=cfg["threads"], hostfile=None)
    rows = []
    for round_ in range(1, cfg["rounds"] + 1):
        measured = {}
        for impl in (IMPLS if round_ % 2 else IMPLS[::-1]):
            tag = f"{'plain' if impl == IMPLS[0] else 'ringtrain'}-r{round_}"
            summary_path, log_path = (os.path.join(runs_dir, f"{tag}.{ext}") for ext in ("json", "log"))
            cmd = commands(cfg, summary_path)[impl]
            log(f"ringtrain-bench: {tag}: {' '.join(os.path.basename(c) if i < 1 else c for i, c in enumerate(cmd))}")
            code = launch.run(cmd, log_path, cfg["timeout"])
            measured[impl] = _summary(impl, summary_path, log_path, code, tag)
        plain, ours = measured[IMPLS[0]], measured[IMPLS[1]]
        rows.append({"round": round_, "plain_images_per_sec": plain["images_per_sec"],
                     "ringtrain_images_per_sec": ours["images_per_sec"],
                     "ratio": ours["images_per_sec"] / plain["images_per_sec"],
                     "plain_step_p50_ms": 1000 * plain["step_time_p50_sec"],
                     "ringtrain_step_p50_ms": 1000 * _slowest_rank_step(ours)})
    result = {"config": cfg, "environment": environment, "rows": rows,
              "median_ratio": median([r["ratio"] for r in rows])}
    result["environment"]["load_average_at_end"] = list(os.getloadavg())
    tables.write_report(out_dir, "parity", markdown(result), CSV_KEYS, result)
    return result


def _summary(impl, summary_path, log_path, code, tag):
    if code != 0:
        raise RuntimeError(f"{tag} failed (exit {code}); last lines of {log_path}:\n{launch.tail(log_path)}")
    if impl == IMPLS[1]:
        with open(summary_path) as f:
            return json.load(f)
    with open(log_path, errors="replace") as f:  # the plain script prints its one JSON line
        lines = [line for line in f if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{tag} printed no result; last lines of {log_path}:\n{launch.tail(log_path)}")
    return json.loads(lines[-1])


def _slowest_rank_step(summary):
    """ringtrain's summary has each rank's p50: the job's step is the slowest rank's."""
    p50 = summary["step_time_p50_sec"]
    return max(p50) if isinstance(p50, list) else p50


def markdown(result):
    cfg = result["config"]
    shape = "x".join(map(str, cfg["image_shape"]))
    text = (f"# ringtrain against a plain Horovod script: {cfg['model']}, {shape} images, {cfg['np']} ranks "
            f"x batch {cfg['batch_size']}, {cfg['threads']} TF thread(s) each\n\n"
            f"Both under mpirun, SGD, {cfg['steps']} steps of which {cfg['warmup_steps']} are warm-up, in "
            f"{cfg['rounds']} alternating round(s). img/s: every rank's timed samples over the slowest rank's "
            f"timed seconds. The plain script is examples/plain_horovod.py. Columns: bench/COLUMNS.md.\n\n")
    text += tables.markdown(COLUMNS, [{
        "round": r["round"], "plain": tables.fmt(r["plain_images_per_sec"], 1),
        "ringtrain": tables.fmt(r["ringtrain_images_per_sec"], 1), "ratio": f"{r['ratio']:.3f}",
        "plain_step": tables.fmt(r["plain_step_p50_ms"], 0), "ringtrain_step": tables.fmt(r["ringtrain_step_p50_ms"], 0)}
        for r in result["rows"]])
    return text + f"\nMedian round: ringtrain ÷ plain = {result['median_ratio']:.3f}.\n"
