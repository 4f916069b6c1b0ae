"""`ringtrain-bench scaling`: ring against PS, each configuration run through
its real launcher, one table row per (mode, N, P): on this machine, on the
hosts of a hostfile, or on simulated clusters whose links the bench shapes
itself (`--cluster H --link-rate R1,R2`). Rows: bench/scaling_rows.py; the
report: bench/scaling_report.py; columns: bench/COLUMNS.md."""
import json
import os
import sys

from ringtrain.bench import allreduce, bench_modes, launch, sites, tables
from ringtrain.bench.environment import describe, usable_cores
from ringtrain.bench.scaling_report import write, write_links
from ringtrain.bench.scaling_rows import build, per_worker_batch
from ringtrain.workloads.catalog import simulated_step_ms

MODES = bench_modes.scaling_modes()
# The α-β fit of a link, plus the model's gradient size: a line from 1 MB up, where the
# link's rate sets the time, and one below (stats.fit_lines), where each hop's
# latency does; a step's small all-reduces (biases, the last group) are priced on the
# slower of the two. (Below 1 MB a message may also pass within a token bucket's burst,
# faster than the link's rate: the first line alone would then price it.)
LINK_FIT_SIZES = "64K,256K,1M,4M,16M"
# The link fit's allreduce timings behind each family of rows' α-β fit: OpenMPI's ring, Horovod
# over Gloo, TF's own ring (the gRPC push and pull for PS is a fit of its own)
LINK_FIT_IMPLS = {"ring": "mpi-ring", "gloo": allreduce.GLOO_FIT_IMPL, "tf": allreduce.TF_FIT_IMPL}


def ps_counts(cfg, workers):
    """The PS task counts to run at N workers: numbers, or N (one per worker host)."""
    return sorted({workers if p == "N" else int(p) for p in cfg["num_ps"]})


def configurations(cfg, across_hosts, hosts_share_cores=False):
    """(mode, N, P) of every run; `independent` (N trainers exchanging nothing)
    is every row's compute baseline where the workers share this machine's
    cores: on one machine, and on a simulated cluster, whose hosts are this
    machine (the N trainers run on its first host; they need no link). Across
    real hosts it is the same mode at N = 1, where nothing crosses a wire."""
    modes = list(cfg["modes"])
    if across_hosts:
        modes = [m for m in modes if not bench_modes.one_machine(m)]
    if (hosts_share_cores or not across_hosts) and bench_modes.INDEPENDENT not in modes:
        modes.append(bench_modes.INDEPENDENT)
    out = []
    for n in cfg["np"]:
        for mode in modes:
            for p in (ps_counts(cfg, n) if mode.startswith("ps-") else [0]):
                if (mode, n, p) not in out:
                    out.append((mode, n, p))
    return out


def simulated_ms(cfg, site):
    """The accelerator step each trainer waits (times the dilation), or None."""
    ms = simulated_step_ms(cfg["model"], cfg.get("simulate_gpu_ms"))
    return ms * site.dilation if ms else None


def training_flags(cfg, batch, site):
    flags = ["--model", cfg["model"], "--data", cfg["data"], "--batch-size", str(batch),
             "--steps", str(cfg["steps"]), "--threads", str(cfg["threads"]),
             "--warmup-steps", str(cfg.get("warmup_steps", 3)), "--optimizer", cfg.get("optimizer", "adam"),
             "--log-every", str(max(1, cfg["steps"] // 4))]
    ms = simulated_ms(cfg, site)
    if ms:
        flags += ["--simulate-gpu", f"{ms:g}"]
    return flags + (["--data-dir", cfg["data_dir"]] if cfg.get("data_dir") else [])


def command(mode, workers, num_ps, cfg, batch, summary, site, workdir):
    """The launcher command for one configuration, as an argument list: the
    registered mode's launcher (ringtrain/modes.py), with the words that select it."""
    train = training_flags(cfg, batch, site)
    if mode == bench_modes.INDEPENDENT:  # the machine's ceiling: N single-rank trainers, no launcher
        return [sys.executable, "-m", "ringtrain.bench.independent", "--np", str(workers),
                "--summary-json", summary, "--", launch.tool("ringtrain")] + train
    registered = bench_modes.registered(mode)
    train = list(registered.words) + train + ["--summary-json", summary]
    if registered.launcher == "ps-baseline towers":  # one process, a tower per (logical) device
        return [launch.tool("ps-baseline"), "towers", "--towers", str(workers)] + train
    if registered.launcher == "ps-baseline launch":
        placement = ["--hostfile", site.write_hostfile(workers, os.path.join(workdir, f"hosts-n{workers}"))] \
            if site.across_hosts else []
        return [launch.tool("ps-baseline"), "launch", *placement, "--num-ps", str(num_ps),
                "--num-workers", str(workers), "--placement", cfg.get("placement", "round_robin")] + train
    assert registered.launcher == "mpirun", f"the bench does not start {registered.launcher} yet"
    trainer = [launch.tool("ringtrain")] + train + (horovod_knobs(mode, cfg) if bench_modes.is_ring(mode) else [])
    if bench_modes.all_reduces(mode) and cfg.get("bucket_mb") is not None:  # Horovod's ring or TF's
        trainer += ["--bucket-mb", f"{cfg['bucket_mb']:g}"]
    hosts = site.host_list(workers) if site.across_hosts else None
    if mode == "ring-gloo":
        return launch.horovodrun(workers, trainer, gloo=True, hosts=hosts)
    # plain mpirun: the same ranks as horovodrun's, without its launcher's own start-up
    return launch.mpirun(workers, trainer, usable_cores(), hosts=hosts)


def horovod_knobs(mode, cfg):
    """Horovod's cycle and fusion buffer as the run sets them, its background loop and data path."""
    extra = []
    for flag, key in (("--cycle-time-ms", "cycle_time_ms"), ("--fusion-threshold-mb", "fusion_threshold_mb")):
        if cfg.get(key) is not None:
            extra += [flag, f"{cfg[key]:g}"]
    if mode == "ring-mpi":
        extra += ["--cpu-operations", "mpi"]
    return extra + ["--horovod-loop", "upstream" if mode == "ring-upstream" else "event"]


def run_one(mode, workers, num_ps, cfg, out_dir, site, log, round_=0):
    tag = f"{mode}-n{workers}" + (f"-p{num_ps}" if num_ps else "") + f"-r{round_ + 1}"
    return run_tagged(tag, lambda summary, runs: command(mode, workers, num_ps, cfg, per_worker_batch(cfg, workers),
                                                         summary, site, runs), out_dir, site, cfg["timeout"], log)


def run_tagged(tag, make_command, out_dir, site, timeout, log):
    """Run make_command(summary path, runs folder) as OUT/runs/TAG.{json,log};
    returns its summary, or raises RuntimeError with the log's last lines."""
    runs = os.path.join(out_dir, "runs")
    os.makedirs(runs, exist_ok=True)
    summary, logf = os.path.join(runs, f"{tag}.json"), os.path.join(runs, f"{tag}.log")
    if os.path.exists(summary):
        os.remove(summary)
    cmd = make_command(summary, runs)
    log(f"ringtrain-bench: {tag}: {' '.join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd))}")
    rc = launch.run(site.enter(cmd), logf, timeout)
    if rc != 0 or not os.path.exists(summary):
        raise RuntimeError(f"{tag} failed (exit {rc}); last lines of {logf}:\n{launch.tail(logf)}")
    with open(summary) as f:
        result = json.load(f)
    result["_summary_json"], result["_log"] = summary, logf
    return result


def load_alpha_beta(path):
    """{"ring", "gloo", "tf", "ps": fit} from an allreduce.json, if there is one:
    the fits of Horovod's allreduce over MPI and over Gloo, TF's collective one
    and the gRPC push/pull."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        ar = json.load(f)
    fits, used = ar.get("alpha_beta", {}), {"ring": "alpha_beta_used_for_predictions",
                                             "tf": "alpha_beta_used_for_tf_predictions",
                                             "ps": "alpha_beta_used_for_ps_predictions"}
    return dict({family: fits.get(ar.get(key)) for family, key in used.items()},
                gloo=fits.get(allreduce.GLOO_FIT_IMPL))


def fit_links(cfg, out_dir, site, log):
    """α and β of these hosts' links: OpenMPI's ring allreduce across them (at
    every N of the run, at least 2); where the run has a Horovod ring, Horovod's
    allreduce over Gloo, which carries ring mode's gradients across hosts
    (--cpu-operations auto) and ring-gloo's; TF's own ring where the run has
    TF's collective mode; and a gRPC push and pull between two of them."""
    ranks = sorted({max(n, 2) for n in cfg["np"]})
    result = allreduce.run(ranks, tables.parse_sizes(LINK_FIT_SIZES), os.path.join(out_dir, "link-fit"),
                           model=cfg["model"], trials=2, warmup=1, horovod=False, timeout=cfg["timeout"],
                           gloo=any(bench_modes.is_ring(mode) for mode in cfg["modes"]),
                           site=site, mpi_algorithms=["ring"], log=log, tf="tf-collective" in cfg["modes"])

    def fits_of(impl):  # {"N": fit at N ranks, "all": over every N}
        return {key.partition("@")[2] or "all": fit for key, fit in result["alpha_beta"].items()
                if key.partition("@")[0] == impl} or None
    return dict({family: fits_of(impl) for family, impl in LINK_FIT_IMPLS.items()},
                ps=result["alpha_beta"].get(allreduce.PS_FIT_IMPL))


def run(cfg, out_dir, log=print, site=None):
    """Every (mode, N, P) run on one site, then the table, CSV, JSON and plots."""
    site = site or sites.this_machine()
    os.makedirs(os.path.join(out_dir, "runs"), exist_ok=True)
    environment = describe(threads_per_worker=cfg["threads"], hostfile=site.label)  # load before our runs
    fits = fit_links(cfg, out_dir, site, log) if site.across_hosts else load_alpha_beta(cfg.get("alpha_beta_json"))
    summaries = {}
    # Rounds: every configuration once per round, so that a slow spell on a
    # shared machine hits one round of all of them, not all runs of one.
    for r in range(cfg.get("repeats", 1)):
        for mode, n, p in configurations(cfg, site.across_hosts, hosts_share_cores(site)):
            summaries.setdefault((mode, n, p), []).append(run_one(mode, n, p, cfg, out_dir, site, log, round_=r))
    result = build(summaries, cfg, fits.get("ring"), fits.get("ps"), site=site_facts(site, cfg),
                   environment=environment, tf_fit=fits.get("tf"), gloo_fit=fits.get("gloo"))
    result["environment"]["load_average_at_end"] = list(os.getloadavg())
    write(result, out_dir)
    return result


def hosts_share_cores(site):
    """A simulated cluster: every host is this machine."""
    return site.cluster is not None


def site_facts(site, cfg):
    return {"label": site.label, "across_hosts": site.across_hosts, "link_rate": site.link_rate,
            "dilation": site.dilation, "hosts": len(site.hosts) or 1,
            "hosts_share_cores": hosts_share_cores(site),
            "simulated_gpu_ms": simulated_step_ms(cfg["model"], cfg.get("simulate_gpu_ms"))}


def link_folder(rate, dilation):
    """The folder of one link rate's results in a --cluster run: 1gbit, 10gbit-dilated10."""
    return rate + (f"-dilated{dilation:g}" if dilation != 1 else "")


def run_links(cfg, out_dir, hosts, link_rates, dilations, log=print):
    """The scaling bench on a simulated cluster of `hosts` hosts, once per link
    rate (each shaped at rate / dilation), into OUT/RATE/, and one report,
    OUT/scaling.md, over every rate measured into OUT (earlier runs' too)."""
    for rate, dilation in zip(link_rates, dilations):
        label = link_folder(rate, dilation)
        with sites.simulated(hosts, rate, dilation, log=log) as site:
            run(cfg, os.path.join(out_dir, label), log, site)
    return write_links(out_dir)
