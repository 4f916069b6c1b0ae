"""`ringtrain-bench pipeline`: the input pipeline alone, in images per second
and per core, for each --data source; with --train N[,N...], the model also
trained from each source under mpirun, side by side: in each round every
source at every N, the sources' order rotating from round to round, so that
a machine that drifts slows all of them alike.

A source `tfrecords:NAME` is the training (and test) images of the built-in
data set NAME (mnist, cifar10, synthetic), written as TFRecord files of PNGs
into OUT/tfrecords-NAME first: the same images, from disk, against memory.

The pipeline alone is timed in a process of its own (the trainer's flags,
its --threads): the updates one worker reads (decoded, resized, batched,
prefetched), warm-up excluded; per core: images over the process's CPU
seconds, every thread's."""
import json
import os
import sys

from ringtrain.bench import launch, tables
from ringtrain.bench.environment import describe, usable_cores
from ringtrain.workloads.numbers import median

WRITTEN = "tfrecords:"
COLUMNS = [("data", "data"), ("pipeline", "pipeline img/s"), ("per_core", "pipeline img/s per core"),
           ("workers", "N"), ("training", "training img/s"), ("range", "training range"), ("ratio", "÷ first data")]
MAIN_COLUMNS = ["data", "pipeline", "per_core", "workers", "training", "ratio"]
CSV_KEYS = ["data", "pipeline_images_per_sec", "pipeline_images_per_core_sec", "workers", "images_per_sec",
            "images_per_sec_min", "images_per_sec_max", "ratio_to_first"]


def sources(cfg, out_dir, log):
    """{label: the --data words the trainer takes}, TFRecords written where asked for."""
    out = {}
    for label in cfg["data"]:
        if label.startswith(WRITTEN):
            name = label[len(WRITTEN):]
            out[label] = ["--data", written(cfg, name, os.path.join(out_dir, f"tfrecords-{name}"),
                                            log)]
        else:
            out[label] = ["--data", label] + (["--data-dir", cfg["data_dir"]] if cfg.get("data_dir") else [])
    return out


def written(cfg, name, folder, log):
    """The built-in data set `name`'s images as TFRecord files (PNG) in `folder`: the glob of the training files."""
    from ringtrain.workloads import catalog, data, writers
    loaded = data.load(name, cfg.get("data_dir"), catalog.image_shape(cfg["model"]), seed=0)
    log(f"ringtrain-bench: writing {name}'s {len(loaded.train_labels)} + {len(loaded.test_labels)} images as "
        f"TFRecords into {folder}")
    writers.write_tfrecords(loaded.train_images, loaded.train_labels, os.path.join(folder, "train"), cfg["files"])
    writers.write_tfrecords(loaded.test_images, loaded.test_labels, os.path.join(folder, "validation"),
                            max(1, cfg["files"] // 4))
    return os.path.join(folder, "train-*")


def shared_flags(cfg):
    return ["--model", cfg["model"], "--batch-size", str(cfg["batch_size"]), "--threads", str(cfg["threads"])]


def time_alone(cfg, words, log_path):
    """The pipeline alone, in a process of its own: {images_per_sec, images_per_core_sec}."""
    cmd = [sys.executable, "-m", "ringtrain.bench.pipeline", "--seconds", str(cfg["seconds"]), *shared_flags(cfg),
           *words]
    if launch.run(cmd, log_path, cfg["timeout"]) != 0:
        raise RuntimeError(f"timing the pipeline failed; last lines of {log_path}:\n{launch.tail(log_path)}")
    with open(log_path) as f:
        return json.loads([line for line in f if line.startswith("{")][-1])


def train(cfg, words, workers, summary_path, log_path):
    """The model trained from one source under mpirun: its summary."""
    command = [launch.tool("ringtrain"), *shared_flags(cfg), "--optimizer", "sgd", "--no-lr-scaling",
               "--warmup-epochs", "0", *words, "--steps", str(cfg["steps"]),
               "--warmup-steps", str(cfg["warmup_steps"]), "--log-every", str(cfg["steps"]),
               "--summary-json", summary_path]
    code = launch.run(launch.mpirun(workers, command, usable_cores()), log_path, cfg["timeout"])
    if code != 0:
        raise RuntimeError(f"training failed (exit {code}); last lines of {log_path}:\n{launch.tail(log_path)}")
    with open(summary_path) as f:
        return json.load(f)


def run(cfg, out_dir, log=print):
    runs_dir = os.path.join(out_dir, "runs")
    os.makedirs(runs_dir, exist_ok=True)
    words, measured = sources(cfg, out_dir, log), []
    environment = describe(threads_per_worker=cfg["threads"], hostfile=None)
    environment["load_average_at_start"] = list(os.getloadavg())
    labels = list(words)
    for round_ in range(1, cfg["rounds"] + 1):
        order = labels[round_ % len(labels):] + labels[:round_ % len(labels)]
        for label in order:
            tag = f"{_tag(label)}-r{round_}"
            alone = time_alone(cfg, words[label], os.path.join(runs_dir, f"{tag}-alone.log"))
            measured.append({"data": label, "round": round_, "workers": 0, **alone})
            log(f"ringtrain-bench: {tag}: pipeline alone {alone['images_per_sec']:.0f} img/s")
        for workers in cfg["train"]:
            for label in order:
                tag = f"{_tag(label)}-n{workers}-r{round_}"
                summary = train(cfg, words[label], workers, *(os.path.join(runs_dir, f"{tag}.{x}") for x in ("json", "log")))
                measured.append({"data": label, "round": round_, "workers": workers, "load": list(os.getloadavg()),
                                 "images_per_sec": summary["images_per_sec"]})
                log(f"ringtrain-bench: {tag}: {summary['images_per_sec']:.0f} img/s")
    result = {"config": cfg, "environment": environment, "runs": measured, "rows": rows(cfg, labels, measured)}
    result["environment"]["load_average_at_end"] = list(os.getloadavg())
    write(result, out_dir)
    return result


def _tag(label):
    return "".join(c if c.isalnum() else "-" for c in label).strip("-")


def rows(cfg, labels, measured):
    """One row per source and N: medians over the rounds, and the ratio to the first source's."""
    def of(label, workers, key="images_per_sec"):
        return [m[key] for m in measured if m["data"] == label and m["workers"] == workers]
    out = []
    for workers in cfg["train"] or [None]:
        for label in labels:
            trained = of(label, workers) if workers else []
            first = of(labels[0], workers) if workers else []
            out.append({"data": label, "workers": workers,
                        "pipeline_images_per_sec": median(of(label, 0)),
                        "pipeline_images_per_core_sec": median(of(label, 0, "images_per_core_sec")),
                        "images_per_sec": median(trained) if trained else None,
                        "images_per_sec_min": min(trained) if trained else None,
                        "images_per_sec_max": max(trained) if trained else None,
                        "ratio_to_first": median(trained) / median(first) if trained and first else None})
    return out


def write(result, out_dir):
    from ringtrain.bench import plots
    plots.write_index(out_dir, "pipeline", [])  # no plot: a few numbers per source
    return tables.write_report(out_dir, "pipeline", markdown(result), CSV_KEYS, result)


def title(result):
    cfg = result["config"]
    return f"The input pipeline: {', '.join(cfg['data'])} for {cfg['model']}, batch {cfg['batch_size']}, on this machine"


def table_rows(result):
    fmt = lambda v, digits=0: tables.fmt(v, digits) if v is not None else "—"
    return [{"data": r["data"], "pipeline": fmt(r["pipeline_images_per_sec"]),
             "per_core": fmt(r["pipeline_images_per_core_sec"]), "workers": r["workers"] or "—",
             "training": fmt(r["images_per_sec"], 1),
             "range": f"{r['images_per_sec_min']:.1f}–{r['images_per_sec_max']:.1f}" if r["images_per_sec"] else "—",
             "ratio": f"{r['ratio_to_first']:.3f}" if r["ratio_to_first"] else "—"} for r in result["rows"]]


def finding_sentences(result):
    cfg, out = result["config"], []
    rounds = f"the median of {cfg['rounds']} rounds" if cfg["rounds"] > 1 else "one round"
    first = cfg["data"][0]
    for r in result["rows"]:
        if r["ratio_to_first"] and r["data"] != first:
            out.append(f"From {r['data']}, {cfg['model']} trained at {r['ratio_to_first']:.3f}× its img/s from "
                       f"{first} at N = {r['workers']} ({rounds}).")
    for r in result["rows"]:
        if r["workers"] in (None, (cfg["train"] or [None])[0]):
            out.append(f"The pipeline alone read {r['data']} at {r['pipeline_images_per_sec']:.0f} img/s, "
                       f"{r['pipeline_images_per_core_sec']:.0f} per core ({rounds}).")
    return out


def notes(result):
    env = result["environment"]
    return (f"\nLoad average (1, 5, 15 min) at the start: {', '.join(f'{x:.2f}' for x in env['load_average_at_start'])}"
            f"; at the end: {', '.join(f'{x:.2f}' for x in env['load_average_at_end'])}.\n")


def method(result):
    cfg = result["config"]
    return (f"Each round times the pipeline alone for {cfg['seconds']:g} s per source (one worker's updates, "
            f"decoded, resized, batched and prefetched, after {WARMUP_UPDATES} untimed updates; per core: over the "
            f"process's CPU seconds, every thread's), then trains {cfg['model']} from each source with "
            f"ringtrain under mpirun at N = {', '.join(map(str, cfg['train'])) or '—'}: {cfg['steps']} steps of "
            f"which {cfg['warmup_steps']} are warm-up, SGD, {cfg['threads']} TF thread(s) per rank; img/s as every "
            f"ringtrain summary measures it. The sources' order rotates from round to round. tfrecords:NAME is "
            f"NAME's images written as PNGs into {cfg['files']} TFRecord files. Columns: bench/COLUMNS.md.\n")


def markdown(result):
    return tables.report(title(result), finding_sentences(result), COLUMNS, table_rows(result), notes(result),
                         method(result))


# --- the pipeline alone, in a process of its own -------------------------------------------

WARMUP_UPDATES = 20


def time_it(argv):
    """`python -m ringtrain.bench.pipeline --seconds S TRAINER-FLAGS`: one JSON line."""
    import time
    from ringtrain.workloads import config, flags, pipeline
    from ringtrain.workloads.tfenv import import_tensorflow_quietly, set_threads
    parser = flags.add_training_flags(flags.OneLineParser(prog="ringtrain-bench pipeline"))
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    source = flags.load_training_data(args, workers=1)
    run_config = config.from_args(args)
    import_tensorflow_quietly()
    set_threads(run_config.data.threads)
    updates = pipeline.batches_from(source, 0, 1, run_config.data, 0)
    for _ in range(WARMUP_UPDATES):
        next(updates)
    images, start, cpu = 0.0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < args.seconds:
        images += float(next(updates)[2][2].numpy().sum())  # (real samples: weights)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(json.dumps({"images": images, "seconds": seconds, "cpu_seconds": cpu, "images_per_sec": images / seconds,
                      "images_per_core_sec": images / cpu}), flush=True)
    return 0


if __name__ == "__main__":
    from ringtrain.common.errors import run_cli
    sys.exit(run_cli("ringtrain-bench pipeline", time_it, sys.argv[1:]))
