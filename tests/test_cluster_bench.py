"""The bench across hosts: a tiny run on simulated hosts gives a table with
every column, the bytes each host's interface sent match theory, each
allreduce is fitted on the links it runs on, and the sync-against-async
benches run there too."""
import json
import os

import pytest

from ringtrain.bench.launch import child_env
from ringtrain.bench.scaling_report import COLUMNS, CSV_KEYS
from ringtrain.bench.scaling_rows import fit_at
from helpers import BENCH, BIN, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
TINY = ["--model", "mnist_mlp", "--steps", "8", "--warmup-steps", "2", "--batch-size", "32",
        "--optimizer", "sgd", "--timeout", "240"]


def bench_ok(argv, timeout=560):
    done = run(argv, timeout=timeout, env=child_env())
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    return done.stdout


def test_scaling_on_a_simulated_cluster_it_builds_gives_every_column_and_bytes_match_theory(cluster, tmp_path):
    # its own 2-host cluster, links of 2 Gbit/s emulated at 1 Gbit/s with a time dilation of 2
    # (N = 2 only: the hostfile's run below has the N = 1 rows)
    out = bench_ok([*BENCH, "scaling", "--cluster", "2", "--link-rate", "2gbit", "--time-dilation", "2",
                    "--simulate-gpu", "20", "--modes", "ring,ps-sync", "--np", "2", *TINY, "--out", str(tmp_path)])
    result = json.loads((tmp_path / "2gbit-dilated2" / "scaling.json").read_text())
    rows = {(r["mode"], r["workers"]): r for r in result["rows"]}
    # (and the independent trainers, every row's compute: the simulated hosts share this machine's cores)
    assert set(rows) == {(m, 2) for m in ("ring", "ps-sync", "independent")}
    assert rows[("ring", 2)]["compute_time_ms"] == rows[("independent", 2)]["step_time_ms"]
    for row in (r for (mode, _), r in rows.items() if mode != "independent"):
        assert set(CSV_KEYS) <= set(row)
        assert row["link_rate"] == "2gbit" and row["time_dilation"] == 2
        assert row["predicted_step_time_ms"] and row["total_images_per_sec"] > 0
    # (under mpirun across hosts Gloo carries ring mode's gradients: --cpu-operations auto; α-β prices them
    # with Horovod's allreduce over Gloo, fitted on these links beside OpenMPI's ring)
    assert rows[("ring", 2)]["algorithm"] == "gloo ring" and rows[("ring", 2)]["hosts"] == 2
    assert all(fit_at(result[key], 2)["bandwidth_gb_per_sec"] > 0 for key in ("alpha_beta_gloo", "alpha_beta"))
    for mode in ("ring", "ps-sync"):
        assert abs(rows[(mode, 2)]["wire_bytes_pct_of_theory"] - 100) <= 10, rows[(mode, 2)]
    text = (tmp_path / "scaling.md").read_text()
    for _, header in COLUMNS:
        assert header in text
    assert "2gbit (÷2)" in text and "What the rows show, together" in text and "Time dilation 2" in out
    assert "ring rows whose gradients Gloo carried: Horovod's allreduce over Gloo (horovod-gloo)" in \
        (tmp_path / "2gbit-dilated2" / "scaling.md").read_text()
    assert (tmp_path / "2gbit-dilated2" / "scaling_throughput.png").stat().st_size > 0
    # (efficiency's plot is the hostfile's run's: it needs the N = 1 rows)
    assert not (tmp_path / "2gbit-dilated2" / "scaling_efficiency.png").exists()
    assert not [ns for ns in os.listdir("/run/netns") if ns.startswith("rtbench-")]  # torn down


def on_h1(cluster, argv):
    return [os.path.join(BIN, "ringtrain-cluster"), "--name", cluster.name, "exec", "h1", "--", *argv]


def test_scaling_runs_across_the_hosts_of_a_hostfile_and_fits_each_allreduce_on_its_links(cluster, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("h1 slots=1\nh2 slots=1\n")
    # (ring mode's rows across hosts are the simulated cluster's, above; its link fit is made here too)
    bench_ok(on_h1(cluster, [*BENCH, "scaling", "--hostfile", str(hosts), "--modes", "tf-collective", "--np", "1,2",
                             *TINY, "--out", str(tmp_path / "r")]))
    result = json.loads((tmp_path / "r" / "scaling.json").read_text())
    rows = {(r["mode"], r["workers"]): r for r in result["rows"]}
    assert set(rows) == {("tf-collective", 1), ("tf-collective", 2)}
    for name in ("scaling_throughput.png", "scaling_efficiency.png"):
        assert (tmp_path / "r" / name).stat().st_size > 0
    assert rows[("tf-collective", 2)]["hosts"] == 2
    assert abs(rows[("tf-collective", 2)]["wire_bytes_pct_of_theory"] - 100) <= 10
    # fitted on these hosts' links: OpenMPI's ring for Horovod's rows, TF's own ring for TF's
    assert result["alpha_beta"] and result["alpha_beta_ps"] and result["alpha_beta_tf"]
    tf_fit = fit_at(result["alpha_beta_tf"], 2)
    compute = rows[("tf-collective", 1)]["step_time_ms"] / 1e3
    packed = 2 * tf_fit["alpha_sec"] + result["gradient_bytes"] * tf_fit["beta_sec_per_byte"]  # after backprop
    # and the wait for the slower of 2 workers, read from the N = 1 run's steps
    wait = rows[("tf-collective", 2)]["sync_wait_ms"] / 1e3
    assert 0 <= wait < compute
    assert rows[("tf-collective", 2)]["predicted_step_time_ms"] == pytest.approx(1e3 * (compute + wait + packed))


def test_the_straggler_bench_runs_across_hosts_with_tf_collective_and_a_backup_worker(cluster, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("h1 slots=1\nh2 slots=1\nh3 slots=1\n")  # W + 1 = 3 for the backup worker
    bench_ok(on_h1(cluster, [*BENCH, "straggler", "--hostfile", str(hosts), "--np", "2", "--factors", "3",
                             "--modes", "tf-collective,ps-sync-backup", "--model", "mnist_mlp", "--steps", "12",
                             "--warmup-steps", "2", "--simulate-gpu", "30", "--timeout", "240",
                             "--out", str(tmp_path / "r")]))
    result = json.loads((tmp_path / "r" / "straggler.json").read_text())
    assert result["site"]["label"] == f"hostfile {hosts}" and result["site"]["across_hosts"]
    row = {(r["mode"], r["factor"]): r for r in result["rows"]}
    assert set(row) == {(m, f) for m in ("tf-collective", "ps-sync-backup") for f in (1.0, 3.0)}
    # TF's all-reduce waits for the straggler every step; the backup worker's update does not
    assert row[("tf-collective", 3.0)]["ratio_to_no_straggler"] < 0.7, row[("tf-collective", 3.0)]
    assert row[("ps-sync-backup", 3.0)]["gradients_dropped"] > 0
    for r in row.values():
        summary = json.loads(open(r["summary_json"]).read())
        assert len(set(summary["hosts"])) == r["workers"]  # one worker per host
