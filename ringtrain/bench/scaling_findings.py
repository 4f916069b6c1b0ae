"""What a scaling run found, in sentences, each with its number: the first
thing its report says. Every number comes from the rows of the run's own
result (scaling.json); none is a verdict against a target of ours."""
from ringtrain.bench import bench_modes
from ringtrain.bench.tables import join


def link_text(r):
    if not r["link_rate"]:
        return "n/a"
    dilation = r.get("time_dilation") or 1
    return r["link_rate"] + (f" (÷{dilation:g})" if dilation != 1 else "")


def row_name(r):
    return (f"{r['mode']} N={r['workers']}" + (f" P={r['num_ps']}" if r["num_ps"] else "")
            + (f" at {link_text(r)}" if r.get("link_rate") else ""))


def find_row(result, mode, n, p=None):
    return next((r for r in result["rows"] if r["mode"] == mode and r["workers"] == n
                 and (p is None or r["num_ps"] == p)), None)


def who(r):
    """A row's mode in a sentence: `ps-sync with 1 PS`."""
    return r["mode"] + (f" with {r['num_ps']} PS" if r["num_ps"] else "")


def where(r, several_links):
    """`N = 4`, and the link when a report holds several."""
    return f"N = {r['workers']}" + (f" on {link_text(r)}" if several_links and r.get("link_rate") else "")


def sentences(results):
    """The findings of one run, or of every link rate of a --cluster run, together."""
    several = len(results) > 1
    rows = [r for result in results for r in result["rows"]]
    return (throughput(results, several) + efficiency(rows, several) + ring_against_ps(results, several)
            + horovod_against_tf(results, several) + background_loop(results) + alpha_beta(rows)
            + wire_bytes(rows))


def throughput(results, several):
    """Each link's modes at its largest N, fastest first."""
    out = []
    for result in results:
        top = max((r["workers"] for r in result["rows"]), default=0)
        at = sorted((r for r in result["rows"] if r["workers"] == top and r["mode"] != bench_modes.INDEPENDENT
                     and r["total_images_per_sec"]), key=lambda r: -r["total_images_per_sec"])
        if at:
            out.append(f"At {where(at[0], several)}, " + join(
                f"{who(r)} trained {r['total_images_per_sec']:,.0f} img/s" if i == 0 else
                f"{who(r)} {r['total_images_per_sec']:,.0f}" for i, r in enumerate(at)) + " in all.")
    return out


def efficiency(rows, several):
    """The best and the worst efficiency of any row of N > 1."""
    scaled = sorted((r for r in rows if r["workers"] > 1 and r["efficiency"] is not None
                     and r["mode"] != bench_modes.INDEPENDENT), key=lambda r: r["efficiency"])
    if not scaled:
        return []
    worst, best = scaled[0], scaled[-1]
    if worst is best:
        return [f"{who(best)} scaled at {100 * best['efficiency']:.0f} % efficiency at {where(best, several)}."]
    return [f"Efficiency ranged from {100 * worst['efficiency']:.0f} % ({who(worst)}, {where(worst, several)}) "
            f"to {100 * best['efficiency']:.0f} % ({who(best)}, {where(best, several)})."]


def ring_against_ps(results, several):
    """Each all-reduce mode against sync PS at the largest N both ran, measured and by α-β."""
    out = []
    for result in results:
        latest = {}
        for g in result["gaps"]:
            latest[g["ring_mode"]] = g  # gaps run from the smallest N up
        for mode, g in latest.items():
            ring, ps = find_row(result, mode, g["workers"]), find_row(result, "ps-sync", g["workers"], g["num_ps"])
            predicted = ratio(ps and ps["predicted_step_time_ms"], ring and ring["predicted_step_time_ms"])
            out.append(f"At {where(ring, several)}, {mode} trained {g['ring_over_ps_throughput']:.2f}× the img/s of "
                       f"ps-sync with {g['num_ps']} PS" + (f"; α-β predicted {predicted:.2f}×." if predicted else "."))
    return out


def horovod_against_tf(results, several):
    """Horovod's ring against TF's collective all-reduce at the largest N both ran."""
    out = []
    for result in results:
        both = [n for n in sorted({r["workers"] for r in result["rows"]})
                if find_row(result, "ring", n) and find_row(result, "tf-collective", n)]
        if not both:
            continue
        ring, tf = find_row(result, "ring", both[-1]), find_row(result, "tf-collective", both[-1])
        measured = ratio(ring["total_images_per_sec"], tf["total_images_per_sec"])
        predicted = ratio(tf["predicted_step_time_ms"], ring["predicted_step_time_ms"])
        if measured:
            out.append(f"At {where(ring, several)}, Horovod's ring (ring) trained {measured:.2f}× the img/s of TF's "
                       "collective all-reduce (tf-collective)"
                       + (f"; α-β predicted {predicted:.2f}×." if predicted else "."))
    return out


def background_loop(results):
    """ringtrain's event-driven Horovod loop against upstream's, at the largest N both ran."""
    out = []
    for result in results:
        both = [n for n in sorted({r["workers"] for r in result["rows"]}) if n > 1
                and find_row(result, "ring", n) and find_row(result, "ring-upstream", n)]
        if not both:
            continue
        event, upstream = find_row(result, "ring", both[-1]), find_row(result, "ring-upstream", both[-1])
        if event.get("cpu_horovod_thread_pct") is not None and upstream.get("cpu_horovod_thread_pct") is not None:
            out.append(f"At N = {both[-1]}, Horovod's background thread used {event['cpu_horovod_thread_pct']:.1f} % "
                       f"of a core with ringtrain's event-driven loop, {upstream['cpu_horovod_thread_pct']:.1f} % "
                       "with upstream's.")
    return out


def alpha_beta(rows):
    """How far the α-β model's step times were from the measured ones."""
    predicted = [r for r in rows if r["prediction_error_pct"] is not None]
    if not predicted:
        return []
    worst = max(predicted, key=lambda r: abs(r["prediction_error_pct"]))
    errors = [r["prediction_error_pct"] for r in predicted]
    if len(predicted) == 1:
        out = [f"The α-β model's step time was {errors[0]:+.0f} % off the measured one ({row_name(worst)})."]
    else:
        out = [f"The α-β model's step times were {min(errors):+.0f} % to {max(errors):+.0f} % off the measured "
               f"ones over {len(predicted)} rows (furthest: {row_name(worst)})."]
    return out + sync_wait(rows) + kernel_on_compute(rows)


def sync_wait(rows):
    """The synchronous modes' wait for their slowest worker, which α-β adds."""
    waits = [r for r in rows if r.get("sync_wait_ms") and r["prediction_error_pct"] is not None]
    if not waits:
        return []
    worst = max(waits, key=lambda r: r["sync_wait_ms"])
    return [f"A synchronous step waits for its slowest worker's compute: up to {worst['sync_wait_ms']:.1f} ms a step "
            f"({row_name(worst)}), E[the slowest of N] less the mean of the compute runs' steps, which α-β's step "
            f"includes."]


def kernel_on_compute(rows):
    """Where the workers compute on the cores that also run the exchange's
    kernel work: the CPU it took from the compute, which α-β's wire time
    leaves out, and the model's error with it added."""
    priced = [r for r in rows if r.get("error_with_kernel_pct") is not None and r["workers"] > 1]
    if not priced:
        return []
    worst = max(priced, key=lambda r: r["kernel_on_compute_ms"])
    errors = [r["error_with_kernel_pct"] for r in priced]
    return [f"The exchange's kernel work (its sockets; between simulated hosts also their veths, bridge and "
            f"shaping) ran on the cores that compute: up to {worst['exchange_kernel_cpu_ms']:.1f} ms of CPU a step "
            f"({row_name(worst)}), {worst['kernel_on_compute_ms']:.1f} ms of step over the cores. With it added, "
            f"α-β was "
            + (f"{errors[0]:+.0f} % off" if len(errors) == 1 else f"{min(errors):+.0f} % to {max(errors):+.0f} % off")
            + " the measured step" + ("s" if len(errors) > 1 else "") + "."]


def wire_bytes(rows):
    """Across hosts: the bytes on the wire against the theory, allreduce and sync rows."""
    measured = [r["wire_bytes_pct_of_theory"] for r in rows if r["wire_bytes_pct_of_theory"] is not None
                and r["workers"] > 1 and r["mode"] != "ps-async"]
    if not measured:
        return []
    return [f"The hosts sent {min(measured):.1f} % to {max(measured):.1f} % of the bytes the theory says, over "
            f"{len(measured)} rows."]


def ratio(a, b):
    return a / b if a and b else None
