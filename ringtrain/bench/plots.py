"""PNG plots (matplotlib, Agg: no display needed)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def busbw_plot(result, path):
    fig, ax = plt.subplots(figsize=(8, 5))
    several = len({r["world_size"] for r in result["rows"] if r["impl"] != "grpc-ps"}) > 1
    lines = list(dict.fromkeys((r["impl"], r["world_size"]) for r in result["rows"]
                               if not r["impl"].endswith("-grads")))
    for impl, n in lines:
        pts = sorted((r["bytes"], r["busbw_gbs"]) for r in result["rows"] if (r["impl"], r["world_size"]) == (impl, n))
        style = dict(linestyle="--", color="grey") if impl == "memcpy" else dict(marker="o")
        label = "memcpy bound (algbw of np.copyto, all ranks at once)" if impl == "memcpy" else \
            f"{impl}, {n} ranks" if several and impl != "grpc-ps" else impl
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
    for r in result["rows"]:
        if r["impl"].endswith("-grads"):
            ax.plot([r["bytes"]], [r["busbw_gbs"]], marker="*", markersize=12, linestyle="none",
                    label=f"{r['impl']} (model gradients)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s) = algbw * 2(n-1)/n")
    ax.set_title(f"Allreduce bus bandwidth, {result['config']['np']} ranks, float32, "
                 f"{result['config'].get('site') or 'this machine'}", fontsize=9)
    save(fig, ax, path, legend_size=8)


def projection_plot(result, line_label, path):
    """Projected efficiency against N (log scale): ring solid, PS dashed, one line per link rate."""
    fig, ax = plt.subplots(figsize=(7, 5))
    lines = {}
    for r in result["rows"]:
        lines.setdefault((r["link_rate"], line_label(r)), []).append((r["gpus"], 100 * r["efficiency"]))
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
    fig, ax = plt.subplots(figsize=(7, 5))
    fig2, ax2 = plt.subplots(figsize=(7, 5))
    for i, (label, pts) in enumerate(series(rows)):
        color = f"C{i}"
        n = [r["workers"] for r in pts]
        ax.plot(n, [r["total_images_per_sec"] for r in pts], marker="o", color=color, label=f"{label} measured")
        base = next((r["total_images_per_sec"] for r in pts if r["workers"] == 1), None)
        if base:
            ax.plot(n, [base * k for k in n], linestyle=":", color=color, label=f"{label} ideal N*T1")
        eff = [(r["workers"], r["efficiency"]) for r in pts if r["efficiency"] is not None]
        if eff:
            ax2.plot([e[0] for e in eff], [100 * e[1] for e in eff], marker="o", color=color, label=label)
        predicted = [(r["workers"], r.get("predicted_efficiency")) for r in pts if r.get("predicted_efficiency")]
        if predicted:
            ax2.plot([e[0] for e in predicted], [100 * e[1] for e in predicted], linestyle="--", color=color,
                     alpha=0.6, label=f"{label} α-β")
    ax.set_xlabel("N workers")
    ax.set_ylabel("measured total images/sec")
    ax.set_title("Total throughput against N (dotted: ideal linear scaling)" + (f"\n{title}" if title else ""),
                 fontsize=9)
    ax2.axhline(100, color="grey", linestyle=":", label="ideal")
    ax2.set_xlabel("N workers")
    ax2.set_ylabel("efficiency T_N / (N * T_1), %")
    ax2.set_title("Scaling efficiency against N (dashed: α-β)" + (f"\n{title}" if title else ""), fontsize=9)
    for a, f, p in ((ax, fig, throughput_path), (ax2, fig2, efficiency_path)):
        a.grid(True, alpha=0.3)
        a.legend(fontsize=7)
        a.set_xticks(sorted({r["workers"] for r in rows}))
        f.tight_layout()
        f.savefig(p, dpi=100)
        plt.close(f)


def straggler_plots(rows, throughput_path, steps_path):
    """Applied throughput against the straggler factor, as a share of no
    straggler (dashed: the model); and the healthy workers' step times."""
    fig, ax = plt.subplots(figsize=(7, 5))
    fig2, ax2 = plt.subplots(figsize=(7, 5))
    for i, mode in enumerate(dict.fromkeys(r["mode"] for r in rows)):
        pts = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["factor"])
        f = [r["factor"] for r in pts]
        color = f"C{i}"
        ax.plot(f, [100 * (r["ratio_to_no_straggler"] or 0) for r in pts], marker="o", color=color, label=mode)
        ax.plot(f, [100 * r["model_ratio"] for r in pts], linestyle="--", color=color, alpha=0.6,
                label=f"{mode} model")
        ax2.plot(f, [r["healthy_step_p50_ms"] for r in pts], marker="o", color=color, label=f"{mode} p50")
        ax2.plot(f, [r["healthy_step_p99_ms"] for r in pts], marker="^", linestyle=":", color=color,
                 label=f"{mode} p99")
    ax.set_xlabel("straggler factor (its steps take F x its compute)")
    ax.set_ylabel("applied img/s, % of the same mode without a straggler")
    ax.set_title("What one straggler costs each mode (dashed: model)", fontsize=9)
    ax2.set_xlabel("straggler factor")
    ax2.set_ylabel("healthy workers' step time, ms")
    ax2.set_title("Healthy workers' step times: p50 (solid) and p99 (dotted)", fontsize=9)
    for a, fg, p in ((ax, fig, throughput_path), (ax2, fig2, steps_path)):
        a.grid(True, alpha=0.3)
        a.legend(fontsize=7)
        fg.tight_layout()
        fg.savefig(p, dpi=100)
        plt.close(fg)


def convergence_plots(curves, time_path, samples_path, target=None):
    """Test accuracy against training seconds and against samples seen, every
    mode (and round) together. curves: [(mode, [(seconds, samples, accuracy, ...)])], a curve per run."""
    fig, ax = plt.subplots(figsize=(7, 5))
    fig2, ax2 = plt.subplots(figsize=(7, 5))
    colors = {}  # one colour and one legend entry per mode, however many rounds
    for mode, points in curves:
        first = mode not in colors
        color = colors.setdefault(mode, f"C{len(colors)}")
        kw = dict(color=color, marker=".", alpha=0.8, label=mode if first else None)
        ax.plot([p[0] for p in points], [100 * p[2] for p in points], **kw)
        ax2.plot([p[1] for p in points], [100 * p[2] for p in points], **kw)
    for a, fg, p, xl in ((ax, fig, time_path, "training seconds (start-up and snapshots excluded)"),
                         (ax2, fig2, samples_path, "samples whose gradients were applied")):
        if target:
            a.axhline(100 * target, color="grey", linestyle=":", label=f"target {100 * target:g}%")
        a.set_xlabel(xl)
        a.set_ylabel("test accuracy, %")
        a.set_title(f"Test accuracy against {xl.split(' (')[0]}", fontsize=9)
        a.grid(True, alpha=0.3)
        a.legend(fontsize=8)
        fg.tight_layout()
        fg.savefig(p, dpi=100)
        plt.close(fg)
