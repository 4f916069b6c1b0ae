"""PNG plots (matplotlib, Agg: no display needed).

Every plotting function returns a record of what it drew: the file, its
title and each data series' label and point count (reference lines, such as
ideal scaling or a target, are not data). A plot with no data series is not
drawn, any older PNG of that name is removed, and the record says why in one
line. `write_index` keeps a report's records beside its plots
(`STEM_plots.json`), so that its page, and a test, know what each plot shows."""
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def record(path, title, series, why_not=None):
    """What a plot shows: [(label, points)] of its data series; with none,
    it was not drawn, and `why_not` says why."""
    series = [{"label": label, "points": points} for label, points in series if points]
    drawn = bool(series)
    if not drawn and os.path.exists(path):
        os.remove(path)  # an older run's plot must not stand for this one's
    return {"file": os.path.basename(path), "title": title, "drawn": drawn, "series": series,
            "why_not_drawn": None if drawn else why_not or "no data to plot"}


def write_index(out_dir, stem, records):
    """OUT/STEM_plots.json: the records of a report's plots."""
    with open(os.path.join(out_dir, f"{stem}_plots.json"), "w") as f:
        json.dump({"plots": records}, f, indent=1)
        f.write("\n")
    return records


def busbw_plot(result, path):
    title = "Allreduce bus bandwidth against message size"
    rows = result["rows"]
    several = len({r["world_size"] for r in rows if r["impl"] != "grpc-ps"}) > 1
    lines = list(dict.fromkeys((r["impl"], r["world_size"]) for r in rows if not r["impl"].endswith("-grads")))
    stars = [r for r in rows if r["impl"].endswith("-grads")]
    if not lines and not stars:
        return record(path, title, [], "the run measured no allreduce")
    fig, ax = plt.subplots(figsize=(8, 5))
    drawn = []
    for impl, n in lines:
        pts = sorted((r["bytes"], r["busbw_gbs"]) for r in rows if (r["impl"], r["world_size"]) == (impl, n))
        style = dict(linestyle="--", color="grey") if impl == "memcpy" else dict(marker="o")
        label = "memcpy bound (algbw of np.copyto, all ranks at once)" if impl == "memcpy" else \
            f"{impl}, {n} ranks" if several and impl != "grpc-ps" else impl
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
        drawn.append((label, len(pts)))
    for r in stars:
        label = f"{r['impl']} (model gradients)"
        ax.plot([r["bytes"]], [r["busbw_gbs"]], marker="*", markersize=12, linestyle="none", label=label)
        drawn.append((label, 1))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s) = algbw * 2(n-1)/n")
    ax.set_title(f"Allreduce bus bandwidth, {result['config']['np']} ranks, float32, "
                 f"{result['config'].get('site') or 'this machine'}", fontsize=9)
    save(fig, ax, path, legend_size=8)
    return record(path, title, drawn)


def projection_plot(result, line_label, path):
    """Projected efficiency against N (log scale): ring solid, PS dashed, one line per link rate."""
    title = "Projected scaling efficiency against N GPUs"
    lines = {}
    for r in result["rows"]:
        lines.setdefault((r["link_rate"], line_label(r)), []).append((r["gpus"], 100 * r["efficiency"]))
    if not lines:
        return record(path, title, [], "the projection has no rows")
    fig, ax = plt.subplots(figsize=(7, 5))
    for (rate, label), points in lines.items():
        ax.plot(*zip(*sorted(points)), marker="o", linestyle="-" if label == "ring" else "--",
                label=f"{label}, {rate}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N GPUs (log scale)")
    ax.set_ylabel("projected efficiency, %")
    ax.set_ylim(0, 105)
    ax.set_title(f"Projected scaling efficiency: {result['inputs']['model']}, "
                 f"{result['inputs']['gpus_per_host']} GPUs per host (α-β model)", fontsize=9)
    save(fig, ax, path, legend_size=7)
    return record(path, title, [(f"{label}, {rate}", len(points)) for (rate, label), points in lines.items()])


def save(fig, ax, path, legend_size):
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def series(rows):
    """(label, rows by N) of each line: a mode, and for PS a fixed P or P = N."""
    out = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["workers"])
        if not mode.startswith("ps-"):
            out.append((mode, mine))
            continue
        grows = [r for r in mine if r["workers"] > 1 and r["num_ps"] == r["workers"]]
        for p in sorted({r["num_ps"] for r in mine if r not in grows}):
            out.append((f"{mode} P={p}", [r for r in mine if r["num_ps"] == p and r not in grows]))
        if grows:
            out.append((f"{mode} P=N", [r for r in mine if r["workers"] == 1][:1] + grows))
    return out


def scaling_plots(rows, throughput_path, efficiency_path, title=None):
    """Total throughput against N (dotted: N x T1), and efficiency against N
    (dashed: α-β's). Returns both plots' records."""
    lines = series(rows)
    throughput = [(label, [(r["workers"], r["total_images_per_sec"]) for r in pts
                           if r["total_images_per_sec"] is not None]) for label, pts in lines]
    efficiency = [(label, [(r["workers"], 100 * r["efficiency"]) for r in pts if r["efficiency"] is not None],
                   [(r["workers"], 100 * r["predicted_efficiency"]) for r in pts if r.get("predicted_efficiency")])
                  for label, pts in lines]
    suffix = f"\n{title}" if title else ""
    records = [scaling_throughput_plot(lines, throughput, throughput_path, suffix)]
    records.append(scaling_efficiency_plot(efficiency, efficiency_path, suffix,
                                           sorted({r["workers"] for r in rows})))
    return records


def scaling_throughput_plot(lines, throughput, path, suffix):
    title = "Total throughput against N"
    if not any(points for _, points in throughput):
        return record(path, title, [], "no row measured a total throughput")
    fig, ax = plt.subplots(figsize=(7, 5))
    for i, ((label, pts), (_, points)) in enumerate(zip(lines, throughput)):
        if not points:
            continue
        ax.plot(*zip(*points), marker="o", color=f"C{i}", label=f"{label} measured")
        base = next((r["total_images_per_sec"] for r in pts if r["workers"] == 1), None)
        if base:
            n = [p[0] for p in points]
            ax.plot(n, [base * k for k in n], linestyle=":", color=f"C{i}", label=f"{label} ideal N*T1")
    ax.set_xlabel("N workers")
    ax.set_ylabel("measured total images/sec")
    ax.set_title("Total throughput against N (dotted: ideal linear scaling)" + suffix, fontsize=9)
    ax.set_xticks(sorted({n for _, points in throughput for n, _ in points}))
    save(fig, ax, path, legend_size=7)
    return record(path, title, [(f"{label} measured", len(points)) for label, points in throughput])


def scaling_efficiency_plot(efficiency, path, suffix, workers):
    title = "Scaling efficiency against N"
    if not any(measured or predicted for _, measured, predicted in efficiency):
        return record(path, title, [], "efficiency needs an N = 1 row of the same mode: add 1 to --np")
    fig, ax = plt.subplots(figsize=(7, 5))
    drawn = []
    for i, (label, measured, predicted) in enumerate(efficiency):
        if measured:
            ax.plot(*zip(*measured), marker="o", color=f"C{i}", label=label)
            drawn.append((label, len(measured)))
        if predicted:
            ax.plot(*zip(*predicted), linestyle="--", color=f"C{i}", alpha=0.6, label=f"{label} α-β")
            drawn.append((f"{label} α-β", len(predicted)))
    ax.axhline(100, color="grey", linestyle=":", label="ideal")
    ax.set_xlabel("N workers")
    ax.set_ylabel("efficiency T_N / (N * T_1), %")
    ax.set_title("Scaling efficiency against N (dashed: α-β)" + suffix, fontsize=9)
    ax.set_xticks(workers)
    save(fig, ax, path, legend_size=7)
    return record(path, title, drawn)


def straggler_plots(rows, throughput_path, steps_path):
    """Applied throughput against the straggler factor, as a share of no
    straggler (dashed: the model); and the healthy workers' step times.
    Returns both plots' records."""
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    by_mode = {m: sorted((r for r in rows if r["mode"] == m), key=lambda r: r["factor"]) for m in modes}
    points = lambda pts, key, scale=1: [(r["factor"], scale * r[key]) for r in pts if r[key] is not None]
    kept = [(m, points(by_mode[m], "ratio_to_no_straggler", 100), points(by_mode[m], "model_ratio", 100))
            for m in modes]
    steps = [(m, points(by_mode[m], "healthy_step_p50_ms"), points(by_mode[m], "healthy_step_p99_ms"))
             for m in modes]
    return [two_line_plot(kept, throughput_path, "What one straggler costs each mode",
                          "straggler factor (its steps take F x its compute)",
                          "applied img/s, % of the same mode without a straggler",
                          "What one straggler costs each mode (dashed: model)", ("", " model"),
                          dict(linestyle="--", alpha=0.6), "no run measured its applied throughput"),
            two_line_plot(steps, steps_path, "Healthy workers' step times", "straggler factor",
                          "healthy workers' step time, ms",
                          "Healthy workers' step times: p50 (solid) and p99 (dotted)", (" p50", " p99"),
                          dict(marker="^", linestyle=":"), "no healthy worker timed its steps")]


def two_line_plot(lines, path, title, xlabel, ylabel, heading, suffixes, second_style, why_not):
    """[(mode, first points, second points)]: each mode's two lines, one colour a mode."""
    drawn = [(f"{m}{suffixes[0]}", len(a)) for m, a, _ in lines] + [(f"{m}{suffixes[1]}", len(b)) for m, _, b in lines]
    # the model's line alone is no measurement: without measured points there is nothing to show
    if not any(a for _, a, _ in lines):
        return record(path, title, [], why_not)
    fig, ax = plt.subplots(figsize=(7, 5))
    for i, (mode, first, second) in enumerate(lines):
        if first:
            ax.plot(*zip(*first), marker="o", color=f"C{i}", label=f"{mode}{suffixes[0]}")
        if second:
            ax.plot(*zip(*second), color=f"C{i}", label=f"{mode}{suffixes[1]}", **second_style)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(heading, fontsize=9)
    save(fig, ax, path, legend_size=7)
    return record(path, title, drawn)


def convergence_plots(curves, time_path, samples_path, target=None):
    """Test accuracy against training seconds and against samples seen, every
    mode (and round) together. curves: [(mode, [(seconds, samples, accuracy, ...)])],
    a curve per run. Returns both plots' records."""
    curves = [(mode, points) for mode, points in curves if points]
    records = []
    for path, x, xl in ((time_path, 0, "training seconds (start-up and snapshots excluded)"),
                        (samples_path, 1, "samples whose gradients were applied")):
        title = f"Test accuracy against {xl.split(' (')[0]}"
        if not curves:
            records.append(record(path, title, [], "no snapshot was evaluated: give --steps of at least "
                                                   "--snapshot-every"))
            continue
        fig, ax = plt.subplots(figsize=(7, 5))
        colors = {}  # one colour and one legend entry per mode, however many rounds
        for mode, points in curves:
            first = mode not in colors
            color = colors.setdefault(mode, f"C{len(colors)}")
            ax.plot([p[x] for p in points], [100 * p[2] for p in points], color=color, marker=".", alpha=0.8,
                    label=mode if first else None)
        if target:
            ax.axhline(100 * target, color="grey", linestyle=":", label=f"target {100 * target:g}%")
        ax.set_xlabel(xl)
        ax.set_ylabel("test accuracy, %")
        ax.set_title(title, fontsize=9)
        save(fig, ax, path, legend_size=8)
        records.append(record(path, title, [(f"{mode}, run {i + 1}", len(points))
                                            for i, (mode, points) in enumerate(curves)]))
    return records
