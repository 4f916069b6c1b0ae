"""`ringtrain-bench project`: the α-β model that explains the measured rows
(bench/stats.py), taken to cluster sizes this machine cannot run: N GPUs on
hosts of G GPUs each, at given link rates, for ring-allreduce and for
synchronous PS training with P = 1, N/4 and N parameter servers.

Inputs: a model's gradient bytes (its profile) and one GPU's step time; the
links' α (per message) and β (per byte) from a bench run's fit, or from a
rate and a latency given by hand. Every report lists ASSUMPTIONS."""
import math
import os

from ringtrain.bench import stats, tables
from ringtrain.common.errors import UsageError
from ringtrain.workloads.gradients import LAST_BUCKET_MB, tf_buckets

ASSUMPTIONS = (
    "Weak scaling: every GPU keeps its batch. Efficiency is one GPU's step time over the projected step time.",
    "A GPU's forward pass is a third of its step and its backward pass two thirds.",
    "A GPU's backward pass reaches the layers last to first, in equal shares of it (the profile has no "
    "per-layer times), and a layer's gradients are ready when its share ends.",
    "Ring: Horovod's default allreduce, NCCL's ring through all N GPUs, which crosses each host's link once "
    "each way: 2(N-1) latency steps, each rank sending 2(N-1)/N of the gradients, at the pace of the link "
    "between hosts. With --hierarchical (HOROVOD_HIERARCHICAL_ALLREDUCE): a ring inside each host on the "
    "intra-host link (2(G-1)/G of the gradients), then rings across the H hosts, whose links each carry "
    "2(H-1)/H of them, with 2(G-1) + 2(H-1) latency steps. Horovod overlaps the allreduces with backprop: "
    "one runs at a time, each taking every gradient ready when it starts (tensor fusion), so what backprop "
    "makes last is sent after it ends. Horovod's cycle time, fusion threshold and negotiation are not counted.",
    "TF's collective ring (MultiWorkerMirroredStrategy, ringtrain --backend tf-collective): a flat ring through "
    "all N GPUs on the same links as Horovod's (TF's own transport, slower than OpenMPI's on the bench's "
    "runs, is not counted), with the gradients, last layers first, in buckets of at least --bucket-mb, and "
    f"where they fill more than one, the first layers', up to {LAST_BUCKET_MB:g} MB, in a last bucket of their "
    "own: a bucket's all-reduce starts once backprop has made its last gradient and the bucket before it is done.",
    "PS: P tasks spread over the workers' hosts in turn. They hold the model's variables as ps-baseline "
    "places them (--placement: greedy or round_robin place whole variables, so the largest one sets a floor; "
    "partitioned gives every task an even share). Every step, "
    "every worker pushes its gradients and pulls the weights (synchronous). A host's link carries what its "
    "workers send to other hosts' PS tasks and what its PS tasks take in from other hosts' workers, both "
    "directions at full rate, and the busiest link sets the time (BytePS's max(M/B, nM/(kB)), with "
    "placement). Transfers inside a host cost nothing. Pushes hide behind the backward pass, pulls behind "
    "the forward pass.",
    "PS transfers go through TF's gRPC: with --grpc-rate, no host moves more than that per direction, "
    "whatever its link.",
)
IGNORED = ("contention in the switches (full bisection bandwidth)", "compute slowed by the exchange's own copies "
           "and kernels", "the PS tasks' CPU for applying updates", "start-up")


def assumptions(spread_pct):
    """ASSUMPTIONS, with what a step waits for its slowest GPU (--step-spread), or that it is ignored."""
    if not spread_pct:
        ignored = ("stragglers and jitter (every GPU steps in time, where a step of N GPUs waits for the "
                   "slowest: --step-spread prices it)",) + IGNORED
        return [*ASSUMPTIONS, "Ignored: " + tables.join(ignored) + "."]
    return [*ASSUMPTIONS, f"Jitter: one GPU's step varies by {spread_pct:g} % (a normal's standard deviation, "
            "independent between GPUs and steps, no GPU slower than the rest for long). Every mode here is "
            "synchronous: each step waits for the slowest of N GPUs' compute, E[the slowest of N] - the mean "
            "(sync wait), before the exchange that shows.", "Ignored: " + tables.join(IGNORED) + "."]


CSV_KEYS = ["model", "link_rate", "gpus", "hosts", "mode", "num_ps", "compute_ms", "sync_wait_ms", "exchange_ms",
            "allreduces", "exposed_ms", "hidden_pct", "step_ms", "images_per_sec", "efficiency"]
COLUMNS = [("mode_label", "mode"), ("link_rate", "link"), ("gpus", "N GPUs"), ("hosts", "hosts"),
           ("step", "step ms"), ("exchange", "exchange ms"), ("hidden", "hidden %"), ("ips", "images/s"),
           ("eff", "efficiency")]
WAIT_COLUMN = ("wait", "sync wait ms")  # (with --step-spread only, after step ms)


def ps_counts(n):
    """P = 1, N/4 and N (each once)."""
    return sorted({1, max(1, n // 4), n})


def ring_allreduce(gpus, per_host, link, intra, hierarchical):
    """seconds(nbytes) of one allreduce over N GPUs on hosts of G: NCCL's flat
    ring at the pace of its slowest hop, or inside each host then across hosts."""
    hosts, inside = math.ceil(gpus / per_host), min(per_host, gpus)
    # (a measured link's first line only: its small line is the latency of simulated hosts
    # that share 2 cores, which 2(N-1) hops would multiply into seconds at 512 GPUs)
    ring = stats.ring_allreduce_seconds
    if hierarchical:
        return lambda b: (ring(b, inside, intra["alpha_sec"], intra["beta_sec_per_byte"])
                          + ring(b, hosts, link["alpha_sec"], link["beta_sec_per_byte"]))
    slowest = link if hosts > 1 else intra
    return lambda b: ring(b, gpus, slowest["alpha_sec"], slowest["beta_sec_per_byte"])


def ps_loads(tensor_bytes, num_ps, placement):
    """Bytes each PS task holds, placed as ps-baseline places variables
    (ps_baseline/placement.py): whole variables in model order, each to the
    least-loaded task (greedy) or the next one (round_robin); partitioned,
    every task an even share."""
    if placement == "partitioned":
        return [sum(tensor_bytes) / num_ps] * num_ps
    loads = [0.0] * num_ps
    for k, nbytes in enumerate(tensor_bytes):
        loads[loads.index(min(loads)) if placement == "greedy" else k % num_ps] += nbytes
    return loads


def ps_step_seconds(compute, tensor_bytes, gpus, per_host, num_ps, placement, fit):
    hosts = math.ceil(gpus / per_host)
    workers = [i // per_host for i in range(gpus)]
    ps_hosts = [i % hosts for i in range(num_ps)]
    return stats.ps_step_seconds(compute, *stats.forward_and_backward(compute), workers, ps_hosts,
                                 ps_loads(tensor_bytes, num_ps, placement), fit["alpha_sec"],
                                 fit["beta_sec_per_byte"], sync=True)


def link_fit(rate_bits, latency_sec):
    return {"alpha_sec": latency_sec, "beta_sec_per_byte": 8.0 / rate_bits}


def project(cfg):
    """Every (link, N, mode, P) row, and the inputs and assumptions behind them."""
    nbytes, compute = sum(cfg["tensor_bytes"]), cfg["step_ms"] / 1e3
    # every mode here is synchronous: a step waits for the slowest GPU's compute (the same on every link)
    steps = stats.normal_steps(compute, cfg.get("step_spread_pct", 0) / 100)
    waits = {n: stats.sync_wait_seconds(steps, n) for n in cfg["np"]}
    rows = []
    for link in cfg["links"]:
        ps_fit = dict(link["ps"])
        if cfg.get("grpc_rate_bits"):  # gRPC's own ceiling, whatever the link
            ps_fit["beta_sec_per_byte"] = max(ps_fit["beta_sec_per_byte"], 8.0 / cfg["grpc_rate_bits"])
        for n in cfg["np"]:
            base = {"model": cfg["model"], "link_rate": link["label"], "gpus": n,
                    "hosts": math.ceil(n / cfg["gpus_per_host"]), "compute_ms": compute * 1e3,
                    "sync_wait_ms": waits[n] * 1e3}
            allreduce = ring_allreduce(n, cfg["gpus_per_host"], link["ring"], cfg["intra"], cfg["hierarchical"])
            backward = stats.forward_and_backward(compute)[1]
            ring = stats.backprop_exchange(backward, cfg["layer_bytes"], allreduce)
            rows.append(dict(row(base, "ring", None, ring["exposed"], ring["exchange"], cfg["batch_size"]),
                             allreduces=ring["allreduces"]))
            flat = ring_allreduce(n, cfg["gpus_per_host"], link["ring"], cfg["intra"], hierarchical=False)
            buckets = tf_buckets(cfg["layer_bytes"], cfg.get("bucket_mb", 0) * 2**20)
            tf = stats.exchange_in_buckets(backward, cfg["layer_bytes"], buckets, flat)
            rows.append(dict(row(base, "tf-collective", None, tf["exposed"], tf["exchange"], cfg["batch_size"]),
                             allreduces=tf["allreduces"]))
            for p in ps_counts(n):
                step = ps_step_seconds(compute, cfg["tensor_bytes"], n, cfg["gpus_per_host"], p, cfg["placement"],
                                       ps_fit)
                rows.append(row(base, "ps-sync", p, step - compute, None, cfg["batch_size"]))
    return {"rows": rows, "assumptions": assumptions(cfg.get("step_spread_pct", 0)),
            "inputs": dict({k: v for k, v in cfg.items() if k not in ("np", "tensor_bytes", "layer_bytes")},
                           gradient_bytes=nbytes, layers=len(cfg["layer_bytes"]),
                           tensors=len(cfg["tensor_bytes"]), largest_tensor_bytes=max(cfg["tensor_bytes"])),
            "np": cfg["np"]}


def row(base, mode, num_ps, exposed, exchange, batch):
    """One GPU's compute, the wait for the slowest GPU, and what of the exchange shows."""
    compute, wait = base["compute_ms"] / 1e3, base["sync_wait_ms"] / 1e3
    step = compute + wait + exposed
    r = dict(base, mode=mode, num_ps=num_ps, step_ms=step * 1e3, exposed_ms=exposed * 1e3,
             exchange_ms=exchange * 1e3 if exchange is not None else None,
             images_per_sec=batch * base["gpus"] / step, efficiency=compute / step)
    r["hidden_pct"] = 100 * (1 - exposed / exchange) if exchange else None
    return r


MAIN_COLUMNS = ["mode_label", "link_rate", "gpus", "hosts", "step", "exchange", "hidden", "ips", "eff"]


def title(result):
    inputs = result["inputs"]
    links = tables.join([link["label"] + (" links" if link["label"] != "fitted" else " links (fitted)")
                         for link in inputs["links"]])
    return (f"Projected scaling of Horovod's ring, TF's ring and sync PS: {inputs['model']} on "
            f"{min(result['np'])}–{max(result['np'])} GPUs, {inputs['gpus_per_host']} per host, {links}")


METHOD = "How it is projected"


def method(result):
    inputs = result["inputs"]
    text = (f"The α-β model (bench/stats.py), not a measurement. Gradients {inputs['gradient_bytes'] / 1e6:,.1f} "
            f"MB per step in {inputs['tensors']} tensors of {inputs['layers']} layers (the largest "
            f"{inputs['largest_tensor_bytes'] / 1e6:,.1f} MB), ring allreduce "
            f"{'hierarchical' if inputs['hierarchical'] else 'flat'}, TF's in buckets of "
            f"{inputs.get('bucket_mb', 0):g} MB, PS placement {inputs['placement']}, one GPU's "
            f"step {inputs['step_ms']:,.1f} ms ({inputs['step_source']})"
            + (f" with a spread of {inputs['step_spread_pct']:g} %" if inputs.get("step_spread_pct") else "")
            + f", batch "
            f"{inputs['batch_size']} per GPU. Columns: bench/COLUMNS.md, section Projection.\n\n")
    for link in inputs["links"]:
        text += (f"- link {link['label']} ({link['source']}): ring α = {link['ring']['alpha_sec'] * 1e6:,.1f} us, "
                 f"1/β = {1e-6 / link['ring']['beta_sec_per_byte']:,.1f} MB/s; PS α = "
                 f"{link['ps']['alpha_sec'] * 1e6:,.1f} us, 1/β = {1e-6 / link['ps']['beta_sec_per_byte']:,.1f} MB/s\n")
    text += (f"- inside a host: 1/β = {1e-6 / inputs['intra']['beta_sec_per_byte']:,.1f} MB/s"
             + (f"; TF's gRPC at most {inputs['grpc_rate_bits'] / 8e6:,.1f} MB/s per host and direction"
                if inputs.get("grpc_rate_bits") else "") + "\n")
    return text


def table_rows(result):
    return [dict(r, mode_label=r["mode"] + (f" P={r['num_ps']}" if r["num_ps"] else ""),
                 step=tables.fmt(r["step_ms"], 1), wait=tables.fmt(r.get("sync_wait_ms"), 1),
                 exchange=tables.fmt(r["exchange_ms"], 1),
                 hidden=tables.fmt(r["hidden_pct"], 0), ips=tables.fmt(r["images_per_sec"], 0),
                 eff=f"{100 * r['efficiency']:.0f}%") for r in result["rows"]]


def notes(result):
    return "\nWhat the projection assumes:\n\n" + "".join(f"- {a}\n" for a in result["assumptions"])


def columns_of(result):
    """(COLUMNS, MAIN_COLUMNS), with the wait for the slowest GPU where --step-spread priced it."""
    if not result["inputs"].get("step_spread_pct"):
        return COLUMNS, MAIN_COLUMNS
    return COLUMNS[:5] + [WAIT_COLUMN] + COLUMNS[5:], MAIN_COLUMNS[:5] + ["wait"] + MAIN_COLUMNS[5:]


def markdown(result):
    return tables.report(title(result), finding_sentences(result), columns_of(result)[0], table_rows(result),
                         notes(result), method(result), METHOD)


def finding_sentences(result):
    """At the largest N of each link: ring's projected efficiency, and sync PS's best and worst P."""
    top = max(result["np"])
    out = []
    for link in dict.fromkeys(r["link_rate"] for r in result["rows"]):
        at = [r for r in result["rows"] if r["link_rate"] == link and r["gpus"] == top]
        ring = next((r for r in at if r["mode"] == "ring"), None)
        tf = next((r for r in at if r["mode"] == "tf-collective"), None)
        # best last; of equals, the fewest PS tasks
        ps = sorted((r for r in at if r["mode"] == "ps-sync"), key=lambda r: (r["efficiency"], -r["num_ps"]))
        text = f"At {top} GPUs on {link} links, the α-β model projects "
        parts = [f"{tables.share(ring['efficiency'])} efficiency for Horovod's ring"] if ring else []
        if tf:
            parts.append(f"{tables.share(tf['efficiency'])} for TF's ring in {result['inputs'].get('bucket_mb', 0):g} "
                         f"MB buckets" + (f" (Horovod's {ring['images_per_sec'] / tf['images_per_sec']:.2f}x TF's)"
                                          if ring else ""))
        if ps:
            parts.append(f"{tables.share(ps[-1]['efficiency'])} for sync PS at best (P = {ps[-1]['num_ps']})"
                         + (f", {tables.share(ps[0]['efficiency'])} with P = {ps[0]['num_ps']}" if len(ps) > 1 else ""))
        if parts:
            out.append(text + "; ".join(parts) + ".")
    spread = result["inputs"].get("step_spread_pct")
    if spread:
        wait = next(r["sync_wait_ms"] for r in result["rows"] if r["gpus"] == top)
        out.append(f"With a GPU's step varying by {spread:g} %, each step of {top} GPUs waits {wait:,.1f} ms for "
                   f"the slowest one's compute ({100 * wait / result['inputs']['step_ms']:.1f} % of a step).")
    return out


def write(result, out_dir):
    text = tables.write_report(out_dir, "project", markdown(result), CSV_KEYS, result)
    from ringtrain.bench import plots
    plots.write_index(out_dir, "project", [plots.projection_plot(result, line_label,
                                                                 os.path.join(out_dir, "project_efficiency.png"))])
    return text


def line_label(r):
    """ring, or ps-sync with P named against N (P = 1, N/4, N)."""
    if not r["num_ps"]:
        return r["mode"]
    return r["mode"] + {1: " P=1", r["gpus"]: " P=N"}.get(r["num_ps"], " P=N/4")


def fits_from(path, ranks=None):
    """(ring fit, PS fit) of a bench run's scaling.json or allreduce.json: the
    ring's over every rank count it measured, or the one at `ranks`."""
    result = tables.read_result(path, "--alpha-beta", "a scaling.json or allreduce.json that ringtrain-bench wrote")
    if "alpha_beta_ps" in result:  # scaling.json: fitted across its hosts (one fit, or one per rank count)
        from ringtrain.bench.scaling_rows import fit_at
        ring, ps = result.get("alpha_beta"), result.get("alpha_beta_ps")
        if ranks and ring and "alpha_sec" not in ring and str(ranks) not in ring:
            raise UsageError(f"--fit-at {ranks}: {path} has ring fits at {', '.join(k for k in ring if k != 'all')} "
                             "ranks only")
        ring = fit_at(ring, str(ranks) if ranks else "all") if ring else None
    else:
        from ringtrain.bench.scaling import load_alpha_beta
        fits = load_alpha_beta(path)
        ring, ps = fits.get("ring"), fits.get("ps")
    if not ring or not ps:
        raise UsageError(f"--alpha-beta {path} holds no ring and PS fit: give the scaling.json of a run across "
                         "hosts (--hostfile or --cluster), or --link-rate and --latency-us")
    return ring, ps
