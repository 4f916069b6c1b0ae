"""The scaling bench's outputs: the table (Markdown, CSV, JSON) and plots of
one site, and, over several link rates, one report with what the rows
show, side by side. Columns: bench/COLUMNS.md."""
import json
import os

from ringtrain.bench import plots, stats, tables
from ringtrain.bench.scaling_findings import find_row as _row, link_text, row_name, sentences as finding_sentences
from ringtrain.workloads.numbers import percent
from ringtrain.workloads.summary import dumps

COLUMNS = [
    ("mode", "mode"), ("algorithm", "algorithm"), ("n", "N (PS)"), ("hosts", "hosts"), ("link", "link"),
    ("procs", "cores/procs/thr"), ("per_worker", "per-worker img/s (95% CI)"), ("total", "total img/s"),
    ("speedup", "speedup"), ("efficiency", "efficiency"), ("ceiling", "% of independent"),
    ("step_ms", "step ms"), ("compute_ms", "compute ms"), ("wait_ms", "sync wait ms"), ("comm_ms", "exposed comm ms"),
    ("predicted_ms", "α-β step ms"), ("prediction_error", "α-β error"),
    ("kernel_ms", "exchange kernel CPU ms"), ("with_kernel_error", "α-β + kernel error"),
    ("wire", "wire MB/step"), ("wire_pct", "wire % of theory"),
    ("cpu_horovod", "Horovod thread % core"), ("cpu_other", "other threads % core"), ("scaling", "scaling"),
]
# The page's table: the most telling columns first; the others are one click away, in the full table
MAIN_COLUMNS = ["mode", "n", "link", "total", "efficiency", "speedup", "step_ms", "predicted_ms", "prediction_error",
                "comm_ms", "ceiling", "wire_pct", "cpu_horovod"]
CSV_KEYS = ["mode", "algorithm", "workers", "num_ps", "hosts", "link_rate", "time_dilation", "processes", "cores",
            "threads_per_worker", "oversubscribed", "per_worker_images_per_sec_mean",
            "per_worker_images_per_sec_ci95", "rounds", "total_images_per_sec", "speedup", "efficiency",
            "efficiency_min", "efficiency_max", "predicted_efficiency", "fraction_of_independent", "step_time_ms",
            "compute_time_ms", "sync_wait_ms", "exposed_comm_ms", "predicted_comm_ms", "predicted_step_time_ms",
            "prediction_error_pct", "exchange_kernel_cpu_ms", "kernel_on_compute_ms", "predicted_with_kernel_ms",
            "error_with_kernel_pct", "wire_bytes_per_step", "wire_bytes_theory", "wire_bytes_pct_of_theory",
            "scaling", "global_batch", "per_worker_batch", "timed_windows", "steps", "train_loss", "test_accuracy",
            "staleness_mean", "staleness_max", "cpu_horovod_thread_pct", "cpu_other_threads_pct",
            "cpu_host_kernel_pct",
            "summary_json", "log"]


def table_rows(result):
    rows = []
    for r in result["rows"]:
        ci = r["per_worker_images_per_sec_ci95"]
        rows.append({
            "mode": r["mode"], "algorithm": r["algorithm"],
            "n": f"{r['workers']} ({r['num_ps']})" if r["num_ps"] else str(r["workers"]),
            "hosts": str(r["hosts"]), "link": link_text(r),
            "procs": f"{r['cores']}/{r['processes']}/{r['threads_per_worker']}"
                     + (" over" if r["oversubscribed"] else ""),
            "per_worker": f"{tables.fmt(r['per_worker_images_per_sec_mean'], 0)} ± {tables.fmt(ci, 0)}",
            "total": tables.fmt(r["total_images_per_sec"], 0), "speedup": tables.fmt(r["speedup"]),
            "efficiency": efficiency_text(r),
            "ceiling": "n/a" if r["fraction_of_independent"] is None else f"{100 * r['fraction_of_independent']:.0f}%",
            "step_ms": tables.fmt(r["step_time_ms"]), "compute_ms": tables.fmt(r["compute_time_ms"]),
            "wait_ms": tables.fmt(r.get("sync_wait_ms")),
            "comm_ms": tables.fmt(r["exposed_comm_ms"]), "predicted_ms": tables.fmt(r["predicted_step_time_ms"]),
            "prediction_error": percent(r["prediction_error_pct"], signed=True),
            "kernel_ms": tables.fmt(r.get("exchange_kernel_cpu_ms"), 1),
            "with_kernel_error": percent(r.get("error_with_kernel_pct"), signed=True),
            "wire": tables.fmt(None if r["wire_bytes_per_step"] is None else r["wire_bytes_per_step"] / 1e6, 1),
            "wire_pct": percent(r["wire_bytes_pct_of_theory"], digits=1),
            "cpu_horovod": percent(r.get("cpu_horovod_thread_pct"), digits=1),
            "cpu_other": percent(r.get("cpu_other_threads_pct")),
            "scaling": f"{r['scaling']} (B={r['per_worker_batch']}/worker)",
        })
    return rows


def efficiency_text(r):
    if r["efficiency"] is None:
        return "n/a"
    text = f"{100 * r['efficiency']:.0f}%"
    if r["rounds"] > 1 and r["workers"] > 1:
        text += f" ({100 * r['efficiency_min']:.0f}–{100 * r['efficiency_max']:.0f})"
    return text


def title(results, lead="Scaling of"):
    """What ran, in a line: the modes, the models and where."""
    cfgs = [result["config"] for result in results]
    modes = list(dict.fromkeys(m for cfg in cfgs for m in cfg["modes"]))
    models = list(dict.fromkeys(cfg["model"] for cfg in cfgs))
    return f"{lead} {tables.join(modes)}: {tables.join(models)} on {site_text(results)}"


def site_text(results):
    """`this machine`; `2 simulated hosts, 1gbit and 10gbit (÷10) links`."""
    site = results[0].get("site") or {}
    if not site.get("link_rate"):
        return site.get("label", "this machine")
    links = tables.join(list(dict.fromkeys(link_text({"link_rate": (r.get("site") or {}).get("link_rate"),
                                               "time_dilation": (r.get("site") or {}).get("dilation")})
                                    for r in results)))
    hosts = site.get("hosts") or "?"
    return f"{hosts} {'simulated ' if site.get('hosts_share_cores') else ''}hosts, {links} links"


def method(result):
    """How the rows were measured, and on what machine."""
    cfg, env, site = result["config"], result["environment"], result.get("site") or {}
    load = env.get("load_average_at_start"), env.get("load_average_at_end")
    rounds = max((r["rounds"] for r in result["rows"]), default=1)
    dilation = site.get("dilation") or 1
    text = (f"{cfg['model']} on {cfg['data']} data, {cfg['steps']} steps per run, on {site.get('label', 'this machine')}. "
            f"Columns are defined in bench/COLUMNS.md. Totals are measured (all workers' timed images / "
            f"slowest worker's timed seconds), never rank 0 x N; warm-up steps excluded. "
            f"Every configuration ran {rounds} time(s), in rounds; total img/s is the median run, and "
            f"speedup and efficiency are the median over rounds of that round's T_N / T_1"
            + (" (efficiency min–max over rounds in brackets)" if rounds > 1 else "") + ". ")
    if site.get("simulated_gpu_ms"):
        text += (f"Workers run a simulated accelerator: {site['simulated_gpu_ms']:.1f} ms of forward and "
                 "backward per step that use no CPU, gradients of the real size, really exchanged. ")
    if dilation != 1:
        text += (f"Time dilation {dilation:g}: the links ran {dilation:g}x slower than the rate shown and "
                 f"each accelerator step {dilation:g}x longer; every time here is divided by {dilation:g} "
                 f"and every rate multiplied by it. ")
    if site.get("across_hosts"):
        independent = any(r["mode"] == "independent" for r in result["rows"])
        text += (("Compute ms is `independent` at the same N: N single-rank trainers at once, exchanging nothing "
                  "(the simulated hosts share this machine's cores, so the N = 1 step is no bound at larger N)"
                  if site.get("hosts_share_cores") and independent else
                  "Compute ms is the same mode's step at N = 1, where nothing crosses a wire")
                 + "; wire bytes are what the hosts' interfaces sent per step. ")
    else:
        text += ("`independent` is N single-rank trainers at once with nothing exchanged: this machine's "
                 "ceiling for N processes. ")
    text += (f"Machine: {env.get('cores')} cores ({env.get('cpu_model')}), no GPU; each worker has "
             f"{cfg['threads']} TF thread(s); 'over' marks more processes x threads than cores. "
             f"Load average (1 min) at start/end: "
             f"{tables.fmt(load[0][0] if load[0] else None)}/{tables.fmt(load[1][0] if load[1] else None)} "
             f"(other work on the machine skews every number).\n")
    return text


def markdown(result):
    """The report of one site: what ran, what it found, the table, then the rest."""
    return (f"# {title([result])}\n\n" + tables.findings_markdown(finding_sentences([result]))
            + tables.markdown(COLUMNS, table_rows(result)) + notes(result) + "\nHow it was measured: " + method(result))


def notes(result):
    """What follows the table: the α-β fits, and the modes set side by side."""
    text, site = "", result.get("site") or {}
    fit, ps_fit = result["alpha_beta"], result.get("alpha_beta_ps")
    if fit or ps_fit:
        ring_source = "OpenMPI's ring allreduce across these hosts (mpi-ring)" if site.get("across_hosts") \
            else "Horovod allreduce (horovod-mpi)"
        grad = result.get("gradient_bytes")
        text += "\nα-β models" + (f" (gradients {grad / 1e6:.2f} MB per step)" if grad else "") + \
                ", as measured (before any time dilation is divided out):\n\n"
        fits = (per_rank_count(f"ring rows: {ring_source}", fit)
                + per_rank_count("ring rows whose gradients Gloo carried: Horovod's allreduce over Gloo "
                                 "(horovod-gloo)", result.get("alpha_beta_gloo"))
                + per_rank_count("TF collective rows: TF's own ring all-reduce (tf-ring)", result.get("alpha_beta_tf")))
        for label, f in fits + [("PS rows: TF gRPC push + pull (grpc-ps)", ps_fit)]:
            if f:
                text += (f"- {label}: α = {f['alpha_sec'] * 1e6:.1f} us, 1/β = "
                         f"{(f['bandwidth_gb_per_sec'] or 0) * 1e3:.1f} MB/s{stats.small_line_words(f)}\n")
    loop = loop_findings(result)
    if loop:
        text += ("\nHorovod's background loop, ringtrain's event-driven patch (ring) against upstream's "
                 "(ring-upstream), in the same rounds:\n\n")
        text += findings_table(loop)
    against_tf = horovod_against_tf(result)
    if against_tf:
        text += ("\nHorovod's ring (ring) against TensorFlow's own collective all-reduce (tf-collective), "
                 "the same model, data and batch:\n\n")
        text += findings_table(against_tf)
    if result["gaps"]:
        text += "\nRing against sync PS (step-time gap = PS step - ring step):\n\n"
        text += tables.markdown(
            [("mode", "ring mode"), ("n", "N (PS)"), ("ring", "ring img/s ÷ PS img/s"),
             ("measured", "measured gap ms"), ("predicted", "α-β gap ms"), ("error", "gap error")],
            [{"mode": g["ring_mode"], "n": f"{g['workers']} ({g['num_ps']})",
              "ring": tables.fmt(g["ring_over_ps_throughput"]),
              "measured": tables.fmt(g["measured_gap_ms"]), "predicted": tables.fmt(g["predicted_gap_ms"]),
              "error": percent(g["gap_error_pct"])} for g in result["gaps"]])
    return text


def per_rank_count(label, fit):
    """[(label at N, fit)] of a fit, or of {N: fit} fits at each rank count ("all": over every N)."""
    fits = {} if not fit else {"": fit} if "alpha_sec" in fit else fit
    return [(f"{label}{' at N = ' + key if key not in ('', 'all') else ''}", f)
            for key, f in fits.items() if key != "all" or len(fits) == 1]


def write(result, out_dir):
    text = tables.write_report(out_dir, "scaling", markdown(result), CSV_KEYS, result)
    plots.write_index(out_dir, "scaling", plots.scaling_plots(
        result["rows"], os.path.join(out_dir, "scaling_throughput.png"), os.path.join(out_dir, "scaling_efficiency.png"),
        title=result.get("site", {}).get("label")))
    return text


def findings_table(findings):
    """[(what, measured)] as a Markdown table: what the rows show, no verdicts."""
    return tables.markdown([("what", "what"), ("measured", "measured")],
                           [{"what": what, "measured": measured} for what, measured in findings])


def loop_findings(result):
    """At each N > 1 where both loops ran: the background thread's CPU, and
    ring throughput against independent trainers, for both loops."""
    out = []
    for n in sorted({r["workers"] for r in result["rows"] if r["workers"] > 1}):
        event, upstream = _row(result, "ring", n), _row(result, "ring-upstream", n)
        if not event or not upstream:
            continue
        cpu = event.get("cpu_horovod_thread_pct")
        if cpu is not None:
            out.append((f"N={n}: Horovod's background thread, % of a core per rank",
                         f"{cpu:.1f}% (upstream loop: {percent(upstream.get('cpu_horovod_thread_pct'), digits=1)}); "
                         f"other threads {percent(event.get('cpu_other_threads_pct'))} "
                         f"(upstream: {percent(upstream.get('cpu_other_threads_pct'))})"))
        share = event.get("fraction_of_independent")
        if share is not None:
            up = upstream.get("fraction_of_independent")
            out.append((f"N={n}: ring's share of {n} independent trainers (median of {event['rounds']} rounds)",
                        f"{100 * share:.0f}% (upstream loop: {percent(None if up is None else 100 * up)})"))
    return out


def horovod_against_tf(result):
    """At each N where both ran: Horovod's throughput over TF collective's, measured
    and by α-β (each all-reduce with its own fit; Horovod's hides behind
    backprop, TF's buckets as far as their order lets them), and, with TF's own fit, how
    much of the predicted ratio is the overlap and how much the transport."""
    out = []
    for n in sorted({r["workers"] for r in result["rows"]}):
        ring, tf = _row(result, "ring", n), _row(result, "tf-collective", n)
        if not ring or not tf or not tf["total_images_per_sec"]:
            continue
        ratio = ring["total_images_per_sec"] / tf["total_images_per_sec"]
        predicted = (tf["predicted_step_time_ms"] / ring["predicted_step_time_ms"]
                     if tf["predicted_step_time_ms"] and ring["predicted_step_time_ms"] else None)
        out.append((f"N={n}{' at ' + link_text(ring) if ring.get('link_rate') else ''}: "
                    "Horovod img/s ÷ TF collective img/s",
                    f"measured {ratio:.2f}x" + (f", α-β says {predicted:.2f}x" if predicted else "")
                    + overlap_and_transport(result, ring, tf)
                    + f"; step {tables.fmt(ring['step_time_ms'])} ms against {tables.fmt(tf['step_time_ms'])} ms"))
    return out


def overlap_and_transport(result, ring, tf):
    """α-β's ratio as two factors: TF's exchange (its buckets, in order) priced
    with Horovod's fit, over Horovod's step, is the overlap; TF's step over
    that is TF's ring against Horovod's transport (OpenMPI's ring, or Gloo's)
    on the same links."""
    from ringtrain.bench.scaling_rows import fit_at, transport_fit
    horovods = transport_fit(ring["algorithm"], result.get("alpha_beta"), result.get("alpha_beta_gloo"))
    gloo = horovods is not result.get("alpha_beta")
    fits, n, same_links = (horovods, result.get("alpha_beta_tf")), tf["workers"], \
        tf.get("predicted_step_on_horovod_fit_ms")
    if not all(fits) or n < 2 or not same_links or not ring["predicted_step_time_ms"] or \
            not tf["predicted_step_time_ms"]:
        return ""
    horovod_fit, tf_fit = (fit_at(f, n) for f in fits)
    mb_per_sec = lambda fit: 1e3 * (fit["bandwidth_gb_per_sec"] or 0)
    return (f" = {same_links / ring['predicted_step_time_ms']:.2f}x overlap (what of each exchange outlasts "
            f"backprop: Horovod's buckets and fusion, TF's buckets in order) × "
            f"{tf['predicted_step_time_ms'] / same_links:.2f}x transport (TF's ring {mb_per_sec(tf_fit):.1f} MB/s, "
            f"{'Gloo' if gloo else 'OpenMPI'}'s {mb_per_sec(horovod_fit):.1f} MB/s)")


# --- over several link rates ---------------------------------------------------

def findings(results):
    """What the rows of every link rate show together: [(what, measured)]."""
    rows = [r for result in results for r in result["rows"]]
    out = []
    measured = [r for r in rows if r["wire_bytes_pct_of_theory"] is not None and r["workers"] > 1]
    # In async training workers step at their own pace and each host's bytes are counted over
    # its own worker's timed steps, so a "step" of the whole is only an average: shown apart.
    for label, wire in (("allreduce modes and sync PS", [r for r in measured if r["mode"] != "ps-async"]),
                        ("async PS (per round of one step of each worker)",
                         [r for r in measured if r["mode"] == "ps-async"])):
        if wire:
            worst = max(wire, key=lambda r: abs(r["wire_bytes_pct_of_theory"] - 100))
            out.append((f"wire bytes against the theory, {label}, every N",
                        f"{len(wire)} rows, from {min(r['wire_bytes_pct_of_theory'] for r in wire):.1f} % to "
                        f"{max(r['wire_bytes_pct_of_theory'] for r in wire):.1f} %; furthest: {row_name(worst)}"))
    predicted = [r for r in rows if r["prediction_error_pct"] is not None]
    if predicted:
        worst = max(predicted, key=lambda r: abs(r["prediction_error_pct"]))
        out.append(("α-β step time against the measured step, every row",
                    f"{len(predicted)} rows, errors from {min(r['prediction_error_pct'] for r in predicted):+.0f} % "
                    f"to {max(r['prediction_error_pct'] for r in predicted):+.0f} %; furthest: {row_name(worst)}"))
    out += ring_against_ps(results) + ring_at_its_limit(results)
    out += [finding for result in results for finding in horovod_against_tf(result)]
    return out


def ring_against_ps(results):
    """1 PS, no dilation: ring's throughput against sync PS's at the top N, measured and by α-β."""
    out = []
    for result in results:
        if (result.get("site") or {}).get("dilation", 1) != 1:
            continue
        ns = sorted({r["workers"] for r in result["rows"]})
        ring = [_row(result, "ring", n) for n in ns]
        ps = [_row(result, "ps-sync", n, 1 if n > 1 else None) for n in ns]
        if not all(ring) or not all(ps) or len(ns) < 2:
            continue
        top = ns[-1]
        ratio = ring[-1]["total_images_per_sec"] / ps[-1]["total_images_per_sec"]
        predicted = (ps[-1]["predicted_step_time_ms"] / ring[-1]["predicted_step_time_ms"]
                     if ps[-1]["predicted_step_time_ms"] and ring[-1]["predicted_step_time_ms"] else None)
        effs = lambda rs: ", ".join(f"N={r['workers']} {100 * (r['efficiency'] or 0):.0f} %" for r in rs)
        out.append((f"ring against sync PS (1 PS), {link_text(ring[-1])}, N={top}",
                    f"measured {ratio:.2f}x, α-β says {predicted:.2f}x; efficiency ring "
                    f"{effs(ring)}; PS {effs(ps)}" if predicted else f"measured {ratio:.2f}x"))
    return out


def ring_at_its_limit(results):
    """With dilation: ring's efficiency at the top N against the α-β model's."""
    out = []
    for result in results:
        if (result.get("site") or {}).get("dilation", 1) == 1:
            continue
        top = max((r["workers"] for r in result["rows"]), default=0)
        ring = _row(result, "ring", top)
        if ring and ring["efficiency"] and ring["predicted_efficiency"]:
            share = ring["efficiency"] / ring["predicted_efficiency"]
            out.append((f"ring's efficiency against α-β's, {link_text(ring)}, N={top}",
                        f"measured {100 * ring['efficiency']:.0f} %, α-β "
                        f"{100 * ring['predicted_efficiency']:.0f} %: {100 * share:.0f} % of it"))
    return out


def link_results(out_dir):
    """Every per-link result in out_dir's subfolders (runs of --cluster add theirs), slowest link first."""
    results = []
    for name in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, name, "scaling.json")
        if os.path.isfile(path):
            with open(path) as f:
                result = json.load(f)
            if (result.get("site") or {}).get("link_rate"):
                results.append(result)
    from ringtrain.multihost.simcluster import rate_bits_per_sec
    return sorted(results, key=lambda r: (rate_bits_per_sec(r["site"]["link_rate"]), r["site"].get("dilation", 1)))


def write_links(out_dir):
    """One report over every link rate measured into out_dir (this run's and
    earlier --cluster runs' into the same folder): each table, then what they show together."""
    results = link_results(out_dir)
    text = f"# {title(results)}\n\n" + tables.findings_markdown(finding_sentences(results))
    for result in results:
        text += (f"## {link_text(result['rows'][0]) if result['rows'] else result['site']['link_rate']}\n\n"
                 + tables.markdown(COLUMNS, table_rows(result)) + notes(result) + "\nHow it was measured: "
                 + method(result) + "\n")
    text += "## What the rows show, together\n\n"
    text += findings_table(findings(results))
    with open(os.path.join(out_dir, "scaling.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out_dir, "scaling.json"), "w") as f:
        f.write(dumps({"links": results, "findings": [{"what": what, "measured": measured}
                                                     for what, measured in findings(results)]},
                      indent=1, sort_keys=True))
    return text
