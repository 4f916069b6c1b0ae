"""ringtrain-bench: tables, CSV, JSON and plots from recorded summaries, and
tiny end-to-end runs through the real launchers."""
import html
import json
import os
import re

import matplotlib.image
import pytest

from ringtrain.bench import expectations, scaling_report, stats, tables
from ringtrain.bench.launch import child_env
from ringtrain.bench.scaling_rows import build
from helpers import BENCH, REPO, assert_one_line_error, generated_code, run, run_bench
from ringtrain.workloads.gradients import ring_buckets, tf_buckets



def summary(mode, n, per_worker_rate, step_sec, num_ps=None, total=None):
    """A launcher summary as the ring and PS launchers write it; `total` is
    the launcher's measured images_per_sec (default: N x the per-worker rate)."""
    s = {"mode": mode, "world_size": n, "steps": 50,
         "images_per_sec": per_worker_rate * n if total is None else total,
         "images_per_sec_per_worker": [per_worker_rate] * n,
         "window_images_per_sec": [[per_worker_rate * f for f in (0.97, 1.0, 1.03, 1.0)]] * n,
         "step_time_sec": [step_sec] * n, "timed_samples": 64 * 47 * n, "timed_seconds": 3.0,
         "wall_time_sec": 9.0, "train_loss": 0.5, "test_accuracy": 0.8, "config": {}}
    if num_ps:
        s.update(num_ps=num_ps, ps_bytes=[GRADIENT_BYTES // num_ps] * num_ps, staleness_mean=0.5, staleness_max=2)
    if mode.startswith("ring"):
        s.update(gradient_bytes=GRADIENT_BYTES, allreduce_algorithm="mpi ring")
    return s


GRADIENT_BYTES = 4_800_000
CFG = {"modes": ["ring", "ps-sync", "ps-async"], "np": [1, 2], "model": "mnist_cnn",
       "data": "synthetic", "batch_size": 64, "scaling": "weak", "global_batch": None,
       "steps": 50, "num_ps": ["1"], "threads": 1, "timeout": 60, "cores": 2,
       "environment": {"cores": 2, "cpu_model": "test"},
       "layer_bytes": [1280, 73984, 4719104, 5160]}  # mnist_cnn's layers, forward order
FIT = {"alpha_sec": 50e-6, "beta_sec_per_byte": 1 / 3e9, "bandwidth_gb_per_sec": 3.0}
PS_FIT = {"alpha_sec": 300e-6, "beta_sec_per_byte": 1 / 1e9, "bandwidth_gb_per_sec": 1.0}


# backprop makes mnist_cnn's first layer's gradients last: their allreduce (at the fit's 50 us, 3 GB/s,
# 2 ranks) starts when the backward pass ends, and shows; the rest hides behind it
RING_AB_MS = 64.5 + 1e3 * stats.ring_allreduce_seconds(1280 * GRADIENT_BYTES / 4_799_528, 2, 50e-6, 1 / 3e9)


def recorded_result():
    summaries = {("ring", 1, 0): summary("ring", 1, 1000, 0.064), ("ring", 2, 0): summary("ring", 2, 950, 0.067),
                 ("ps-sync", 1, 1): summary("ps-sync", 1, 800, 0.080, 1),
                 ("ps-sync", 2, 1): summary("ps-sync", 2, 600, 0.106, 1),
                 ("ps-async", 1, 1): summary("ps-async", 1, 850, 0.075, 1),
                 ("ps-async", 2, 1): summary("ps-async", 2, 700, 0.091, 1)}
    summaries.update({("independent", 1, 0): summary("independent", 1, 1010, 0.063),
                      ("independent", 2, 0): summary("independent", 2, 990, 0.0645)})
    return build({k: [v] for k, v in summaries.items()}, CFG, FIT, PS_FIT)


def test_rounds_give_the_median_run_and_the_median_per_round_efficiency():
    # round 2 ran on a loaded machine: N=1 and N=2 both slow, their ratio still good
    ring1 = [summary("ring", 1, 1000, 0.064), summary("ring", 1, 500, 0.128), summary("ring", 1, 900, 0.07)]
    ring2 = [summary("ring", 2, 950, 0.067), summary("ring", 2, 480, 0.133), summary("ring", 2, 700, 0.09)]
    rows = {r["workers"]: r for r in build({("ring", 1, 0): ring1, ("ring", 2, 0): ring2},
                                           dict(CFG, modes=["ring"]), FIT)["rows"]}
    per_round = sorted(b["images_per_sec"] / a["images_per_sec"] for a, b in zip(ring1, ring2))
    assert rows[2]["rounds"] == 3
    assert rows[2]["speedup"] == pytest.approx(per_round[1])
    assert rows[2]["efficiency_min"] == pytest.approx(per_round[0] / 2)
    assert rows[2]["efficiency_max"] == pytest.approx(per_round[2] / 2)
    assert rows[2]["total_images_per_sec"] == pytest.approx(sorted(s["images_per_sec"] for s in ring2)[1])
    # the table shows the median efficiency and the range over rounds
    low, median, high = (100 * r / 2 for r in per_round)
    assert scaling_report.efficiency_text(rows[2]) == f"{median:.0f}% ({low:.0f}–{high:.0f})"


def test_share_of_the_independent_ceiling_is_taken_round_by_round():
    ring2 = [summary("ring", 2, 900, 0.07), summary("ring", 2, 400, 0.16)]
    independent2 = [summary("independent", 2, 1000, 0.064), summary("independent", 2, 500, 0.128)]
    runs = {("ring", 2, 0): ring2, ("independent", 2, 0): independent2}
    rows = {r["mode"]: r for r in build(runs, dict(CFG, modes=["ring", "independent"]), FIT)["rows"]}
    assert rows["ring"]["fraction_of_independent"] == pytest.approx(0.85)  # median of 0.9 and 0.8
    assert rows["independent"]["fraction_of_independent"] == pytest.approx(1.0)
    assert rows["independent"]["compute_time_ms"] is None


def test_speedup_and_efficiency_are_against_the_same_mode_at_one_worker():
    rows = {(r["mode"], r["workers"]): r for r in recorded_result()["rows"]}
    ring1, ring2 = rows[("ring", 1)], rows[("ring", 2)]
    assert ring2["speedup"] == pytest.approx(ring2["total_images_per_sec"] / ring1["total_images_per_sec"])
    assert ring2["efficiency"] == pytest.approx(ring2["speedup"] / 2)
    ps1, ps2 = rows[("ps-sync", 1)], rows[("ps-sync", 2)]
    assert ps2["efficiency"] == pytest.approx(ps2["total_images_per_sec"] / (2 * ps1["total_images_per_sec"]))


def test_total_is_the_launchers_measured_total_not_the_per_worker_rate_times_n():
    # Both workers' windows average 1000 img/s, but one worker also stalled between
    # windows: the launcher measured 1500 img/s in all, and that is the total.
    runs = {("ring", 1, 0): [summary("ring", 1, 1000, 0.064)],
            ("ring", 2, 0): [summary("ring", 2, 1000, 0.064, total=1500.0)]}
    rows = {r["workers"]: r for r in build(runs, dict(CFG, modes=["ring"]), FIT)["rows"]}
    assert rows[2]["per_worker_images_per_sec_mean"] == pytest.approx(1000)
    assert rows[2]["total_images_per_sec"] == 1500.0
    assert rows[2]["efficiency"] == pytest.approx(0.75)


def test_exposed_communication_is_step_minus_independent_trainers_step():
    rows = {(r["mode"], r["workers"]): r for r in recorded_result()["rows"]}
    assert rows[("ring", 2)]["exposed_comm_ms"] == pytest.approx(67.0 - 64.5)
    assert rows[("ps-sync", 2)]["compute_time_ms"] == pytest.approx(64.5)


def test_on_hosts_that_share_this_machines_cores_the_compute_is_independent_trainers_at_the_same_n():
    """At N = 4 on a simulated cluster (4 hosts, 2 cores), the N = 1 step is no bound: the
    N trainers' compute contends for the cores. Across hosts of their own, the mode at N = 1."""
    from ringtrain.bench import scaling
    runs = {("ring", 1, 0): [summary("ring", 1, 1000, 0.050)], ("ring", 4, 0): [summary("ring", 4, 700, 0.090)],
            ("independent", 1, 0): [summary("independent", 1, 1000, 0.051)],
            ("independent", 4, 0): [summary("independent", 4, 750, 0.080)]}
    site = {"label": "s", "across_hosts": True, "link_rate": "1gbit", "dilation": 1.0, "hosts": 4}
    for shares, compute in ((True, 80.0), (False, 50.0)):
        rows = {(r["mode"], r["workers"]): r for r in build(runs, dict(CFG, modes=["ring"]), FIT,
                                                                site=dict(site, hosts_share_cores=shares))["rows"]}
        assert rows[("ring", 4)]["compute_time_ms"] == pytest.approx(compute)
    cfg = dict(CFG, modes=["ring"], np=[1, 4], num_ps=["1"])
    assert ("independent", 4, 0) in scaling.configurations(cfg, across_hosts=True, hosts_share_cores=True)
    assert ("independent", 4, 0) not in scaling.configurations(cfg, across_hosts=True)


def test_where_compute_shares_the_cores_the_exchanges_kernel_cpu_comes_out_of_the_step():
    """On a simulated cluster the hosts' network stacks run on the cores that compute: the kernel
    CPU a step beyond the independent trainers', over the cores, is added to α-β's step. With a
    simulated accelerator, whose cores idle, or hosts of their own, it is not."""
    def kernel(s, pct):
        s["cpu_pct_of_core"] = [{"horovod_thread": None, "other_threads": 90.0, "host_kernel": pct}] * s["world_size"]
        return s
    runs = {("ring", 1, 0): [kernel(summary("ring", 1, 1000, 0.050), 1.0)],
            ("ring", 2, 0): [kernel(summary("ring", 2, 900, 0.080), 25.0)],
            ("independent", 1, 0): [kernel(summary("independent", 1, 1000, 0.050), 1.0)],
            ("independent", 2, 0): [kernel(summary("independent", 2, 950, 0.060), 2.0)]}
    site = {"label": "s", "across_hosts": True, "link_rate": "1gbit", "dilation": 1.0, "hosts": 2,
            "hosts_share_cores": True}
    rows = {(r["mode"], r["workers"]): r for r in build(runs, dict(CFG, modes=["ring"]), FIT, site=site)["rows"]}
    ring = rows[("ring", 2)]
    # 25 % of a core over an 80 ms step, less 2 % over the trainers' 60 ms: 18.8 ms of CPU, 9.4 ms of step on 2 cores
    assert ring["cpu_host_kernel_pct"] == pytest.approx(25.0)
    assert ring["exchange_kernel_cpu_ms"] == pytest.approx(20.0 - 1.2)
    assert ring["kernel_on_compute_ms"] == pytest.approx(18.8 / 2)
    assert ring["predicted_with_kernel_ms"] == pytest.approx(ring["predicted_step_time_ms"] + 9.4)
    assert ring["error_with_kernel_pct"] == pytest.approx(100 * (ring["predicted_with_kernel_ms"] - 80) / 80)
    assert rows[("independent", 2)]["exchange_kernel_cpu_ms"] is None
    found = scaling_report.markdown(build(runs, dict(CFG, modes=["ring"]), FIT, site=site))
    assert "ran on the cores that compute: up to 18.8 ms of CPU a step (ring N=2 at 1gbit), 9.4 ms of step" in found
    for elsewhere in (dict(site, simulated_gpu_ms=40.0), dict(site, hosts_share_cores=False)):
        ring = next(r for r in build(runs, dict(CFG, modes=["ring"]), FIT, site=elsewhere)["rows"]
                    if (r["mode"], r["workers"]) == ("ring", 2))
        assert ring["kernel_on_compute_ms"] is None and ring["error_with_kernel_pct"] is None


def test_the_host_kernels_cpu_is_read_with_the_threads():
    import time
    from ringtrain.workloads import threadcpu
    read = threadcpu.SplitReader()
    start, t0, own = read(), time.monotonic(), os.times().system
    with open(os.devnull, "wb", buffering=0) as sink:  # system time: writes until this process has 0.2 s of it
        while os.times().system - own < 0.2 and time.monotonic() - t0 < 60:
            for _ in range(1000):
                sink.write(b"x")
    seconds, own = time.monotonic() - t0, os.times().system - own
    pct = threadcpu.percent_of_a_core(start, read(), seconds)
    assert own >= 0.2
    # the host's kernel time holds this process's own (the two are sampled apart: half of it), and fits in its cores
    assert 0.5 * own <= pct["host_kernel"] / 100 * seconds <= os.cpu_count() * seconds + 0.05


def test_alpha_beta_prediction_adds_what_the_exchange_does_not_hide():
    rows = {(r["mode"], r["workers"]): r for r in recorded_result()["rows"]}
    # 1.7 ms of allreduce hides behind 43 ms of backward (2/3 of the 64.5 ms compute), but for the first layer's
    assert rows[("ring", 2)]["predicted_step_time_ms"] == pytest.approx(RING_AB_MS)
    # two workers push into one PS: 9.6 MB one way on its link, 9.6 ms, hidden by backward but not by forward
    one_way = 2 * 4_800_000 / 1e9
    ps = 0.0645 + 2 * 300e-6 + max(0, one_way - 0.0645 * 2 / 3) + max(0, one_way - 0.0645 / 3)
    assert rows[("ps-sync", 2)]["predicted_step_time_ms"] == pytest.approx(1e3 * ps)
    assert rows[("ring", 1)]["predicted_comm_ms"] == 0.0


def test_tf_collective_hides_nothing_behind_backprop_and_is_set_against_horovod():
    summaries = {(mode, n, 0): [summary(mode, n, rate, step)] for mode, n, rate, step in (
        ("ring", 1, 1000, 0.064), ("ring", 2, 950, 0.067), ("tf-collective", 1, 900, 0.070),
        ("tf-collective", 2, 760, 0.084), ("independent", 1, 1010, 0.063), ("independent", 2, 990, 0.0645))}
    for s in summaries[("tf-collective", 2, 0)] + summaries[("tf-collective", 1, 0)]:
        s.update(gradient_bytes=GRADIENT_BYTES, allreduce_algorithm="tf ring")
    result = build(summaries, dict(CFG, modes=["ring", "tf-collective"]), FIT)
    rows = {(r["mode"], r["workers"]): r for r in result["rows"]}
    # its one packed all-reduce (2 x 50 us + 4.8 MB at 3 GB/s = 1.7 ms) starts after backprop: all of it shows
    assert rows[("tf-collective", 2)]["predicted_step_time_ms"] == pytest.approx(64.5 + 1.7)
    assert rows[("ring", 2)]["predicted_step_time_ms"] == pytest.approx(RING_AB_MS)
    assert rows[("tf-collective", 2)]["algorithm"] == "tf ring"
    (what, measured), = scaling_report.horovod_against_tf(result)[1:]
    assert what == "N=2: Horovod img/s ÷ TF collective img/s"
    assert measured.startswith(f"measured {1900 / 1520:.2f}x, α-β says {66.2 / RING_AB_MS:.2f}x")
    # with TF's own fit (its ring measured alone: 500 us a step, 0.4 GB/s), its rows use that one
    tf_fit = {"alpha_sec": 500e-6, "beta_sec_per_byte": 1 / 0.4e9, "bandwidth_gb_per_sec": 0.4}
    result = build(summaries, dict(CFG, modes=["ring", "tf-collective"]), FIT, tf_fit=tf_fit)
    rows = {(r["mode"], r["workers"]): r for r in result["rows"]}
    assert rows[("tf-collective", 2)]["predicted_step_time_ms"] == pytest.approx(64.5 + 1.0 + 12.0)
    assert rows[("ring", 2)]["predicted_step_time_ms"] == pytest.approx(RING_AB_MS)
    assert "TF collective rows: TF's own ring all-reduce (tf-ring): α = 500.0 us" in scaling_report.markdown(result)
    # TF's rows alone (`--modes tf-collective`): the model's layers are read for them too
    alone = {key: runs for key, runs in summaries.items() if key[0] != "ring"}
    cfg = dict({k: v for k, v in CFG.items() if k != "layer_bytes"}, modes=["tf-collective"])
    rows = {(r["mode"], r["workers"]): r for r in build(alone, cfg, FIT, tf_fit=tf_fit)["rows"]}
    assert rows[("tf-collective", 2)]["predicted_step_time_ms"] == pytest.approx(64.5 + 1.0 + 12.0)
    # the predicted ratio (77.5 / 64.6) is the overlap (66.2 / 64.6: TF's exchange, here a run before its
    # buckets: one all-reduce after backprop, on Horovod's fit) times the transport (77.5 / 66.2: TF's ring
    # against the fit Horovod's rows use)
    (_, measured), = scaling_report.horovod_against_tf(result)[1:]
    assert (f"α-β says {77.5 / RING_AB_MS:.2f}x = {66.2 / RING_AB_MS:.2f}x overlap (what of each exchange outlasts "
            f"backprop: Horovod's buckets and fusion, TF's buckets in order) × {77.5 / 66.2:.2f}x transport (TF's ring "
            "400.0 MB/s, OpenMPI's 3000.0 MB/s)") in measured
    # in 1 MB buckets (here: the model's 4.8 MB spread over its layers) more of TF's exchange hides
    for s in summaries[("tf-collective", 2, 0)]:
        s["bucket_mb"] = 1
    rows = {(r["mode"], r["workers"]): r for r in build(summaries, dict(CFG, modes=["ring", "tf-collective"]), FIT,
                                                         tf_fit=tf_fit)["rows"]}
    assert rows[("tf-collective", 2)]["predicted_step_on_horovod_fit_ms"] < 66.2 - 0.1
    # ring mode's buckets (its summary's bucket_mb): in 0.5 MB ones mnist_cnn's small layers wait for
    # backprop's end and go in one allreduce; more of it shows than with Horovod's fusion alone
    for s in summaries[("ring", 2, 0)]:
        s["bucket_mb"] = 0.5
    rows = {(r["mode"], r["workers"]): r for r in build(summaries, dict(CFG, modes=["ring", "tf-collective"]),
                                                         FIT)["rows"]}
    small = sum(CFG["layer_bytes"][i] for i in (0, 1, 3)) * GRADIENT_BYTES / sum(CFG["layer_bytes"])
    assert rows[("ring", 2)]["predicted_step_time_ms"] == pytest.approx(
        64.5 + 1e3 * stats.ring_allreduce_seconds(small, 2, 50e-6, 1 / 3e9))


def test_ring_rows_that_gloo_carried_are_priced_with_horovods_allreduce_over_gloo():
    """Across hosts Gloo carries ring mode's gradients (--cpu-operations auto): where the link fit has
    Horovod over Gloo, those rows, and TF's exchange set beside them, are priced with it; a ring row
    that OpenMPI carried keeps OpenMPI's fit."""
    summaries = {(mode, n, 0): [summary(mode, n, rate, step)] for mode, n, rate, step in (
        ("ring", 1, 1000, 0.064), ("ring", 2, 950, 0.067), ("tf-collective", 1, 900, 0.070),
        ("tf-collective", 2, 760, 0.084), ("independent", 1, 1010, 0.063), ("independent", 2, 990, 0.0645))}
    for s in summaries[("tf-collective", 2, 0)] + summaries[("tf-collective", 1, 0)]:
        s.update(gradient_bytes=GRADIENT_BYTES, allreduce_algorithm="tf ring")
    summaries[("ring", 2, 0)][0]["allreduce_algorithm"] = "gloo ring"
    gloo = {"alpha_sec": 80e-6, "beta_sec_per_byte": 1 / 0.3e9, "bandwidth_gb_per_sec": 0.3}
    tf_fit = {"alpha_sec": 500e-6, "beta_sec_per_byte": 1 / 0.4e9, "bandwidth_gb_per_sec": 0.4}
    cfg = dict(CFG, modes=["ring", "tf-collective"])
    step = lambda result, mode, key="predicted_step_time_ms": next(r[key] for r in result["rows"]
                                                                   if (r["mode"], r["workers"]) == (mode, 2))
    result = build(summaries, cfg, FIT, tf_fit=tf_fit, gloo_fit=gloo)
    on_gloo = build(summaries, cfg, gloo, tf_fit=tf_fit)  # (every Horovod row priced with Gloo's fit)
    assert step(result, "ring") == pytest.approx(step(on_gloo, "ring")) != pytest.approx(RING_AB_MS)
    assert step(result, "tf-collective", "predicted_step_on_horovod_fit_ms") == \
        pytest.approx(step(on_gloo, "tf-collective", "predicted_step_on_horovod_fit_ms"))
    assert result["alpha_beta_gloo"] == gloo
    text = scaling_report.markdown(result)
    assert "ring rows whose gradients Gloo carried: Horovod's allreduce over Gloo (horovod-gloo): α = 80.0 us, " \
        "1/β = 300.0 MB/s" in text
    assert "transport (TF's ring 400.0 MB/s, Gloo's 300.0 MB/s)" in text
    # the same row carried by OpenMPI: OpenMPI's fit, as before
    summaries[("ring", 2, 0)][0]["allreduce_algorithm"] = "mpi ring"
    assert step(build(summaries, cfg, FIT, tf_fit=tf_fit, gloo_fit=gloo), "ring") == pytest.approx(RING_AB_MS)


def test_the_allreduces_follow_backprop_and_only_what_outlasts_it_shows():
    one_byte_a_ms = lambda nbytes: nbytes * 1e-3  # an allreduce: 1 ms a byte
    # two layers, backward 1 s: the last layer's gradients are ready at 0.5 s and sent by 0.6 s; the first
    # layer's, ready at 1 s, are sent after backprop: their 0.1 s shows
    got = stats.backprop_exchange(1.0, [100, 100], one_byte_a_ms)
    assert got == {"exchange": pytest.approx(0.2), "exposed": pytest.approx(0.1), "allreduces": 2}
    assert stats.ring_step_seconds(1.5, 1.0, [100, 100], one_byte_a_ms) == pytest.approx(1.6)
    # a link slower than backprop: the first two layers' gradients become ready while the last layer's
    # (sent from 1/3 s, for 0.9 s) are on the wire, and go together, fused, for another 0.9 s
    got = stats.backprop_exchange(1.0, [450, 450, 900], one_byte_a_ms)
    assert got == {"exchange": pytest.approx(1.8), "exposed": pytest.approx(1 / 3 + 1.8 - 1.0), "allreduces": 2}
    # with backward = 0 (one packed all-reduce after backprop) nothing hides
    assert stats.ring_step_seconds(1.5, 0.0, [300], one_byte_a_ms) == pytest.approx(1.8)
    # TF's buckets, last layers first, a new one once the last holds more than the bucket size, the first
    # layers' (up to last_bytes: 1 MB, or a bucket if less) in a last bucket of their own; 0: one
    # all-reduce once backprop ends.
    # 100 bytes: each layer's own, sent at 1/3, 2/3 and 1 s: 0.3 s shows. 400 bytes: [300, 300] ready at
    # 2/3 s, sent by 1.267 s, then [300]: 0.567 s shows. Gradients that fit one bucket stay in one
    assert tf_buckets([300, 300, 300], 0) == [[2, 1, 0]]
    assert tf_buckets([300, 300, 300], 400) == [[2, 1], [0]]
    assert tf_buckets([300, 300, 300], 900, last_bytes=300) == [[2, 1, 0]]
    assert tf_buckets([50, 50, 300, 300, 400], 600, last_bytes=100) == [[4, 3], [2], [1, 0]]
    assert tf_buckets([50, 50, 300, 300, 400], 600, last_bytes=0) == [[4, 3], [2, 1, 0]]
    mb = 2**20  # by default the first layers' 1 MB at most, alone
    assert tf_buckets([mb // 2, mb // 2, mb, 8 * mb, 12 * mb], 16 * mb) == [[4, 3], [2], [1, 0]]
    for bucket, shows in [(0, 0.9), (100, 0.3), (400, 2 / 3 + 0.9 - 1.0)]:
        got = stats.exchange_in_buckets(1.0, [300, 300, 300], tf_buckets([300, 300, 300], bucket), one_byte_a_ms)
        assert got == {"exchange": pytest.approx(0.9), "exposed": pytest.approx(shows),
                       "allreduces": {0: 1, 100: 3, 400: 2}[bucket]}
    # ring mode's buckets, in order: [300] alone (>= 250), then [100, 200] together once backprop has made
    # the first layer's (1 s): 0.3 + 0.3 s of allreduce, the second from 1 s, so 0.3 s shows
    buckets = ring_buckets([100, 200, 300], 250)
    assert buckets == [[2], [1, 0]]
    got = stats.exchange_in_buckets(1.0, [100, 200, 300], buckets, one_byte_a_ms)
    assert got == {"exchange": pytest.approx(0.6), "exposed": pytest.approx(0.3), "allreduces": 2}
    # a bucket that never fills waits for backprop's end; a large layer made before it goes first,
    # from 2/3 s to 0.967 s, and the small ones' 0.15 s shows
    buckets = ring_buckets([100, 300, 50], 250)
    assert buckets == [[2, 0], [1]]
    got = stats.exchange_in_buckets(1.0, [100, 300, 50], buckets, one_byte_a_ms)
    assert got == {"exchange": pytest.approx(0.45), "exposed": pytest.approx(0.15), "allreduces": 2}
    # a ring of n ranks takes 2(n-1) steps (latency), and each rank sends 2(n-1)/n of the buffer
    assert stats.ring_allreduce_seconds(0, 4, 1e-3, 0) == pytest.approx(6e-3)
    assert stats.ring_allreduce_seconds(4_000_000, 4, 0, 1e-9) == pytest.approx(6e-3)  # 6 MB sent at 1 GB/s


def test_ps_streams_share_the_busiest_link_and_only_remote_bytes_cross_a_wire():
    # 4 workers on 4 hosts, one PS beside worker 0: its link carries 3 workers' pushes, then pulls
    workers, ps = ["h1", "h2", "h3", "h4"], ["h1"]
    step = stats.ps_step_seconds(1.0, forward=0.3, backward=0.6, worker_hosts=workers, ps_hosts=ps,
                                 ps_bytes=[100], alpha=0.1, beta=0.01)
    assert step == pytest.approx(1.0 + 0.2 + (3 - 0.6) + (3 - 0.3))
    assert stats.ps_wire_bytes(workers, ps, [100]) == [0, 200, 200, 200]
    # async: each remote worker's own 100 B take 1 s each way, but a round of the 3 cannot
    # beat 3 s on the PS's link; h1's worker, beside the PS, uses no link
    async_step = stats.ps_step_seconds(1.0, 0.3, 0.6, workers, ps, [100], 0.1, 0.01, sync=False)
    own = 1.0 + 0.2 + (1 - 0.6) + (1 - 0.3)
    assert async_step == pytest.approx((1.0 + 3 * max(own, 3 + 0.2)) / 4)
    # one PS per host: each link carries 3 of the 4 shares, both ways (the bandwidth-optimal case)
    assert stats.ps_step_seconds(0.0, 0.0, 0.0, workers, workers, [25] * 4, 0.0, 0.01) == pytest.approx(2 * 0.75)
    assert stats.ps_wire_bytes(workers, workers, [25] * 4) == [2 * 3 * 25] * 4
    # ring: 2(n-1)/n of the buffer from each rank to the next; same-host neighbours stay off the wire
    assert stats.ring_wire_bytes(["h1", "h2", "h3", "h4"], 100) == pytest.approx(4 * 1.5 * 100)
    assert stats.ring_wire_bytes(["h1", "h1", "h2", "h2"], 100) == pytest.approx(2 * 1.5 * 100)


def test_wire_bytes_per_step_count_each_host_once_over_its_timed_steps():
    from ringtrain.bench.scaling_rows import measured_wire_bytes
    s = {"step_time_sec": [0.1, 0.1, 0.1],
         "network": [{"host": "h1", "timed_steps": 10, "tx_bytes": 1000, "rx_bytes": 900},
                     {"host": "h1", "timed_steps": 9, "tx_bytes": 990, "rx_bytes": 900},  # same host: counted once
                     {"host": "h2", "timed_steps": 5, "tx_bytes": 600, "rx_bytes": 500}]}
    assert measured_wire_bytes(s) == pytest.approx(100 + 120)


def test_async_wire_bytes_are_per_round_of_one_step_of_each_worker():
    from ringtrain.bench.scaling_rows import measured_wire_bytes, theory_wire_bytes
    # PS beside the h2 worker, which steps 3x as often as the h1 worker (no wire in its way):
    # per second h1 sends 1 push (100 B), h2 sends 1 pull (100 B), and the workers make 4 steps
    s = {"step_time_sec": [1.0, 1 / 3], "hosts": ["h1", "h2"], "ps_bytes": [100],
         "launch": {"ps_hosts": ["h2:2222"]},
         "network": [{"host": "h1", "timed_steps": 4, "tx_bytes": 400}, {"host": "h2", "timed_steps": 12,
                                                                          "tx_bytes": 400}]}
    assert measured_wire_bytes(s) == pytest.approx(200 / 2)  # per round: 200 B/s over 2 steps/s per worker
    assert theory_wire_bytes("ps-async", s) == pytest.approx(100)


def test_oversubscription_is_flagged_when_processes_outnumber_cores():
    rows = {(r["mode"], r["workers"]): r for r in recorded_result()["rows"]}
    assert not rows[("ring", 2)]["oversubscribed"]
    assert rows[("ps-sync", 2)]["oversubscribed"]  # 2 workers + 1 PS on 2 cores


def test_gap_table_compares_ring_with_sync_ps_at_each_n():
    gaps = {g["workers"]: g for g in recorded_result()["gaps"]}
    assert set(gaps) == {1, 2}
    assert gaps[2]["measured_gap_ms"] == pytest.approx(106.0 - 67.0)


def test_step_timer_excludes_warmup_and_records_wall_clock_windows():
    from ringtrain.workloads.summary import StepTimer
    timer = StepTimer(warmup_steps=2, window_steps=3)
    for _ in range(9):
        timer.step_done(64)
    report = timer.report()
    assert report["samples"] == 7 * 64  # two warm-up steps are not timed
    assert len(report["windows"]) == len(report["window_spans_unix"]) == 3  # 3 + 3 + a trailing 1
    assert [w[2] for w in report["window_spans_unix"]] == [192, 192, 64]
    assert all(a[1] == b[0] for a, b in zip(report["window_spans_unix"], report["window_spans_unix"][1:]))
    # the timed steps' spread, in 100 equally likely values, whatever their number
    assert len(report["step_time_quantiles_sec"]) == 100
    assert report["step_time_quantiles_sec"] == sorted(report["step_time_quantiles_sec"])
    assert min(report["step_time_quantiles_sec"]) >= 0


def test_a_synchronous_step_waits_for_the_slowest_of_n_workers():
    """α-β's step adds E[the slowest of N compute steps] - their mean in the synchronous modes, from the
    independent trainers' step quantiles; async PS waits for no one, and runs without quantiles add nothing."""
    from ringtrain.workloads.numbers import quantiles
    assert stats.expected_slowest([0.0, 1.0], 2) == pytest.approx(0.75)  # only (0, 0) of 4 draws gives 0
    assert stats.expected_slowest([0.0, 1.0], 1) == pytest.approx(0.5)  # one draw: the mean
    assert stats.expected_slowest(list(range(1000)), 4) == pytest.approx(999 * 4 / 5, rel=2e-3)  # uniform: n/(n+1)
    assert stats.sync_wait_seconds([0.05] * 10, 4) == pytest.approx(0.0)  # no spread, no wait
    assert quantiles(list(range(10)), 5) == [1, 3, 5, 7, 9]
    assert quantiles(list(range(1000))) == [10 * i + 5 for i in range(100)]
    spread = [0.060 + 0.010 * (i % 2) for i in range(100)]  # 60 and 70 ms steps, equally likely
    with_spread = lambda s: dict(s, step_time_quantiles_sec=[spread] * s["world_size"])
    summaries = {("ring", 2, 0): summary("ring", 2, 950, 0.067),
                 ("ps-sync", 2, 1): summary("ps-sync", 2, 600, 0.106, 1),
                 ("ps-async", 2, 1): summary("ps-async", 2, 700, 0.091, 1)}
    cfg = dict(CFG, np=[2])
    rows = lambda independent: {r["mode"]: r for r in build(
        {k: [v] for k, v in {**summaries, ("independent", 2, 0): independent}.items()}, cfg, FIT, PS_FIT)["rows"]}
    plain = rows(summary("independent", 2, 990, 0.0645))
    waits = rows(with_spread(summary("independent", 2, 990, 0.0645)))
    assert plain["ring"]["sync_wait_ms"] is None and plain["ring"]["predicted_step_time_ms"] == pytest.approx(RING_AB_MS)
    # E[max of 2] = 60 + 10 x 3/4 against a mean of 65: 2.5 ms
    for mode in ("ring", "ps-sync"):
        assert waits[mode]["sync_wait_ms"] == pytest.approx(2.5)
        assert waits[mode]["predicted_step_time_ms"] == pytest.approx(plain[mode]["predicted_step_time_ms"] + 2.5)
        assert waits[mode]["predicted_comm_ms"] == pytest.approx(plain[mode]["predicted_comm_ms"])
    assert waits["ps-async"]["sync_wait_ms"] == 0.0
    assert waits["ps-async"]["predicted_step_time_ms"] == pytest.approx(plain["ps-async"]["predicted_step_time_ms"])
    assert "sync_wait_ms" in scaling_report.CSV_KEYS
    found = scaling_report.markdown(build({k: [v] for k, v in {
        **summaries, ("independent", 2, 0): with_spread(summary("independent", 2, 990, 0.0645))}.items()},
        cfg, FIT, PS_FIT))
    assert "waits for its slowest worker's compute: up to 2.5 ms a step" in found


def test_independent_trainers_count_only_the_windows_where_all_ran():
    from ringtrain.bench.independent import combine
    # one window per second, 100 images each; the second trainer starts 5 s late and,
    # while both run, each does 80 images per second
    first = [[t, t + 1, 100.0 if t < 105 else 80.0] for t in range(100, 110)]
    second = [[t, t + 1, 80.0 if t < 110 else 100.0] for t in range(105, 115)]
    worker = lambda w: {"timed_samples": sum(x[2] for x in w), "timed_seconds": 10.0,
                        "window_images_per_sec": [[x[2] for x in w]], "step_time_sec": [0.7],
                        "window_spans_unix": [w], "step_time_quantiles_sec": [[0.7] * 100]}
    result = combine([worker(first), worker(second)])
    assert result["step_time_quantiles_sec"] == [[0.7] * 100] * 2  # for α-β's wait for the slowest worker
    assert result["images_per_sec"] == pytest.approx(160.0)  # not 1800 / 10 s, nor 1800 / 15 s
    assert result["overlap_fraction"] == pytest.approx(5 / 15)


def test_confidence_interval_is_students_t_over_windows():
    mean, half = stats.mean_ci95([10.0, 12.0, 14.0])
    assert mean == 12.0 and half == pytest.approx(4.303 * 2 / 3 ** 0.5, rel=1e-3)
    assert stats.mean_ci95([5.0]) == (5.0, None)


def test_alpha_beta_fit_recovers_known_latency_and_bandwidth():
    alpha, beta = 30e-6, 1 / 2e9
    pts = [(s, stats.ring_allreduce_seconds(s, 2, alpha, beta)) for s in (4096, 65536, 1 << 20, 16 << 20)]
    fit = stats.fit_alpha_beta(pts, 2)
    assert fit["alpha_sec"] == pytest.approx(alpha, rel=1e-6)
    assert fit["beta_sec_per_byte"] == pytest.approx(beta, rel=1e-6)
    pts = [(s, stats.ps_exchange_seconds(s, 1, 1, alpha, beta)) for s in (4096, 65536, 1 << 20, 16 << 20)]
    fit = stats.fit_alpha_beta(pts, 2, model="ps")
    assert fit["alpha_sec"] == pytest.approx(alpha, rel=1e-6)
    assert fit["beta_sec_per_byte"] == pytest.approx(beta, rel=1e-6)


def test_a_ring_fit_prices_small_all_reduces_on_a_line_of_their_own():
    # As Horovod over Gloo across 4 simulated hosts: about 1 ms a hop below 1 MB, the link's rate above
    large = lambda s: stats.ring_allreduce_seconds(s, 4, 20e-6, 1 / 107e6)
    small = lambda s: stats.ring_allreduce_seconds(s, 4, 950e-6, 1 / 380e6)
    pts = [(s, 4, small(s)) for s in (64 << 10, 256 << 10)] + [(s, 4, large(s)) for s in (1 << 20, 4 << 20, 16 << 20)]
    fit = stats.fit_lines(pts)
    assert fit["alpha_sec"] == pytest.approx(20e-6, rel=1e-6) and fit["points"] == 3
    assert fit["small"]["alpha_sec"] == pytest.approx(950e-6, rel=1e-6)
    assert stats.ring_allreduce_on(fit, 80_000, 4) == pytest.approx(small(80_000))  # the slower line below 1 MB
    assert small(80_000) > 4 * large(80_000)
    assert stats.ring_allreduce_on(fit, 4 << 20, 4) == pytest.approx(large(4 << 20))
    assert "below 1 MB: α = 950.0 us" in stats.small_line_words(fit)
    # one size below 1 MB is no line: the fit is the one line, from 1 MB up
    one_line = stats.fit_lines(pts[1:])
    assert "small" not in one_line and one_line["points"] == 3 and stats.small_line_words(one_line) == ""


def test_sizes_parse_as_nccl_tests_ranges():
    assert tables.parse_sizes("4K..256K") == [4096, 16384, 65536, 262144]
    assert tables.parse_sizes("1M,4800000") == [1 << 20, 4800000]


def test_markdown_table_has_fixed_columns():
    text = tables.markdown([("a", "alpha"), ("b", "b")], [{"a": "1", "b": "22222"}, {"a": "333", "b": "4"}])
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1
    assert lines[0].startswith("| alpha |")


def test_scaling_writes_table_csv_json_and_plots_with_every_column(tmp_path):
    result = recorded_result()
    text = scaling_report.write(result, str(tmp_path))
    for name in ("scaling.md", "scaling.csv", "scaling.json", "scaling_throughput.png", "scaling_efficiency.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "bench/COLUMNS.md" in text
    for _, header in scaling_report.COLUMNS:
        assert header in text
    rows = json.loads((tmp_path / "scaling.json").read_text())["rows"]
    for row in rows:
        assert set(scaling_report.CSV_KEYS) <= set(row)
    header = (tmp_path / "scaling.csv").read_text().splitlines()[0].split(",")
    assert header == scaling_report.CSV_KEYS


def test_every_column_header_is_defined_in_columns_md():
    from ringtrain.bench import allreduce, convergence, parity, pipeline, straggler
    doc = open(os.path.join(REPO, "bench", "COLUMNS.md")).read()
    for _, header in (scaling_report.COLUMNS + allreduce.COLUMNS + straggler.COLUMNS + convergence.COLUMNS
                      + parity.COLUMNS + [c for pair in parity.PAIRS.values() for c in pair.columns]
                      + pipeline.COLUMNS):
        assert f"| {header} |" in doc, header


def test_the_allreduce_check_counts_every_wrong_element_and_a_wrong_row_fails_the_bench(tmp_path):
    from ringtrain.bench.allreduce import refuse_wrong
    from ringtrain.bench.allreduce_worker import expected, filled, time_interleaved, wrong_elements
    # 3 ranks' buffers sum to 6 times the pattern: exact in float32
    total = sum(filled(10, rank) for rank in range(3))
    assert wrong_elements(total, expected(10, 3)) == 0
    broken = total.copy()
    broken[[2, 7]] += 1.0
    assert wrong_elements(broken, expected(10, 3)) == 2
    # every trial's result is checked and counted, over the trials (and, here, one rank)
    runs = {"good": (lambda k: None, lambda: 0), "bad": (lambda k: None, lambda: 2)}
    _, _, wrong = time_interleaved(runs, 4096, 3, 1, barrier=lambda: None, slowest=lambda t: t, mean=lambda x: x,
                                   total=lambda x: x)
    assert wrong == {"good": 0, "bad": 6}
    rows = [{"impl": "ring", "bytes": 4096, "world_size": 2, "wrong": 6},
            {"impl": "mpi4py", "bytes": 4096, "world_size": 2, "wrong": 0}]
    with pytest.raises(RuntimeError, match="6 wrong result elements, in ring at 4,096 B on 2 ranks"):
        refuse_wrong({"rows": rows}, str(tmp_path))


def test_an_expectation_that_does_not_parse_fails_in_one_line_with_an_example(tmp_path):
    assert_one_line_error(BENCH + ["scaling", "--expect", "efficiency > 0.9", "--out", str(tmp_path)],
                          "write 'SELECTOR: FIELD OP NUMBER', for example", code=2)


def test_expectations_select_rows_and_hold_only_when_every_selected_row_does():
    rows = [{"mode": "ring", "workers": 2, "efficiency": 0.8}, {"mode": "ring", "workers": 4, "efficiency": 0.6},
            {"mode": "ps-sync", "workers": 2, "efficiency": None}]
    checked = expectations.check([expectations.parse(t) for t in (
        "mode=ring: efficiency >= 0.7", "mode=ring,workers=2: efficiency >= 0.7", "mode=ps-sync: efficiency > 0",
        "mode=towers: efficiency > 0")], rows)
    assert [c["holds"] for c in checked] == [False, True, False, False]
    assert [c["measured"] for c in checked] == ["0.8, 0.6", "0.8", "n/a", "no row matches"]
    assert expectations.failed(checked).startswith("mode=ring: efficiency >= 0.7 does not hold (measured 0.8, 0.6)")


def test_bad_mode_fails_with_one_line_naming_it():
    assert_one_line_error(BENCH + ["scaling", "--modes", "ring,allgather", "--out", "/tmp/unused"],
                          "allgather", code=2, env=child_env())


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_tiny_allreduce_bench_reports_every_implementation_and_the_users_expectations(tmp_path):
    # one expectation that holds, one that cannot: the run exits 1 naming the second
    holds, broken = "impl=ring,world_size=2: wrong == 0", "impl=memcpy: busbw_gbs < 0"
    # from another folder than the checkout's, with --out relative to it; a TMPDIR of its own, with
    # bytecode written (as over ssh), for what AutoGraph leaves there
    temp = tmp_path / "tmp"
    temp.mkdir()
    # 16M: TF's ring cuts each worker's 8 MiB share into 2 subdivisions (collective.ring_in_subdivisions)
    done = run(BENCH + ["allreduce", "--np", "2", "--sizes", "4K,64K,16M", "--trials", "2", "--out", "r",
                        "--expect", holds, "--expect", broken], timeout=220, cwd=str(tmp_path),
               env=child_env({"TMPDIR": str(temp), "PYTHONDONTWRITEBYTECODE": ""}))
    assert generated_code(temp) == [], "each worker removes what AutoGraph wrote, its bytecode too"
    assert os.listdir(temp) == [], "and the bytecode's emptied folder"
    tmp_path = tmp_path / "r"
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1].startswith(f"ringtrain-bench: {broken} does not hold (measured ")
    result = json.loads((tmp_path / "allreduce.json").read_text())
    impls = {r["impl"] for r in result["rows"]}
    assert {"mpi4py", "ring", "memcpy", "horovod-mpi", "horovod-mpi-grads", "horovod-gloo", "tf-ring",
            "tf-ring-grads", "grpc-ps"} <= impls
    for r in result["rows"]:
        assert r["busbw_gbs"] > 0 and r["algbw_gbs"] > 0
        if r["impl"] == "grpc-ps":  # push + pull: S bytes each way through the PS
            assert r["busbw_gbs"] == pytest.approx(2 * r["algbw_gbs"])
        elif r["impl"] != "memcpy":
            assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * 2 * (2 - 1) / 2)
    assert all(r["wrong"] == 0 for r in result["rows"]), [r for r in result["rows"] if r["wrong"]]
    assert "horovod-mpi" in result["alpha_beta"] and result["alpha_beta"]["grpc-ps"]["model"] == "ps"
    assert result["alpha_beta"]["tf-ring"]["model"] == "ring"
    assert result["alpha_beta_used_for_tf_predictions"] == "tf-ring"
    assert (tmp_path / "allreduce_busbw.png").stat().st_size > 0
    assert "busbw (GB/s)" in done.stdout and (tmp_path / "allreduce.md").exists()
    page = (tmp_path / "report.html").read_text()
    assert re.search(rf"<td[^>]*>{re.escape(html.escape(holds))}</td>\s*<td[^>]*>[^<]+</td>\s*<td[^>]*>yes</td>", page)
    assert re.search(rf"<td[^>]*>{re.escape(html.escape(broken))}</td>\s*<td[^>]*>[^<]+</td>\s*<td[^>]*>no</td>", page)
    render_in_chromium(tmp_path / "report.html", tmp_path / "report.png")


def render_in_chromium(page, png):
    """The report as a browser shows it: headless Chromium renders it with no
    network, every plot inline; it opens with the command and its findings,
    fits a laptop's screen, and its screenshot holds the text and plots."""
    from pages import assert_plots_match_their_json, assert_reads_at_first_look, chromium_flags, measure
    measured = measure([page], page.parent)[page]
    assert_reads_at_first_look(measured)
    assert [p["title"] for p in assert_plots_match_their_json(measured, page.parent)] == \
        ["Allreduce bus bandwidth against message size"]
    flags = chromium_flags(png.parent / "chromium-profile") + ["--window-size=1366,2400"]
    shot = run(flags + [f"--screenshot={png}", page.as_uri()], timeout=120)
    assert shot.returncode == 0 and png.exists(), shot.stderr[-2000:]
    pixels = matplotlib.image.imread(png)[..., :3]
    assert pixels.shape[:2] == (2400, 1366)
    dark = (pixels.mean(axis=2) < 0.5).mean()  # text, rules and plot lines on a white page
    assert 0.002 < dark < 0.5, dark


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_tiny_scaling_bench_end_to_end_holds_every_column(tmp_path):
    # ring, TF's collective mode and sync PS at N = 1, 2, and the independent trainers
    # every row is measured against, which the bench adds itself: eight launches
    modes = "ring,tf-collective,ps-sync"
    out = run_bench(["scaling", "--modes", modes, "--np", "1,2", "--steps", "13", "--batch-size", "16",
                     "--out", str(tmp_path)], timeout=340)
    result = json.loads((tmp_path / "scaling.json").read_text())
    assert {(r["mode"], r["workers"]) for r in result["rows"]} == \
        {(m, n) for m in modes.split(",") + ["independent"] for n in (1, 2)}
    for row in result["rows"]:
        assert set(scaling_report.CSV_KEYS) <= set(row)
        assert row["total_images_per_sec"] > 0 and row["step_time_ms"] > 0
        assert row["efficiency"] is not None
        # independent trainers exchange nothing: no compute/communication split
        assert (row["compute_time_ms"] is None) == (row["mode"] == "independent")
        # per-thread CPU: Horovod's background thread exists in the ring ranks only
        assert row["cpu_other_threads_pct"] > 0
        assert (row["cpu_horovod_thread_pct"] is None) == (row["mode"] in ("ps-sync", "tf-collective")), row["mode"]
    assert "Horovod img/s ÷ TF collective img/s" in out  # the two allreduces side by side
    assert {"horovod", "numpy", "mpirun", "cores", "threads_per_worker", "hostfile"} <= set(result["environment"])
    assert result["config"]["modes"] == modes.split(",")
    # the model's own layers, for α-β's overlap with backprop: they hold every byte the ranks exchanged
    assert sum(result["config"]["layer_bytes"]) == result["gradient_bytes"] and len(result["config"]["layer_bytes"]) == 4
    assert "efficiency" in out and (tmp_path / "scaling_throughput.png").exists()
    from pages import assert_plots_match_their_json, assert_reads_at_first_look, measure
    page = tmp_path / "report.html"
    measured = measure([page], tmp_path)[page]
    assert_reads_at_first_look(measured)
    assert len([p for p in assert_plots_match_their_json(measured, tmp_path) if p["drawn"]]) == 2


def test_thread_cpu_is_split_into_horovods_named_thread_and_the_rest():
    import ctypes
    import threading
    import time
    from ringtrain.workloads import threadcpu

    def busy():  # a thread that names itself as patch 0004 names Horovod's, then spins
        ctypes.CDLL(None).prctl(15, threadcpu.HOROVOD_THREAD.encode(), 0, 0, 0)  # PR_SET_NAME
        named.set()
        end = time.process_time() + 10
        while not stop.is_set() and time.process_time() < end:
            pass

    named, stop = threading.Event(), threading.Event()
    assert threadcpu.SplitReader()()[0] is None  # no such thread yet
    worker = threading.Thread(target=busy)
    worker.start()
    named.wait()
    read = threadcpu.SplitReader()  # (finds the named thread at its first reading)
    start, t0 = read(), time.monotonic()
    time.sleep(0.5)
    end, seconds = read(), time.monotonic() - t0
    stop.set()
    worker.join()
    pct = threadcpu.percent_of_a_core(start, end, seconds)
    assert pct["horovod_thread"] > 20  # the spinning thread, whatever else the machine runs
    assert pct["other_threads"] < pct["horovod_thread"]  # this thread slept


def test_the_report_sets_the_event_loop_beside_upstreams_from_the_same_rounds():
    def with_cpu(s, horovod, other):
        s["cpu_pct_of_core"] = [{"horovod_thread": horovod, "other_threads": other}] * s["world_size"]
        return s
    runs = {("ring", 1, 0): [with_cpu(summary("ring", 1, 1000, 0.064), 1.0, 90)],
            ("ring", 2, 0): [with_cpu(summary("ring", 2, 960, 0.067), 4.0, 85)],
            ("ring-upstream", 1, 0): [with_cpu(summary("ring-upstream", 1, 1000, 0.064), 30.0, 70)],
            ("ring-upstream", 2, 0): [with_cpu(summary("ring-upstream", 2, 800, 0.08), 25.0, 60)],
            ("independent", 2, 0): [summary("independent", 2, 1000, 0.064)]}
    result = build(runs, dict(CFG, modes=["ring", "ring-upstream"]), FIT)
    rows = {(r["mode"], r["workers"]): r for r in result["rows"]}
    assert rows[("ring", 2)]["cpu_horovod_thread_pct"] == pytest.approx(4.0)
    assert rows[("independent", 2)]["cpu_horovod_thread_pct"] is None
    found = scaling_report.loop_findings(result)
    assert [what.split(":")[0] for what, _ in found] == ["N=2", "N=2"]
    assert "upstream loop: 25.0%" in found[0][1] and "upstream loop: 80%" in found[1][1]
    assert "ring-upstream" in scaling_report.markdown(result)


def test_replication_modes_get_their_own_launch_and_towers_stay_on_one_machine():
    from ringtrain.bench import scaling, sites
    cfg = dict(CFG, modes=["ps-ingraph", "towers"], np=[1, 2], num_ps=["1"], data_dir=None)
    here = scaling.configurations(cfg, across_hosts=False)
    assert ("towers", 2, 0) in here and ("ps-ingraph", 2, 1) in here and ("independent", 2, 0) in here
    assert all(mode != "towers" for mode, _, _ in scaling.configurations(cfg, across_hosts=True))
    site = sites.this_machine()
    towers = scaling.command("towers", 2, 0, cfg, 64, "s.json", site, "/tmp")
    assert towers[1:4] == ["towers", "--towers", "2"] and "--summary-json" in towers
    in_graph = scaling.command("ps-ingraph", 2, 1, cfg, 64, "s.json", site, "/tmp")
    assert in_graph[1] == "launch" and in_graph[in_graph.index("--replication") + 1] == "in-graph"


def test_the_bench_bucket_size_reaches_every_ring_but_not_ps():
    from ringtrain.bench import scaling, sites
    site = sites.this_machine()
    for mode in ("ring", "ring-gloo", "ring-mpi", "tf-collective"):
        given = scaling.command(mode, 2, 0, dict(CFG, bucket_mb=0.25), 64, "s.json", site, "/tmp")
        assert given[given.index("--bucket-mb") + 1] == "0.25", mode
        assert "--bucket-mb" not in scaling.command(mode, 2, 0, dict(CFG, bucket_mb=None), 64, "s.json", site, "/tmp")
    ps = scaling.command("ps-sync", 2, 1, dict(CFG, bucket_mb=0.25), 64, "s.json", site, "/tmp")
    assert "--bucket-mb" not in ps
