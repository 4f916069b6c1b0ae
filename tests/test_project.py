"""ringtrain-bench project: the α-β model at sizes this machine cannot run
reduces to the closed forms (ring allreduce, BytePS's PS time with its
placement, the hierarchy's two rings), and the command writes its reports."""
import json
import math

import pytest

from ringtrain.bench import project
from helpers import BENCH, run_ok

S, C = 100e6, 0.3  # gradient bytes, one GPU's step (s)
ALPHA, BETA = 20e-6, 8 / 25e9  # 25 Gbit/s


def cfg(np_, per_host=1, grpc=None, tensors=(S,), placement="partitioned", layers=None, hierarchical=False):
    link = project.link_fit(25e9, ALPHA)
    return {"model": "m", "tensor_bytes": list(tensors), "layer_bytes": list(layers or tensors),
            "hierarchical": hierarchical, "placement": placement, "step_ms": C * 1e3, "step_source": "given", "batch_size": 64,
            "np": np_, "gpus_per_host": per_host, "intra": project.link_fit(80e9, 1e-6), "grpc_rate_bits": grpc,
            "links": [{"label": "25gbit", "source": "given", "ring": link, "ps": link}]}


def rows(config):
    return {(r["mode"], r["gpus"], r["num_ps"]): r for r in project.project(config)["rows"]}


def exposed_ps(t):
    return 2 * ALPHA + max(0, t - 2 * C / 3) + max(0, t - C / 3)


def test_ring_hides_behind_backprop_all_but_the_gradients_backprop_makes_last():
    for n in (8, 64):
        # two layers of S/2: the second's allreduce runs while backprop is in the first (it takes less than
        # half the backward pass), the first's after backprop, and shows
        half = 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * S / 2 * BETA
        assert half < C / 3
        r = rows(cfg([n], layers=(S / 2, S / 2)))[("ring", n, None)]
        assert r["exchange_ms"] == pytest.approx(2 * half * 1e3) and r["allreduces"] == 2
        assert r["step_ms"] == pytest.approx((C + half) * 1e3)
        assert r["hidden_pct"] == pytest.approx(50)
        assert r["efficiency"] == pytest.approx(C / (C + half))
        assert r["images_per_sec"] == pytest.approx(64 * n / (r["step_ms"] / 1e3))
        # one layer: its gradients are all made at the end of backprop, and nothing hides
        whole = 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * S * BETA
        one = rows(cfg([n]))[("ring", n, None)]
        assert one["step_ms"] == pytest.approx((C + whole) * 1e3) and one["hidden_pct"] == pytest.approx(0)


def test_tfs_ring_hides_its_buckets_behind_backprop_but_the_last_one():
    n = 8
    half = 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * S / 2 * BETA
    # buckets smaller than a layer: one a layer, the last layer's sent while backprop makes the first's
    r = rows(dict(cfg([n], layers=(S / 2, S / 2)), bucket_mb=1))[("tf-collective", n, None)]
    assert r["allreduces"] == 2 and r["step_ms"] == pytest.approx((C + half) * 1e3)
    # 0: one all-reduce of everything once backprop is done: nothing hides
    whole = 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * S * BETA
    r = rows(dict(cfg([n], layers=(S / 2, S / 2)), bucket_mb=0))[("tf-collective", n, None)]
    assert r["allreduces"] == 1 and r["step_ms"] == pytest.approx((C + whole) * 1e3)


def test_hosts_of_several_gpus_pay_a_ring_inside_and_a_ring_across_or_one_ring_at_the_links_pace():
    r = rows(cfg([32], per_host=4, hierarchical=True))[("ring", 32, None)]
    inside = 2 * 3 * 1e-6 + 2 * 3 / 4 * S * 8 / 80e9
    across = 2 * 7 * ALPHA + 2 * 7 / 8 * S * BETA
    assert r["hosts"] == 8 and r["exchange_ms"] == pytest.approx((inside + across) * 1e3)
    # Horovod's default: NCCL's one ring through all 32 GPUs, each hop at the pace of the link between hosts
    flat = rows(cfg([32], per_host=4))[("ring", 32, None)]
    assert flat["exchange_ms"] == pytest.approx((2 * 31 * ALPHA + 2 * 31 / 32 * S * BETA) * 1e3)
    # on one host the ring runs on the link inside it
    one_host = rows(cfg([4], per_host=4))[("ring", 4, None)]
    assert one_host["exchange_ms"] == pytest.approx(inside * 1e3)


def test_ps_time_is_bytepss_closed_form_with_the_tasks_placed_on_the_workers_hosts():
    n = 16
    got = rows(cfg([n]))
    # one PS task on host 0: it takes in every other worker's gradients, n M / (k B) with k = 1
    assert got[("ps-sync", n, 1)]["step_ms"] == pytest.approx((C + exposed_ps((n - 1) * S * BETA)) * 1e3)
    # one per host: each link carries (n-1)/n of a gradient each way, M/B less the local share
    assert got[("ps-sync", n, n)]["step_ms"] == pytest.approx((C + exposed_ps((n - 1) / n * S * BETA)) * 1e3)
    assert (n // 4) in {p for _, _, p in got if p}


def test_whole_variables_are_placed_as_ps_baseline_places_them():
    tensors = [10e6, 60e6, 30e6]  # model order
    assert project.ps_loads(tensors, 2, "greedy") == [40e6, 60e6]  # 10 -> 0, 60 -> 1, 30 -> 0
    assert project.ps_loads(tensors, 2, "round_robin") == [40e6, 60e6]
    assert project.ps_loads(tensors, 4, "partitioned") == [25e6] * 4
    n = 8  # the largest variable sets the floor: P = N is no better than its one task's link
    got = rows(cfg([n], tensors=tensors, placement="greedy"))[("ps-sync", n, n)]
    assert got["step_ms"] == pytest.approx((C + exposed_ps((n - 1) * 60e6 * BETA)) * 1e3)


def test_grpc_rate_caps_what_a_ps_host_moves():
    n, grpc = 16, 4e9
    capped = rows(cfg([n], grpc=grpc))[("ps-sync", n, n)]
    assert capped["step_ms"] == pytest.approx((C + exposed_ps((n - 1) / n * S * 8 / grpc)) * 1e3)
    assert rows(cfg([n], grpc=grpc))[("ring", n, None)] == rows(cfg([n]))[("ring", n, None)]


def test_a_steps_spread_makes_every_mode_wait_for_the_slowest_gpu():
    """With --step-spread, each synchronous step waits E[the slowest of N] - the mean:
    for normal steps of standard deviation s, s/sqrt(pi) at N = 2, 3.0439 s at 512."""
    spread, layers = 0.02, (S / 2, S / 2)
    still, jittery = rows(cfg([2, 512], layers=layers)), rows(dict(cfg([2, 512], layers=layers), step_spread_pct=2))
    for (mode, n, p), r in jittery.items():
        wait = spread * C * (1 / math.sqrt(math.pi) if n == 2 else 3.0439)
        assert r["sync_wait_ms"] == pytest.approx(wait * 1e3, rel=1e-3), (mode, n, p)
        assert still[(mode, n, p)]["sync_wait_ms"] == 0
        # the wait comes on top of the same exchange, and what of it shows
        assert r["step_ms"] == pytest.approx(still[(mode, n, p)]["step_ms"] + r["sync_wait_ms"])
        assert r["hidden_pct"] == still[(mode, n, p)]["hidden_pct"]
        assert r["efficiency"] == pytest.approx(C / (r["step_ms"] / 1e3))
    assert "--step-spread prices it" in " ".join(project.project(cfg([2]))["assumptions"])


@pytest.mark.slow
def test_the_command_writes_its_tables_plot_and_page(tmp_path):
    out = run_ok([*BENCH, "project", "--model", "vgg16", "--gpus-per-host", "4", "--link-rate", "25gbit,100gbit",
                  "--np", "8,128", "--placement", "partitioned", "--step-spread", "1", "--out", str(tmp_path)],
                 timeout=120)
    assert "What the projection assumes" in out and "contention in the switches" in out
    assert "| sync wait ms |" in out and "each step of 128 GPUs waits" in out
    result = json.loads((tmp_path / "project.json").read_text())
    assert len(result["rows"]) == 2 * 2 * 5  # 2 rates x 2 N x (ring, TF's ring, P = 1, N/4, N)
    ring = {(r["link_rate"], r["gpus"]): r["efficiency"] for r in result["rows"] if r["mode"] == "ring"}
    assert ring[("100gbit", 128)] > ring[("25gbit", 128)]  # faster links hide more
    assert result["inputs"]["gradient_bytes"] == 4 * 138_357_544
    assert math.isclose(result["inputs"]["step_ms"], 64 / 154 * 1e3)
    for name in ("project.md", "project.csv", "project_efficiency.png", "report.html"):
        assert (tmp_path / name).stat().st_size > 0


@pytest.mark.parametrize("args, expected", [
    (["--alpha-beta", "/nonexistent.json"], "--alpha-beta /nonexistent.json: cannot read it"),
    (["--link-rate", "fast"], "write tc rates such as 1gbit,10gbit"),
    (["--model", "mnist_cnn", "--link-rate", "25gbit"], "mnist_cnn has no published step time: give --step-ms"),
    ([], "one of the arguments --alpha-beta --link-rate --check is required"),
    (["--check", "/nonexistent.json"], "--check /nonexistent.json: cannot read it"),
])
def test_bad_input_is_one_line(tmp_path, args, expected):
    from helpers import assert_one_line_error
    assert_one_line_error([*BENCH, "project", *args, "--out", str(tmp_path)], expected, code=2)


def recorded_run(folder, steps_ms):
    """A run across hosts as ringtrain-bench scaling writes one: ring at N = 1, 2, 4, 8
    on hosts that share one machine's cores, and its links' allreduce timings
    (1/β = 100 MB/s at 2 and 4 ranks; 8 ranks much slower, which a fit on N <= 4 never sees)."""
    grad, runs = 4.8e6, folder / "runs"
    runs.mkdir(parents=True)
    (folder / "link-fit").mkdir()
    timings = [{"impl": "mpi-ring", "world_size": n, "bytes": b, "trial_seconds": [2 * (n - 1) / n * b / 100e6
                                                                                   * (3 if n == 8 else 1)]}
               for n in (2, 4, 8) for b in (1e6, 4e6, 16e6)]
    (folder / "link-fit" / "allreduce.json").write_text(json.dumps({"rows": timings}))
    rows = []
    for n, ms in steps_ms.items():
        summary = {"mode": "ring", "world_size": n, "steps": 10, "images_per_sec": 64 * n / (ms / 1e3),
                   "window_images_per_sec": [[64 / (ms / 1e3)]] * n, "step_time_sec": [ms / 1e3] * n,
                   "hosts": [f"h{i + 1}" for i in range(n)], "gradient_bytes": grad,
                   "allreduce_algorithm": "mpi ring"}
        (runs / f"ring-n{n}-r1.json").write_text(json.dumps(summary))
        rows.append({"mode": "ring", "workers": n, "num_ps": 0})
    site = {"label": "simulated cluster", "across_hosts": True, "link_rate": "1gbit", "dilation": 1.0,
            "hosts": 8, "simulated_gpu_ms": 200.0, "hosts_share_cores": True}
    cfg = {"modes": ["ring"], "np": [1, 2, 4, 8], "threads": 1, "scaling": "weak", "batch_size": 64,
           "global_batch": None, "model": "m", "layer_bytes": [grad / 2, grad / 2]}
    (folder / "scaling.json").write_text(json.dumps({"rows": rows, "config": cfg, "site": site,
                                                     "environment": {"cores": 2}, "alpha_beta_ps": None}))
    return str(folder / "scaling.json")


def test_the_check_fits_on_the_small_rows_only_and_prices_the_shared_cores(tmp_path):
    from ringtrain.bench import project_check
    path = recorded_run(tmp_path, {1: 200.0, 2: 230.0, 4: 250.0, 8: 320.0})
    result = project_check.check(path, 4)
    [link], [row] = result["links"], result["rows"]
    assert link["ring_fit"]["bandwidth_gb_per_sec"] == pytest.approx(0.1)  # the 8-rank timings left out
    # two layers of 2.4 MB: the second's allreduce over 8 ranks at 100 MB/s (42 ms) hides behind the 133 ms
    # of backward, the first's, made last, shows: α-β says 242 ms
    assert row["workers"] == 8 and row["predicted_step_time_ms"] == pytest.approx(242.0)
    assert row["error_pct"] == pytest.approx(100 * (242 - 320) / 320)
    # what α-β left at N = 2 and 4 (230 - 224 and 250 - 236 ms), per MB the hosts sent (9.6 and 28.8), through
    # the origin
    kappa = (6 * 9.6 + 14 * 28.8) / (9.6 ** 2 + 28.8 ** 2)
    assert link["kappa_ms_per_mb"] == pytest.approx(kappa)
    assert row["predicted_with_shared_cores_ms"] == pytest.approx(242 + kappa * 8 * 1.75 * 4.8)
    assert "error with shared cores" in project_check.markdown(result)


def test_the_check_needs_rows_past_the_fit(tmp_path):
    from ringtrain.bench import project_check
    from ringtrain.common.errors import UsageError
    path = recorded_run(tmp_path, {1: 200.0, 2: 205.0})
    with pytest.raises(UsageError, match="no row with more than 4 workers to check"):
        project_check.check(path, 4)
