"""The ways to train that `ringtrain-bench straggler` and `convergence` set
side by side, as the classic tutorials weigh sync against async (every
registered mode whose workers are processes of their own; today these five):

- ring: Horovod's ring-allreduce, synchronous;
- tf-collective: TF's own collective all-reduce, synchronous;
- ps-sync: SyncReplicasOptimizer with K = W (every worker, every update);
- ps-sync-backup: W + 1 workers, K = W: one backup worker, so an update
  need not wait for the slowest; the late gradient is dropped as stale;
- ps-async: every worker applies its own gradients as soon as it has them.

All run through their real launchers, with one PS task, on a site of
bench/sites.py: this machine, a hostfile's hosts, a SLURM allocation or a
simulated cluster.
"""
from ringtrain.bench import bench_modes, scaling

MODES = bench_modes.sync_against_async_modes()
# The same optimizer on the same global batch in every mode: ring's default
# lr x N (with a warm-up) is a ring-mode recipe, not a property of the ring.
RING_AS_PS = ["--no-lr-scaling", "--warmup-epochs", "0"]


def command(mode, workers, cfg, summary, workdir, site, extra=()):
    """The launcher command for `mode` with W = `workers` on `site`; `extra`
    flags go to every trainer."""
    if mode == "ps-sync-backup":
        cmd = scaling.command("ps-sync", workers + 1, 1, cfg, cfg["batch_size"], summary, site, workdir)
        cmd += ["--replicas-to-aggregate", str(workers)]
    else:
        cmd = scaling.command(mode, workers, 1, cfg, cfg["batch_size"], summary, site, workdir)
    return cmd + (RING_AS_PS if bench_modes.all_reduces(mode) else []) + list(extra)


def run(mode, workers, cfg, out_dir, tag, log, site, extra=()):
    """One run on `site`; its summary."""
    return scaling.run_tagged(tag, lambda summary, runs: command(mode, workers, cfg, summary, runs, site, extra),
                              out_dir, site, cfg["timeout"], log)


def where(result):
    """Where a report's runs ran (the site's label)."""
    return (result.get("site") or {}).get("label", "this machine")


def processes(mode, workers):
    """The worker processes `mode` runs for W = workers (each on a slot of its own)."""
    return workers + 1 if mode == "ps-sync-backup" else workers


def applied_images_per_sec(summary):
    """Images whose gradients reached the weights, per second: ring applies
    every image; PS modes are measured by the chief from the global step
    (dropped stale gradients do not count)."""
    applied = summary.get("applied_images_per_sec")
    return summary["images_per_sec"] if applied is None else applied


