"""PNG plots (matplotlib, Agg: no display needed)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def busbw_plot(result, path):
    fig, ax = plt.subplots(figsize=(8, 5))
    impls = []
    for r in result["rows"]:
        if r["impl"] not in impls and not r["impl"].endswith("-grads"):
            impls.append(r["impl"])
    for impl in impls:
        pts = sorted((r["bytes"], r["busbw_gbs"]) for r in result["rows"] if r["impl"] == impl)
        style = dict(linestyle="--", color="grey") if impl == "memcpy" else dict(marker="o")
        label = "memcpy bound (algbw of np.copyto, all ranks at once)" if impl == "memcpy" else impl
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
    for r in result["rows"]:
        if r["impl"].endswith("-grads"):
            ax.plot([r["bytes"]], [r["busbw_gbs"]], marker="*", markersize=12, linestyle="none",
                    label=f"{r['impl']} (model gradients)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s) = algbw * 2(n-1)/n")
    ax.set_title(f"Allreduce bus bandwidth, {result['config']['np']} ranks, float32")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def scaling_plots(rows, throughput_path, efficiency_path):
    modes = []
    for r in rows:
        if r["mode"] not in modes:
            modes.append(r["mode"])
    fig, ax = plt.subplots(figsize=(7, 5))
    fig2, ax2 = plt.subplots(figsize=(7, 5))
    for i, mode in enumerate(modes):
        pts = sorted((r["workers"], r) for r in rows if r["mode"] == mode)
        color = f"C{i}"
        n = [p[0] for p in pts]
        ax.plot(n, [p[1]["total_images_per_sec"] for p in pts], marker="o", color=color,
                label=f"{mode} measured")
        base = next((p[1]["total_images_per_sec"] for p in pts if p[0] == 1), None)
        if base:
            ax.plot(n, [base * k for k in n], linestyle=":", color=color, label=f"{mode} ideal N*T1")
        eff = [(p[0], p[1]["efficiency"]) for p in pts if p[1]["efficiency"] is not None]
        if eff:
            ax2.plot([e[0] for e in eff], [100 * e[1] for e in eff], marker="o", color=color, label=mode)
    ax.set_xlabel("N workers")
    ax.set_ylabel("measured total images/sec")
    ax.set_title("Total throughput against N (dotted: ideal linear scaling)")
    ax2.axhline(100, color="grey", linestyle=":", label="ideal")
    ax2.set_xlabel("N workers")
    ax2.set_ylabel("efficiency T_N / (N * T_1), %")
    ax2.set_title("Scaling efficiency against N")
    for a, f, p in ((ax, fig, throughput_path), (ax2, fig2, efficiency_path)):
        a.grid(True, alpha=0.3)
        a.legend(fontsize=8)
        a.set_xticks(sorted({r["workers"] for r in rows}))
        f.tight_layout()
        f.savefig(p, dpi=100)
        plt.close(f)
