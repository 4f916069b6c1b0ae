"""`ringtrain-bench allreduce`: algbw and busbw of four allreduce
implementations, against a measured memory-copy bound.

Implementations (rows):
  mpi4py               raw MPI_Allreduce on numpy buffers (OpenMPI's own algorithm)
  ring                 bench.ring_reference: numpy + mpi4py scatter-reduce then allgather
  horovod-mpi          hvd.allreduce in graph mode, as training runs it: k of them chained in a
                       tf.while_loop inside one tf.function call; MPI controller
  horovod-mpi-eager    the same call made eagerly
  horovod-mpi-grads    the model's gradient tensors, one allreduce each, fused by Horovod
  horovod-gloo*        the same three under horovodrun --gloo
  grpc-ps              not an allreduce: one push of S bytes to a PS variable and one pull
                       back, over TF's gRPC (bench.grpc_exchange); the PS rows' alpha-beta fit
  memcpy               np.copyto on every rank at once: the bound (see COLUMNS.md)
"""
import json
import os
import statistics
import sys

from bench import launch, stats, tables
from bench.environment import describe, usable_cores

IMPL_ORDER = ["mpi4py", "ring", "horovod-mpi", "horovod-mpi-eager", "horovod-mpi-grads",
              "horovod-mpi-cycle0.1ms", "horovod-mpi-cycle0.1ms-eager", "horovod-mpi-cycle0.1ms-grads",
              "horovod-gloo", "horovod-gloo-eager", "horovod-gloo-grads", "grpc-ps", "memcpy"]
FIT_IMPL = "horovod-mpi"  # the ring rows' alpha-beta model: Horovod as training calls it
PS_FIT_IMPL = "grpc-ps"   # the PS rows' alpha-beta model: TF's gRPC push and pull
GRPC_MAX_BYTES = 64 << 20  # gRPC moves ~1 GB/s here: larger sizes only cost minutes
COLUMNS = [("impl", "impl"), ("size", "size"), ("count", "count"), ("type", "type"),
           ("time_us", "time (us)"), ("algbw", "algbw (GB/s)"), ("busbw", "busbw (GB/s)"),
           ("pct_bound", "busbw % memcpy"), ("pct_mpi", "busbw % MPI"), ("knobs", "knobs")]


def gradient_shapes(model_name):
    """Shapes of the model's trainable variables: the gradients one step allreduces."""
    from workloads.tfenv import import_tensorflow_quietly
    import_tensorflow_quietly()
    from workloads import models
    return models.gradient_shapes(model_name)


def busbw_factor(ranks):
    return 2 * (ranks - 1) / ranks  # nccl-tests' allreduce bus factor


def run(np_, sizes, out_dir, model="mnist_cnn", trials=5, warmup=3, gloo=True,
        horovod_env=None, timeout=900, log=print, compare_cycle_ms=None):
    """Launch the workers, gather their rows, write allreduce.{json,md,png}."""
    os.makedirs(out_dir, exist_ok=True)
    environment = describe(threads_per_worker=1)  # load average before we add to it
    shapes = gradient_shapes(model) if model else []
    grad_bytes = 4 * sum(int(__import__("numpy").prod(s)) for s in shapes)
    all_sizes = sorted(set(sizes + ([grad_bytes] if grad_bytes else [])))
    knobs = dict(horovod_env or {})
    common = ["--sizes", ",".join(map(str, all_sizes)), "--trials", str(trials),
              "--warmup", str(warmup), "--grad-shapes", json.dumps(shapes)]
    python = [sys.executable, "-m", "bench.allreduce_worker"]
    launches = [("mpi", launch.mpirun(np_, python + ["--impls", "mpi4py,ring,memcpy"] + common,
                                      usable_cores())),
                ("horovod-mpi", launch.mpirun(np_, python + ["--impls", "horovod", "--horovod-label", "mpi"]
                                              + common, usable_cores(), env_names=sorted(knobs)))]
    if compare_cycle_ms is not None:
        # Horovod's background thread wakes every cycle: at 1 ms that is a floor under
        # every allreduce; this launch shows what a shorter cycle buys.
        label = f"mpi-cycle{compare_cycle_ms:g}ms"
        launches.append((label, launch.mpirun(np_, python + ["--impls", "horovod", "--horovod-label", label]
                                              + common, usable_cores(),
                                              env_names=sorted(set(knobs) | {"HOROVOD_CYCLE_TIME"}))))
    if gloo:
        launches.append(("gloo", launch.horovodrun(np_, python + ["--impls", "horovod",
                                                                  "--horovod-label", "gloo"] + common,
                                                   gloo=True)))
    grpc_sizes = [s for s in all_sizes if s <= GRPC_MAX_BYTES]
    launches.append(("grpc", [sys.executable, "-m", "bench.grpc_exchange",
                              "--sizes", ",".join(map(str, grpc_sizes)),
                              "--trials", str(trials), "--warmup", str(warmup)]))
    rows = []
    for name, cmd in launches:
        part = os.path.join(out_dir, f"allreduce-{name}.rank0.json")
        logf = os.path.join(out_dir, f"allreduce-{name}.log")
        log(f"ringtrain-bench: allreduce over {name}: {' '.join(cmd[:6])} ... (log {logf})")
        env = dict(knobs, HOROVOD_CYCLE_TIME=f"{compare_cycle_ms:g}") if "cycle" in name else knobs
        rc = launch.run(cmd + ["--out", part], logf, timeout, env=env)
        if rc != 0 or not os.path.exists(part):
            raise RuntimeError(f"allreduce launch {name} failed (exit {rc}); last lines of {logf}:\n"
                               + launch.tail(logf))
        with open(part) as f:
            rows += json.load(f)["rows"]
    result = summarise(rows, np_, knobs, compare_cycle_ms)
    result.update({"config": {"np": np_, "sizes": all_sizes, "model": model,
                              "gradient_bytes": grad_bytes, "gradient_shapes": shapes,
                              "trials": trials, "warmup_ops_excluded": warmup, "gloo": gloo,
                              "horovod_env": knobs},
                   "environment": dict(environment, load_average_at_end=list(os.getloadavg()))})
    write(result, out_dir)
    return result


def knob_text(knobs):
    return ",".join(f"{k.replace('HOROVOD_', '').lower()}={v}" for k, v in sorted(knobs.items())) or "defaults"


def summarise(rows, ranks, knobs, compare_cycle_ms=None):
    """Median trial time per (impl, size) -> algbw, busbw, % of bounds."""
    memcpy = {r["bytes"]: r["bytes"] / statistics.median(r["trial_seconds"])
              for r in rows if r["impl"] == "memcpy"}
    out = []
    for r in rows:
        t = statistics.median(r["trial_seconds"])
        algbw = r["bytes"] / t
        # memcpy: the copy rate; grpc-ps: S bytes in and S out of the PS per step
        busbw = {"memcpy": algbw, "grpc-ps": 2 * algbw}.get(r["impl"], algbw * busbw_factor(ranks))
        out.append({**r, "seconds": t, "time_us": t * 1e6, "algbw_gbs": algbw / 1e9,
                    "busbw_gbs": busbw / 1e9, "memcpy_gbs": memcpy.get(r["bytes"], float("nan")) / 1e9,
                    "knobs": "" if not r["impl"].startswith("horovod") else
                    knob_text(dict(knobs, HOROVOD_CYCLE_TIME=f"{compare_cycle_ms:g}")
                              if "-cycle" in r["impl"] else knobs)})
    mpi = {r["bytes"]: r["busbw_gbs"] for r in out if r["impl"] == "mpi4py"}
    for r in out:
        r["pct_of_memcpy_bound"] = 100 * r["busbw_gbs"] / r["memcpy_gbs"] if r["impl"] != "memcpy" else None
        r["pct_of_mpi_busbw"] = 100 * r["busbw_gbs"] / mpi[r["bytes"]] \
            if r["bytes"] in mpi and r["impl"] not in ("memcpy", "grpc-ps") else None
    out.sort(key=lambda r: (IMPL_ORDER.index(r["impl"]) if r["impl"] in IMPL_ORDER else 99, r["bytes"]))
    fits = {}
    for impl in sorted({r["impl"] for r in out} - {"memcpy"}):
        pts = [(r["bytes"], r["seconds"]) for r in out if r["impl"] == impl and not impl.endswith("-grads")]
        fit = stats.fit_alpha_beta(pts, ranks, model="ps" if impl == PS_FIT_IMPL else "ring")
        if fit:
            fits[impl] = fit
    return {"rows": out, "alpha_beta": fits, "alpha_beta_used_for_predictions": FIT_IMPL,
            "alpha_beta_used_for_ps_predictions": PS_FIT_IMPL,
            "busbw_factor": busbw_factor(ranks)}


def markdown(result):
    rows = [{"impl": r["impl"], "size": tables.human_bytes(r["bytes"]), "count": f"{r['count']:,}",
             "type": r["dtype"], "time_us": tables.fmt(r["time_us"], 1),
             "algbw": tables.fmt(r["algbw_gbs"]), "busbw": tables.fmt(r["busbw_gbs"]),
             "pct_bound": tables.fmt(r["pct_of_memcpy_bound"], 0),
             "pct_mpi": tables.fmt(r["pct_of_mpi_busbw"], 0), "knobs": r["knobs"]}
            for r in result["rows"]]
    cfg, env = result["config"], result.get("environment", {})
    head = (f"# Allreduce bandwidth, {cfg['np']} ranks, float32 sum\n\n"
            f"Columns are defined in bench/COLUMNS.md (nccl-tests definitions: "
            f"busbw = algbw * 2(n-1)/n = algbw * {result['busbw_factor']:.3g}). "
            f"Time is the median over {cfg['trials']} trials of the slowest rank's mean time per "
            f"operation; {cfg['warmup_ops_excluded']} warm-up operations excluded. "
            f"The {tables.human_bytes(cfg['gradient_bytes'])} row is {cfg['model']}'s gradient size. "
            f"{env.get('cores')} cores ({env.get('cpu_model')}); load average (1 min) at start/end "
            f"{tables.fmt((env.get('load_average_at_start') or [None])[0])}/"
            f"{tables.fmt((env.get('load_average_at_end') or [None])[0])}.\n\n")
    fits = "\n".join(f"- alpha-beta fit, {impl}: alpha = {f['alpha_sec'] * 1e6:.1f} us, "
                     f"1/beta = {f['bandwidth_gb_per_sec'] or 0:.2f} GB/s "
                     f"(worst relative error {100 * f['max_relative_error']:.0f}%)"
                     for impl, f in result["alpha_beta"].items())
    return head + tables.markdown(COLUMNS, rows) + "\n" + fits + "\n"


def write(result, out_dir):
    with open(os.path.join(out_dir, "allreduce.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    text = markdown(result)
    with open(os.path.join(out_dir, "allreduce.md"), "w") as f:
        f.write(text)
    from bench import plots
    plots.busbw_plot(result, os.path.join(out_dir, "allreduce_busbw.png"))
    return text
