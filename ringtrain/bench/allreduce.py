"""`ringtrain-bench allreduce`: algbw and busbw of four allreduce
implementations, against a measured memory-copy bound.

Implementations (rows):
  mpi4py               raw MPI_Allreduce on numpy buffers (OpenMPI's own algorithm)
  ring                 bench.ring_reference: numpy + mpi4py scatter-reduce then allgather
  horovod-mpi          hvd.allreduce in graph mode, as training runs it: k of them chained in a
                       tf.while_loop inside one tf.function call; MPI controller
  horovod-mpi-eager    the same call made eagerly
  horovod-mpi-grads    the model's gradient tensors, one allreduce each, fused by Horovod
  horovod-mpi-upstream* the same three with Horovod's upstream background loop (a coordination
                       round every cycle), against ringtrain's event-driven one (patch 0004)
  horovod-gloo*        the same three under horovodrun --gloo
  tf-ring              TF's own collective all-reduce (MultiWorkerMirroredStrategy, RING), as
                       `ringtrain --backend tf-collective` trains: k of them chained in one call
  tf-ring-grads        the model's gradient tensors in one all-reduce, packed as TF packs a step's
  grpc-ps              not an allreduce: one push of S bytes to a PS variable and one pull
                       back, over TF's gRPC (bench.grpc_exchange); the PS rows' alpha-beta fit
  memcpy               np.copyto on every rank at once: the bound (see COLUMNS.md)
"""
import json
import math
import os
import statistics
import sys

import numpy as np

from ringtrain.bench import launch, sites, stats, tables
from ringtrain.bench.environment import describe, usable_cores
from ringtrain.workloads.horovod_env import knob_env, ringtrains_mpi_env
from ringtrain.workloads.summary import dumps

UPSTREAM_LOOP = knob_env(loop="upstream")

IMPL_ORDER = ["mpi4py", "mpi-ring", "mpi-segmented_ring", "mpi-rabenseifner", "mpi-recursive_doubling",
              "mpi-default", "ring", "horovod-mpi", "horovod-mpi-eager", "horovod-mpi-grads",
              "horovod-mpi-upstream", "horovod-mpi-upstream-eager", "horovod-mpi-upstream-grads",
              "horovod-mpi-cycle0.1ms", "horovod-mpi-cycle0.1ms-eager", "horovod-mpi-cycle0.1ms-grads",
              "horovod-gloo", "horovod-gloo-eager", "horovod-gloo-grads", "tf-ring", "tf-ring-grads", "grpc-ps",
              "memcpy"]
FIT_IMPL = "horovod-mpi"  # the ring rows' alpha-beta model: Horovod as training calls it
GLOO_FIT_IMPL = "horovod-gloo"  # the ring rows whose gradients Gloo carried: Horovod over Gloo, as training calls it
TF_FIT_IMPL = "tf-ring"   # the TF collective rows': TF's own ring, as training calls it
PS_FIT_IMPL = "grpc-ps"   # the PS rows' alpha-beta model: TF's gRPC push and pull
GRPC_MAX_BYTES = 128 << 20  # gRPC moves ~1 GB/s here: larger sizes only cost minutes
COLUMNS = [("impl", "impl"), ("ranks", "ranks"), ("size", "size"), ("count", "count"), ("type", "type"),
           ("time_us", "time (us)"), ("algbw", "algbw (GB/s)"), ("busbw", "busbw (GB/s)"),
           ("pct_bound", "busbw % memcpy"), ("pct_mpi", "busbw % MPI"), ("wire", "wire B/op/rank"),
           ("wire_pct", "wire % of ring"), ("wrong", "wrong"), ("knobs", "knobs")]


def gradient_shapes(model_name):
    """Shapes of the model's trainable variables: the gradients one step allreduces."""
    return [list(shape) for _, variables in gradient_layers(model_name) for _, shape in variables]


def gradient_layers(model_name):
    """[(layer, [(variable, shape)...])] of the model's trainable variables, in forward order."""
    from ringtrain.workloads.tfenv import import_tensorflow_quietly
    import_tensorflow_quietly()
    from ringtrain.workloads import models
    return models.gradient_layers(model_name)


def gradient_layer_bytes(model_name):
    """[[bytes of each float32 gradient tensor] of each layer], in forward order."""
    return [[4 * math.prod(shape) for _, shape in variables] for _, variables in gradient_layers(model_name)]


def busbw_factor(ranks):
    return 2 * (ranks - 1) / ranks  # nccl-tests' allreduce bus factor


def run(np_list, sizes, out_dir, model="mnist_cnn", trials=5, warmup=3, gloo=True, horovod_env=None,
        timeout=900, log=print, compare_cycle_ms=None, site=None, mpi_algorithms=(), horovod=True,
        compare_upstream_loop=False, tf=True):
    """Launch the workers for each rank count, gather their rows, write allreduce.{json,md,png}."""
    site = site or sites.this_machine()
    os.makedirs(out_dir, exist_ok=True)
    environment = describe(threads_per_worker=1, hostfile=site.label)  # load average before we add to it
    shapes = gradient_shapes(model) if model else []
    grad_bytes = 4 * sum(int(np.prod(s)) for s in shapes)
    all_sizes = sorted(set(sizes + ([grad_bytes] if grad_bytes else [])))
    knobs = dict(horovod_env or {})
    common = ["--sizes", ",".join(map(str, all_sizes)), "--trials", str(trials),
              "--warmup", str(warmup), "--grad-shapes", json.dumps(shapes)]
    rows = []
    for name, cmd, env in launches(np_list, common, knobs, compare_cycle_ms, gloo, horovod, site, mpi_algorithms,
                                   [s for s in all_sizes if s <= GRPC_MAX_BYTES], trials, warmup,
                                   compare_upstream_loop, tf):
        part = os.path.join(out_dir, f"allreduce-{name}.rank0.json")
        logf = os.path.join(out_dir, f"allreduce-{name}.log")
        log(f"ringtrain-bench: allreduce over {name}: {' '.join(cmd[:6])} ... (log {logf})")
        rc = launch.run(site.enter(cmd + ["--out", part]), logf, timeout, env=env)
        if rc != 0 or not os.path.exists(part):
            raise RuntimeError(f"allreduce launch {name} failed (exit {rc}); last lines of {logf}:\n"
                               + launch.tail(logf))
        with open(part) as f:
            rows += json.load(f)["rows"]
    result = summarise(rows, knobs, compare_cycle_ms, across_hosts=site.across_hosts)
    result.update({"config": {"np": list(np_list), "sizes": all_sizes, "model": model,
                              "gradient_bytes": grad_bytes, "gradient_shapes": shapes,
                              "trials": trials, "warmup_ops_excluded": warmup, "gloo": gloo,
                              "horovod_env": knobs, "tf": tf, "site": site.label, "link_rate": site.link_rate,
                              "time_dilation": site.dilation, "mpi_algorithms": list(mpi_algorithms)},
                   "environment": dict(environment, load_average_at_end=list(os.getloadavg()))})
    write(result, out_dir)
    refuse_wrong(result, out_dir)
    return result


def refuse_wrong(result, out_dir):
    """One line, and a non-zero exit, for any row whose results were not what they must be."""
    wrong = [r for r in result["rows"] if r.get("wrong")]
    if wrong:
        raise RuntimeError(f"{sum(r['wrong'] for r in wrong):,} wrong result elements, in "
                           + ", ".join(f"{r['impl']} at {r['bytes']:,} B on {r['world_size']} ranks" for r in wrong)
                           + f": an allreduce returned wrong sums (the rows are in {out_dir}/allreduce.md)")


def launches(np_list, common, knobs, compare_cycle_ms, gloo, horovod, site, mpi_algorithms, grpc_sizes,
             trials, warmup, compare_upstream_loop=False, tf=True):
    """(name, command, extra env) of each launch. Raw MPI, Horovod and TF rows are
    separate launches: Horovod's background thread would slow MPI calls beside it."""
    python = [sys.executable, "-m", "ringtrain.bench.allreduce_worker"]
    cores = usable_cores()
    out = []
    for n in np_list:
        hosts = site.host_list(n) if site.across_hosts else None
        tag = f"-n{n}" if len(np_list) > 1 else ""
        if not mpi_algorithms:
            out.append((f"mpi{tag}", launch.mpirun(n, python + ["--impls", "mpi4py,ring,memcpy"] + common, cores,
                                                   hosts=hosts), {}))
        for algorithm in mpi_algorithms:
            # one launch per algorithm: OpenMPI reads its choice once, in MPI_Init
            env = ringtrains_mpi_env(algorithm)
            out.append((f"mpi-{algorithm}{tag}", launch.mpirun(
                n, python + ["--impls", "mpi4py", "--mpi-label", f"mpi-{algorithm}"] + common, cores,
                env_names=sorted(env), hosts=hosts), env))
        if horovod:
            # Horovod as ring mode trains: OpenMPI yielding when idle, its ring allreduce
            env = dict(knobs, **ringtrains_mpi_env("ring"))
            out.append((f"horovod-mpi{tag}", launch.mpirun(
                n, python + ["--impls", "horovod", "--horovod-label", "mpi"] + common, cores,
                env_names=sorted(env), hosts=hosts), env))
            if compare_upstream_loop:
                upstream_env = dict(env, **UPSTREAM_LOOP)
                out.append((f"horovod-mpi-upstream{tag}", launch.mpirun(
                    n, python + ["--impls", "horovod", "--horovod-label", "mpi-upstream"] + common, cores,
                    env_names=sorted(upstream_env), hosts=hosts), upstream_env))
            if compare_cycle_ms is not None:
                # Horovod's background thread wakes every cycle: at 1 ms that is a floor under
                # every allreduce; this launch shows what a shorter cycle buys.
                label = f"mpi-cycle{compare_cycle_ms:g}ms"
                cycle_env = dict(env, HOROVOD_CYCLE_TIME=f"{compare_cycle_ms:g}")
                out.append((f"horovod-{label}{tag}", launch.mpirun(
                    n, python + ["--impls", "horovod", "--horovod-label", label] + common, cores,
                    env_names=sorted(cycle_env), hosts=hosts), cycle_env))
        if gloo:
            out.append((f"gloo{tag}", launch.horovodrun(
                n, python + ["--impls", "horovod", "--horovod-label", "gloo"] + common, gloo=True,
                hosts=hosts), knobs))
        if tf:  # mpirun only starts the workers; TF's gRPC carries the all-reduce
            out.append((f"tf{tag}", launch.mpirun(n, python + ["--impls", "tf-collective"] + common, cores,
                                                  hosts=hosts), {}))
    ps_host = site.hosts_for(2)[1] if site.across_hosts and len(site.hosts_for(2)) > 1 else "localhost"
    out.append(("grpc", [sys.executable, "-m", "ringtrain.bench.grpc_exchange", "--sizes", ",".join(map(str, grpc_sizes)),
                         "--trials", str(trials), "--warmup", str(warmup), "--ps-host", ps_host], {}))
    return out


def knob_text(knobs):
    return ",".join(f"{k.replace('HOROVOD_', '').lower()}={v}" for k, v in sorted(knobs.items())) or "defaults"


def impl_knobs(impl, knobs, compare_cycle_ms):
    """The Horovod knobs a row's launch ran with."""
    if "-cycle" in impl:
        return dict(knobs, HOROVOD_CYCLE_TIME=f"{compare_cycle_ms:g}")
    if "-upstream" in impl:
        return dict(knobs, **UPSTREAM_LOOP)
    return knobs


def summarise(rows, knobs, compare_cycle_ms=None, across_hosts=False):
    """Median trial time per (impl, size, ranks) -> algbw, busbw, % of bounds, wire bytes."""
    memcpy = {(r["bytes"], r["world_size"]): r["bytes"] / statistics.median(r["trial_seconds"])
              for r in rows if r["impl"] == "memcpy"}
    out = []
    for r in rows:
        t, n = statistics.median(r["trial_seconds"]), r["world_size"]
        algbw = r["bytes"] / t
        # memcpy: the copy rate; grpc-ps: S bytes in and S out of the PS per step
        busbw = {"memcpy": algbw, "grpc-ps": 2 * algbw}.get(r["impl"], algbw * busbw_factor(n))
        theory = 2 * r["bytes"] if r["impl"] == "grpc-ps" else None if r["impl"] == "memcpy" else \
            busbw_factor(n) * r["bytes"]  # ring-optimal: each rank sends 2(n-1)/n of the buffer
        wire = r.get("wire_bytes_per_op_per_rank") if across_hosts else None  # one host: nothing on a wire
        out.append({**r, "wire_bytes_per_op_per_rank": wire, "seconds": t, "time_us": t * 1e6, "algbw_gbs": algbw / 1e9,
                    "busbw_gbs": busbw / 1e9, "memcpy_gbs": memcpy.get((r["bytes"], n), float("nan")) / 1e9,
                    "wire_bytes_theory": theory,
                    "wire_pct_of_theory": 100 * wire / theory if wire and theory else None,
                    "knobs": knob_text(impl_knobs(r["impl"], knobs, compare_cycle_ms))
                    if r["impl"].startswith("horovod") else ""})
    mpi = {(r["bytes"], r["world_size"]): r["busbw_gbs"] for r in out if r["impl"] in ("mpi4py", "mpi-default")}
    for r in out:
        key = (r["bytes"], r["world_size"])
        r["pct_of_memcpy_bound"] = 100 * r["busbw_gbs"] / r["memcpy_gbs"] if r["impl"] != "memcpy" else None
        r["pct_of_mpi_busbw"] = 100 * r["busbw_gbs"] / mpi[key] \
            if key in mpi and r["impl"] not in ("memcpy", "grpc-ps") else None
    order = lambda r: (r["world_size"], IMPL_ORDER.index(r["impl"]) if r["impl"] in IMPL_ORDER else 50, r["impl"],
                       r["bytes"])
    out.sort(key=order)
    fits = {}
    for impl in sorted({r["impl"] for r in out} - {"memcpy"}):
        pts = [(r["bytes"], r["world_size"], r["seconds"]) for r in out if r["impl"] == impl
               and not impl.endswith("-grads")]
        model = "ps" if impl == PS_FIT_IMPL else "ring"
        # over every rank count at once, and (as "impl@n") at each: across hosts an
        # algorithm's effective bandwidth depends on n (2 ranks exchange both ways at once)
        for key, points in [(impl, pts)] + [(f"{impl}@{n}", [p for p in pts if p[1] == n])
                                            for n in sorted({p[1] for p in pts})] * (model == "ring"):
            fit = stats.fit_lines(points, model=model)
            if fit and (key == impl or len({p[1] for p in pts}) > 1):
                fits[key] = fit
    return {"rows": out, "alpha_beta": fits, "alpha_beta_used_for_predictions": FIT_IMPL,
            "alpha_beta_used_for_tf_predictions": TF_FIT_IMPL, "alpha_beta_used_for_ps_predictions": PS_FIT_IMPL}


MAIN_COLUMNS = ["impl", "ranks", "size", "time_us", "algbw", "busbw", "pct_bound", "pct_mpi", "wire", "wire_pct",
                "wrong", "knobs"]


def table_rows(result):
    return [{"impl": r["impl"], "ranks": str(r["world_size"]), "size": tables.human_bytes(r["bytes"]),
             "count": f"{r['count']:,}", "type": r["dtype"], "time_us": tables.fmt(r["time_us"], 1),
             "algbw": tables.fmt(r["algbw_gbs"]), "busbw": tables.fmt(r["busbw_gbs"]),
             "pct_bound": tables.fmt(r["pct_of_memcpy_bound"], 0),
             "pct_mpi": tables.fmt(r["pct_of_mpi_busbw"], 0),
             "wire": tables.fmt(r["wire_bytes_per_op_per_rank"], 0),
             "wire_pct": tables.fmt(r["wire_pct_of_theory"], 1), "wrong": str(r.get("wrong", 0)),
             "knobs": r["knobs"]}
            for r in result["rows"]]


def title(result):
    """What ran, in a line: the implementations, the ranks, the model's gradients and where."""
    cfg = result["config"]
    families = [name for name, prefixes in IMPL_FAMILIES if any(r["impl"].startswith(prefixes) for r in result["rows"])]
    return (f"Allreduce bandwidth of {tables.join(families)}: {tables.join(map(str, cfg['np']))} ranks, "
            f"{cfg['model']}'s gradients, on {cfg.get('site') or 'this machine'}")


IMPL_FAMILIES = [("MPI", ("mpi4py", "mpi-")), ("a numpy ring", ("ring",)), ("Horovod over MPI", ("horovod-mpi",)),
                 ("Horovod over Gloo", ("horovod-gloo",)), ("TF's ring", ("tf-ring",)),
                 ("gRPC push and pull", ("grpc-ps",))]


def method(result):
    cfg, env = result["config"], result.get("environment", {})
    dilation = cfg.get("time_dilation") or 1
    return (f"Columns are defined in bench/COLUMNS.md (nccl-tests definitions: "
            f"busbw = algbw * 2(n-1)/n). "
            f"Time is the median over {cfg['trials']} trials of the slowest rank's mean time per "
            f"operation; {cfg['warmup_ops_excluded']} warm-up operations excluded. "
            f"The {tables.human_bytes(cfg['gradient_bytes'])} row is {cfg['model']}'s gradient size. "
            + (f"Times are as measured on links shaped {dilation:g}x slower than {cfg['link_rate']} (not divided). "
               if dilation != 1 else "")
            + f"{env.get('cores')} cores ({env.get('cpu_model')}); load average (1 min) at start/end "
            f"{tables.fmt((env.get('load_average_at_start') or [None])[0])}/"
            f"{tables.fmt((env.get('load_average_at_end') or [None])[0])}.\n")


def notes(result):
    """The α-β fits, and Horovod's and TF's busbw at the gradient size."""
    fits = "\n".join(f"- alpha-beta fit, {impl}: alpha = {f['alpha_sec'] * 1e6:.1f} us, "
                     f"1/beta = {f['bandwidth_gb_per_sec'] or 0:.3f} GB/s "
                     f"(worst relative error {100 * f['max_relative_error']:.0f}%){stats.small_line_words(f)}"
                     for impl, f in result["alpha_beta"].items())
    return "\n" + fits + "\n" + at_gradient_size(result)


def markdown(result):
    return tables.report(title(result), finding_sentences(result), COLUMNS, table_rows(result), notes(result),
                         method(result))


def finding_sentences(result):
    """The peak busbw, each implementation's, the fits the scaling bench uses, and the gradient size's."""
    rows = [r for r in result["rows"] if r["impl"] != "memcpy"]
    if not rows:
        return []
    top = max(rows, key=lambda r: r["busbw_gbs"])
    bound = f" ({top['pct_of_memcpy_bound']:.0f} % of the memory-copy bound there)" \
        if top["pct_of_memcpy_bound"] == top["pct_of_memcpy_bound"] and top["pct_of_memcpy_bound"] else ""
    out = [f"The highest bus bandwidth was {top['impl']}'s, {top['busbw_gbs']:.2f} GB/s at "
           f"{tables.human_bytes(top['bytes'])} on {top['world_size']} ranks{bound}."]
    peaks = {}
    for r in rows:  # (the same call made eagerly, or with another background loop or cycle: in the table)
        if not any(variant in r["impl"] for variant in ("-eager", "-upstream", "-cycle")):
            peaks[r["impl"]] = max(peaks.get(r["impl"], 0), r["busbw_gbs"])
    if len(peaks) > 1:
        out.append("Peak busbw by implementation: "
                   + ", ".join(f"{impl} {gbs:.2f}" for impl, gbs in peaks.items()) + " GB/s.")
    used = [result.get(k) for k in ("alpha_beta_used_for_predictions", "alpha_beta_used_for_tf_predictions",
                                    "alpha_beta_used_for_ps_predictions")] + ["mpi-ring"]
    fits = [(impl, result["alpha_beta"][impl]) for impl in dict.fromkeys(used) if impl in result["alpha_beta"]]
    if fits:
        out.append("α-β fits: " + "; ".join(f"{impl} α = {f['alpha_sec'] * 1e6:,.1f} us, 1/β = "
                                           f"{f['bandwidth_gb_per_sec'] or 0:.2f} GB/s{stats.small_line_words(f)}"
                                           for impl, f in fits) + ".")
    out += gradient_size_sentence(result)
    out.append(f"Every result of the {len(result['rows'])} rows was checked element by element: "
               f"{sum(r.get('wrong', 0) for r in result['rows'])} wrong.")
    return out


def gradient_size_sentence(result):
    size = result["config"].get("gradient_bytes")
    at = [r for r in result["rows"] if r["bytes"] == size and r["impl"].endswith("-grads")
          and r["pct_of_mpi_busbw"] is not None]
    if not at:
        return []
    return [f"At {result['config']['model']}'s gradient size ({tables.human_bytes(size)}), "
            + tables.join(f"{r['impl']} reached {r['pct_of_mpi_busbw']:.0f} %" if i == 0 else
                          f"{r['impl']} {r['pct_of_mpi_busbw']:.0f} %" for i, r in enumerate(at))
            + " of raw MPI_Allreduce's busbw."]


def at_gradient_size(result):
    """Horovod's and TF's busbw as % of raw MPI's at the model's gradient size."""
    size = result["config"].get("gradient_bytes")
    lines = [f"- {r['impl']}, {r['world_size']} ranks: {r['pct_of_mpi_busbw']:.0f} % of raw MPI_Allreduce busbw"
             for r in result["rows"] if r["bytes"] == size and r["impl"].startswith(("horovod-mpi", "tf-ring"))
             and not r["impl"].endswith("-eager") and r["pct_of_mpi_busbw"] is not None]
    if not lines:
        return ""
    return (f"\nAt the gradient size ({tables.human_bytes(size)}; -grads: the model's tensors, "
            "fused by Horovod or packed by TF, as in training):\n\n" + "\n".join(lines) + "\n")


def write(result, out_dir):
    with open(os.path.join(out_dir, "allreduce.json"), "w") as f:
        f.write(dumps(result, indent=1, sort_keys=True))
    text = markdown(result)
    with open(os.path.join(out_dir, "allreduce.md"), "w") as f:
        f.write(text)
    from ringtrain.bench import plots
    plots.write_index(out_dir, "allreduce", [plots.busbw_plot(result, os.path.join(out_dir, "allreduce_busbw.png"))])
    return text
