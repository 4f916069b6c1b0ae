"""`ringtrain-bench parity`: what ringtrain's loop costs against a plain
Horovod script (examples/plain_horovod.py) on the same Keras Applications
network, batch, optimizer, threads and ranks, all under mpirun.

The plain script runs twice a round: with the OpenMPI settings ringtrain sets
for itself before hvd.init (ranks yield when they wait, two TCP links per
peer, OpenMPI's ring), so that the ratio prices ringtrain's loop alone; and
with OpenMPI's defaults, as a plain script starts, so that the report shows
what those settings are worth. The runs alternate in order from round to
round, so that a machine that drifts slows all of them alike. Each round
gives its ratios; the report gives the median round's. All measure images/s
the same way: every rank's timed samples over the slowest rank's timed
seconds, the warm-up steps excluded.

Two recipes run a pair instead, alternating (Pair, PAIRS):
- `--recipe keras-fit` prices Horovod's Keras recipe: the same network, batch
  and ranks trained by `model.fit` with hvd.DistributedOptimizer and Horovod's
  callbacks (examples/keras_synthetic_benchmark.py), against the plain
  GradientTape script, both with ringtrain's OpenMPI settings;
- `--recipe tf-collective` prices ringtrain's loop in TF's collective mode:
  `ringtrain --backend tf-collective` against a plain MultiWorkerMirroredStrategy
  custom loop written as TF's guide writes one (examples/plain_mwms.py).
"""
import json
import os
import sys
from dataclasses import dataclass

from ringtrain.bench import launch, tables
from ringtrain.bench.environment import describe, usable_cores
from ringtrain.workloads.horovod_env import ringtrains_mpi_env
from ringtrain.workloads.numbers import median

PLAIN_SCRIPT = os.path.join(launch.REPO, "examples", "plain_horovod.py")
KERAS_FIT_SCRIPT = os.path.join(launch.REPO, "examples", "keras_synthetic_benchmark.py")
# ringtrain's own OpenMPI settings, which the plain script gets from the launch
RINGTRAINS_MPI = ringtrains_mpi_env()
IMPLS = ("plain", "plain-ompi-defaults", "ringtrain")  # (the runs' tags)
COLUMNS = [("round", "round"), ("plain", "plain Horovod img/s"), ("ringtrain", "ringtrain img/s"),
           ("ratio", "ringtrain ÷ plain"), ("defaults", "plain, OpenMPI defaults img/s"),
           ("settings", "plain ÷ plain with defaults"), ("plain_step", "plain step p50 ms"),
           ("ringtrain_step", "ringtrain step p50 ms")]
CSV_KEYS = ["round", "plain_images_per_sec", "ringtrain_images_per_sec", "ratio",
            "plain_ompi_defaults_images_per_sec", "settings_ratio", "plain_step_p50_ms", "ringtrain_step_p50_ms"]


@dataclass(frozen=True)
class Pair:
    """A recipe of two implementations, a peer and ours, run in alternating rounds."""
    peer: str        # the runs' tags
    ours: str
    peer_label: str  # in the table's headers
    ours_label: str
    ratio_label: str
    key: str         # ours' fields: KEY_images_per_sec, KEY_step_p50_ms
    title: str       # "{model}", "{np}", "{batch_size}" from the config
    method: str

    @property
    def columns(self):
        return [("round", "round"), ("plain", f"{self.peer_label} img/s"), ("ours", f"{self.ours_label} img/s"),
                ("ratio", self.ratio_label), ("plain_step", f"{self.peer_label} step p50 ms"),
                ("ours_step", f"{self.ours_label} step p50 ms")]

    @property
    def csv_keys(self):
        return ["round", "plain_images_per_sec", f"{self.key}_images_per_sec", "ratio", "plain_step_p50_ms",
                f"{self.key}_step_p50_ms"]


PAIRS = {
    "keras-fit": Pair(
        "plain", "keras-fit", "GradientTape recipe", "Keras fit recipe", "fit ÷ GradientTape", "keras_fit",
        "Horovod's Keras fit recipe against its GradientTape recipe: {model}, {np} ranks x batch {batch_size}, "
        "on this machine",
        "GradientTape: examples/plain_horovod.py; fit: examples/keras_synthetic_benchmark.py (model.fit, "
        "hvd.DistributedOptimizer, the broadcast and metric-average callbacks, epochs of 10 steps). Both with the "
        "OpenMPI settings ringtrain sets for itself"),
    "tf-collective": Pair(
        "plain-mwms", "tf-collective", "plain MWMS script", "ringtrain tf-collective", "ringtrain ÷ plain MWMS",
        "tf_collective",
        "ringtrain's TF collective mode against a plain MultiWorkerMirroredStrategy script: {model}, {np} workers "
        "x batch {batch_size}, on this machine",
        "The plain script: examples/plain_mwms.py (TF's guide's custom loop: strategy.run, the optimizer's own "
        "all-reduce after backprop); ringtrain: --backend tf-collective with its defaults (its gradient buckets, "
        "the loop's every feature). Both TF's RING"),
}
PLAIN_MWMS_SCRIPT = os.path.join(launch.REPO, "examples", "plain_mwms.py")


def commands(cfg, summary_path):
    """{impl: (its mpirun command, its environment)}, one rank per process, not bound to cores."""
    app = cfg["model"].split(":", 1)[-1]  # (keras:NAME's NAME, or mnist_cnn)
    height, width, channels = cfg["image_shape"]
    shared = ["--batch-size", str(cfg["batch_size"]), "--steps", str(cfg["steps"]),
              "--warmup-steps", str(cfg["warmup_steps"]), "--lr", f"{cfg['lr']:g}", "--threads", str(cfg["threads"])]
    fed = ["--input", plain_input(cfg)]  # (the plain scripts' input)
    plain = [sys.executable, PLAIN_SCRIPT, "--model", app, "--image-shape", f"{height}x{width}x{channels}",
             *shared, *fed]
    names = sorted(RINGTRAINS_MPI)
    if cfg.get("recipe") == "keras-fit":
        fit_script = [sys.executable, KERAS_FIT_SCRIPT, "--model", app, "--image-shape",
                      f"{height}x{width}x{channels}", *shared, *fed]
        return {"plain": (launch.mpirun(cfg["np"], plain, usable_cores(), env_names=names), RINGTRAINS_MPI),
                "keras-fit": (launch.mpirun(cfg["np"], fit_script, usable_cores(), env_names=names), RINGTRAINS_MPI)}
    ours = [launch.tool("ringtrain"), "--model", cfg["model"], "--data", "synthetic",
            "--image-shape", f"{height}x{width}x{channels}", "--optimizer", "sgd", "--no-lr-scaling",
            "--warmup-epochs", "0", "--log-every", str(cfg["steps"]), "--summary-json", summary_path, *shared]
    if cfg.get("recipe") == "tf-collective":  # (mpirun only starts the workers: TF's gRPC carries the ring)
        mwms = [sys.executable, PLAIN_MWMS_SCRIPT, "--model", app, "--image-shape", f"{height}x{width}x{channels}",
                *shared, *fed]
        return {"plain-mwms": (launch.mpirun(cfg["np"], mwms, usable_cores()), {}),
                "tf-collective": (launch.mpirun(cfg["np"], [*ours, "--backend", "tf-collective"], usable_cores()),
                                  {})}
    return {"plain": (launch.mpirun(cfg["np"], plain, usable_cores(), env_names=names), RINGTRAINS_MPI),
            "plain-ompi-defaults": (launch.mpirun(cfg["np"], plain, usable_cores()), {}),
            "ringtrain": (launch.mpirun(cfg["np"], ours, usable_cores()), {})}


def plain_input(cfg):
    """How the plain scripts feed their steps: constant (one batch; results made before the
    flag have none) or tf.data."""
    return cfg.get("plain_input", "constant")


def input_sentence(cfg):
    if plain_input(cfg) == "tf.data":
        return ("The plain scripts read random images through tf.data (each rank its own, in memory, shuffled, "
                "batched, scaled, prefetched: --plain-input tf.data), as ringtrain reads its --data synthetic. ")
    return "The plain scripts feed one random batch again and again; ringtrain reads its --data synthetic. "


def run(cfg, out_dir, log=print):
    runs_dir = os.path.join(out_dir, "runs")
    os.makedirs(runs_dir, exist_ok=True)
    environment = describe(threads_per_worker=cfg["threads"], hostfile=None)
    pair = PAIRS.get(cfg.get("recipe"))
    impls = (pair.peer, pair.ours) if pair else IMPLS
    rows = []
    for round_ in range(1, cfg["rounds"] + 1):
        measured = {}
        for impl in impls[round_ % len(impls):] + impls[:round_ % len(impls)]:
            tag = f"{impl}-r{round_}"
            summary_path, log_path = (os.path.join(runs_dir, f"{tag}.{ext}") for ext in ("json", "log"))
            cmd, env = commands(cfg, summary_path)[impl]
            log(f"ringtrain-bench: {tag}: {' '.join(os.path.basename(c) if i < 1 else c for i, c in enumerate(cmd))}")
            code = launch.run(cmd, log_path, cfg["timeout"], env=env)
            measured[impl] = _summary(impl, summary_path, log_path, code, tag)
        if pair:
            plain, ours = measured[pair.peer], measured[pair.ours]
            rows.append({"round": round_, "plain_images_per_sec": plain["images_per_sec"],
                         f"{pair.key}_images_per_sec": ours["images_per_sec"],
                         "ratio": ours["images_per_sec"] / plain["images_per_sec"],
                         "plain_step_p50_ms": 1000 * plain["step_time_p50_sec"],
                         f"{pair.key}_step_p50_ms": 1000 * _slowest_rank_step(ours)})
            continue
        plain, defaults, ours = (measured[impl] for impl in IMPLS)
        rows.append({"round": round_, "plain_images_per_sec": plain["images_per_sec"],
                     "ringtrain_images_per_sec": ours["images_per_sec"],
                     "ratio": ours["images_per_sec"] / plain["images_per_sec"],
                     "plain_ompi_defaults_images_per_sec": defaults["images_per_sec"],
                     "settings_ratio": plain["images_per_sec"] / defaults["images_per_sec"],
                     "plain_step_p50_ms": 1000 * plain["step_time_p50_sec"],
                     "ringtrain_step_p50_ms": 1000 * _slowest_rank_step(ours)})
    result = {"config": cfg, "environment": environment, "rows": rows,
              "median_ratio": median([r["ratio"] for r in rows])}
    if not pair:
        result["median_settings_ratio"] = median([r["settings_ratio"] for r in rows])
    result["environment"]["load_average_at_end"] = list(os.getloadavg())
    write(result, out_dir)
    return result


def write(result, out_dir):
    from ringtrain.bench import plots
    plots.write_index(out_dir, "parity", [])  # no plot: a ratio a round
    pair = pair_of(result)
    return tables.write_report(out_dir, "parity", markdown(result), pair.csv_keys if pair else CSV_KEYS, result)


def pair_of(result):
    """The result's Pair, or None: ringtrain against the plain Horovod script."""
    return PAIRS.get(result["config"].get("recipe"))


def columns_of(result):
    """(COLUMNS, MAIN_COLUMNS) of this result's table: a pair has its own."""
    pair = pair_of(result)
    return (pair.columns, PAIR_MAIN_COLUMNS) if pair else (COLUMNS, MAIN_COLUMNS)


def _summary(impl, summary_path, log_path, code, tag):
    if code != 0:
        raise RuntimeError(f"{tag} failed (exit {code}); last lines of {log_path}:\n{launch.tail(log_path)}")
    if impl in ("ringtrain", "tf-collective"):
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


MAIN_COLUMNS = ["round", "plain", "ringtrain", "ratio", "defaults", "settings", "plain_step", "ringtrain_step"]
PAIR_MAIN_COLUMNS = ["round", "plain", "ours", "ratio", "plain_step", "ours_step"]


def title(result):
    cfg, pair = result["config"], pair_of(result)
    if pair:
        return pair.title.format(**cfg)
    return (f"ringtrain against a plain Horovod script: {cfg['model']}, {cfg['np']} ranks x batch "
            f"{cfg['batch_size']}, on this machine")


def method(result):
    cfg, pair = result["config"], pair_of(result)
    shape = "x".join(map(str, cfg["image_shape"]))
    settings = ', '.join(f'{k}={v}' for k, v in sorted(RINGTRAINS_MPI.items()))
    if pair:
        return (f"{shape} images, {cfg['threads']} TF thread(s) per rank, under mpirun. {input_sentence(cfg)}"
                f"{pair.method}"
                + (f" ({settings})" if pair.peer == "plain" else "") + f". SGD, {cfg['steps']} steps of which "
                f"{cfg['warmup_steps']} are warm-up, in {cfg['rounds']} round(s), the order alternating. img/s: "
                f"every rank's timed samples over the slowest rank's timed seconds. Columns: bench/COLUMNS.md.\n")
    return (f"{shape} images, {cfg['threads']} TF thread(s) per rank. {input_sentence(cfg)}"
            f"All under mpirun, SGD, {cfg['steps']} steps of which {cfg['warmup_steps']} are warm-up, in "
            f"{cfg['rounds']} round(s), the order rotating. img/s: every rank's timed samples over the slowest "
            f"rank's timed seconds. The plain script is examples/plain_horovod.py, run with the OpenMPI settings "
            f"ringtrain sets for itself ({settings}), and again with OpenMPI's defaults. Columns: "
            f"bench/COLUMNS.md.\n")


def table_rows(result):
    pair = pair_of(result)
    if pair:
        return [{"round": r["round"], "plain": tables.fmt(r["plain_images_per_sec"], 1),
                 "ours": tables.fmt(r[f"{pair.key}_images_per_sec"], 1), "ratio": f"{r['ratio']:.3f}",
                 "plain_step": tables.fmt(r["plain_step_p50_ms"], 0),
                 "ours_step": tables.fmt(r[f"{pair.key}_step_p50_ms"], 0)} for r in result["rows"]]
    return [{"round": r["round"], "plain": tables.fmt(r["plain_images_per_sec"], 1),
             "ringtrain": tables.fmt(r["ringtrain_images_per_sec"], 1), "ratio": f"{r['ratio']:.3f}",
             "defaults": tables.fmt(r["plain_ompi_defaults_images_per_sec"], 1),
             "settings": f"{r['settings_ratio']:.3f}", "plain_step": tables.fmt(r["plain_step_p50_ms"], 0),
             "ringtrain_step": tables.fmt(r["ringtrain_step_p50_ms"], 0)} for r in result["rows"]]


def notes(result):
    pair = pair_of(result)
    if pair:
        return f"\nMedian round: {pair.ratio_label} = {result['median_ratio']:.3f}.\n"
    return (f"\nMedian round: ringtrain ÷ plain = {result['median_ratio']:.3f}; plain with ringtrain's "
            f"OpenMPI settings ÷ plain with OpenMPI's defaults = {result['median_settings_ratio']:.3f}.\n")


def markdown(result):
    return tables.report(title(result), finding_sentences(result), columns_of(result)[0], table_rows(result),
                         notes(result), method(result))


def finding_sentences(result):
    rounds = len(result["rows"])
    of = f"the median of {rounds} rounds" if rounds > 1 else "one round"
    pair = pair_of(result)
    if plain_input(result["config"]) == "tf.data":
        of += ", the plain script reading its images through tf.data"
    if pair:
        return [f"{pair.ours_label} trained at {result['median_ratio']:.3f}× the {pair.peer_label}'s img/s ({of})."]
    return [f"ringtrain trained at {result['median_ratio']:.3f}× the plain Horovod script's img/s ({of}).",
            f"ringtrain's OpenMPI settings made the plain script {result['median_settings_ratio']:.3f}× as fast "
            f"as OpenMPI's defaults ({of})."]
