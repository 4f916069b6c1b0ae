"""Sync against async, measured: one slow worker (`--straggler`) in every
mode, backup workers dropping its late gradients, and the benches that put
the modes side by side (`ringtrain-bench straggler`, `convergence`).

Slowdowns are compared as ratios within one test, with generous bounds, on
a simulated accelerator (waits that use no CPU), so that workers on 2 cores
do not slow each other and the machine's drift mostly cancels."""
import argparse
import json
import math
import os

import numpy as np
import pytest

from helpers import (ONE_THREAD, PS_BASELINE, assert_one_line_error, assert_said_once_by_the_job, last_json, mpirun, run,
                     run_bench, run_ok)
from ringtrain.workloads import snapshots
from ringtrain.workloads.straggler import Straggler, parse

SIMULATED = ["--model", "mnist_mlp", "--simulate-gpu", "30", "--batch-size", "16", "--warmup-steps", "4",
             "--log-every", "10", *ONE_THREAD]


# --- the flag ---------------------------------------------------------------------

def test_straggler_flag_parses_rank_factor_and_every():
    assert parse("1:3") == Straggler(1, 3.0, 1)
    assert parse("0:1.5:10") == Straggler(0, 1.5, 10)
    for bad in ("1", "1:x", "-1:3", "1:0.5", "1:inf", "1:nan", "1:3:0", "1:3:2:4"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)


def test_only_the_stragglers_own_every_eth_step_waits():
    spec = Straggler(1, 3.0, 4)
    assert [spec.extra(1, step) for step in range(1, 9)] == [0, 0, 0, 2.0, 0, 0, 0, 2.0]
    assert all(spec.extra(0, step) == 0 for step in range(1, 9))


def test_a_straggler_rank_outside_the_job_is_one_line():
    assert_one_line_error(["ringtrain", "--straggler", "1:3", "--steps", "2"], "no rank 1 among 1", code=2)
    # under a launcher too, before TF loads: the size is the launcher's
    done = run(mpirun(2, "--straggler", "2:3", "--steps", "2"), timeout=60)
    assert_said_once_by_the_job(done, "no rank 2 among 2")
    assert done.seconds < 10, f"took {done.seconds:.1f}s"
    assert_one_line_error([*PS_BASELINE, "launch", "--num-workers", "2", "--straggler", "2:3", "--steps", "2"],
                          "no worker task 2 among 2", code=2)
    assert_one_line_error([*PS_BASELINE, "towers", "--towers", "2", "--straggler", "5:3", "--steps", "2"],
                          "no tower 5 among 2", code=2)
    assert_one_line_error(["ringtrain", "--straggler", "1:0.5"], "FACTOR >= 1", code=2)


def test_a_snapshot_needs_both_flags_and_whole_variables(tmp_path):
    assert_one_line_error(["ringtrain", "--snapshot-every", "5", "--steps", "2"], "go together", code=2)
    assert_one_line_error([*PS_BASELINE, "launch", "--num-workers", "1", "--placement", "partitioned",
                           "--snapshot-every", "5", "--snapshot-dir", str(tmp_path)], "whole variables", code=2)


def test_snapshots_keep_weights_seconds_and_samples_off_the_training_clock(tmp_path):
    shots = snapshots.Snapshots(str(tmp_path), every=2)
    assert not shots.due(1) and shots.due(2)
    shots.take(2, 64, lambda: [("dense/kernel", np.ones((2, 3), np.float32))], global_step=2)
    shots.take(4, 128, lambda: [("dense/kernel", np.zeros((2, 3), np.float32))])
    records = snapshots.read(str(tmp_path))
    assert [r["step"] for r in records] == [2, 4] and [r["samples_seen"] for r in records] == [64, 128]
    assert records[0]["global_step"] == 2
    # the first snapshot's own time is off the second's clock
    assert records[1]["snapshot_seconds_so_far"] > 0
    assert records[1]["training_seconds"] >= records[0]["training_seconds"]
    assert snapshots.load(str(tmp_path), records[0])["dense/kernel"].sum() == 6


def test_step_time_percentiles_and_the_update_rate_come_from_timed_steps_only():
    from ringtrain.workloads.summary import StepTimer
    timer = StepTimer(warmup_steps=2, window_steps=3)
    for update in range(1, 9):
        timer.step_done(8.0, update=update * 2)
    report = timer.report()
    assert report["timed_steps"] == 6 and len(timer.step_seconds) == 6
    assert report["step_time_p50_sec"] <= report["step_time_p99_sec"]
    assert report["updates_timed"] == 16 - 4  # from the end of warm-up to the last step


def test_async_staleness_is_a_histogram_with_percentiles():
    from ps_baseline.reports import Staleness, staleness_fields
    a, b = Staleness(), Staleness()
    for read, applied in [(0, 1), (1, 3), (3, 7)]:  # staleness 0, 1, 3
        a.add(read, applied)
    b.add(7, 8)
    reports = [{"staleness": s.as_list(), "staleness_histogram": s.histogram} for s in (a, b)]
    fields = staleness_fields(reports)
    assert fields["staleness_histogram"] == {"0": 2, "1": 1, "3": 1}
    assert fields["staleness_p50"] == 0 and fields["staleness_p99"] == 3 and fields["staleness_max"] == 3
    assert fields["staleness_mean"] == pytest.approx(1.0)


# --- stragglers in every mode -------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.alone
def test_a_3x_straggler_slows_ring_and_sync_ps_but_not_async_ps(tmp_path):
    out = run_bench(["straggler", "--np", "2", "--factors", "3", "--modes", "ring,ps-sync,ps-async",
                 "--model", "mnist_mlp", "--steps", "20", "--simulate-gpu", "30", "--out", str(tmp_path)], 400)
    result = json.loads((tmp_path / "straggler.json").read_text())
    row = {(r["mode"], r["factor"]): r for r in result["rows"]}
    assert set(row) == {(m, f) for m in ("ring", "ps-sync", "ps-async") for f in (1.0, 3.0)}
    healthy_slowdown = {m: row[(m, 1.0)]["healthy_images_per_sec"] / row[(m, 3.0)]["healthy_images_per_sec"]
                        for m in ("ring", "ps-sync", "ps-async")}
    # sync: the healthy worker waits for the straggler every step; async: it never waits
    assert healthy_slowdown["ring"] > 1.5 and healthy_slowdown["ps-sync"] > 1.5, healthy_slowdown
    assert healthy_slowdown["ps-async"] < 1.3, healthy_slowdown
    # async: the straggler alone is slow; sync: the healthy worker keeps the straggler's pace
    for mode in ("ring", "ps-sync", "ps-async"):
        slow = row[(mode, 3.0)]
        straggler, healthy = slow["straggler_images_per_sec"], slow["healthy_images_per_sec"]
        if mode == "ps-async":
            assert straggler < healthy / 1.5, (mode, straggler, healthy)
        else:
            assert abs(straggler - healthy) < 0.25 * healthy, (mode, straggler, healthy)
        summary = json.loads(open(slow["summary_json"]).read())
        waited = summary["straggler"]["waited_sec"]
        assert waited[1] > 0 and waited[0] == 0, waited
    assert row[("ps-async", 3.0)]["staleness_p99"] is not None
    for name in ("straggler.md", "straggler.csv", "straggler_throughput.png", "straggler_step_times.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert "healthy step p50/p99 ms" in out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_backup_worker_drops_the_stragglers_late_gradients_and_training_stays_consistent(tmp_path):
    steps = 30
    summary = last_json(run_ok([*PS_BASELINE, "launch", "--num-ps", "1", "--num-workers", "3", "--sync",
                                "--replicas-to-aggregate", "2", "--straggler", "2:3", "--model", "mnist_mlp",
                                "--no-dropout", "--batch-size", "16", "--steps", str(steps), *ONE_THREAD,
                                "--checkpoint-dir", str(tmp_path / "ckpt")], timeout=280))
    assert summary["steps"] == steps and summary["reporting_workers"] == [0, 1, 2]
    assert summary["straggler"]["waited_sec"][2] > 0
    # SyncReplicasOptimizer hands out W + 1 tokens per update and applies K = 2
    # gradients: the rest, the straggler's late ones among them, are dropped.
    assert summary["gradients_dropped"] >= steps // 2, summary
    assert summary["gradients_pushed"] == 2 * steps + summary["gradients_dropped"] + summary["gradients_pending"]
    # the straggler trained slower than the healthy workers, who did not wait for it (nor for
    # each other). Under load a worker may make no more than its untimed warm-up steps while
    # the others make the 30 updates: it times none and its rate is None. That has happened
    # to a healthy worker and to the straggler, so its steps count as well as its rate.
    rates, timed = summary["images_per_sec_per_worker"], [n["timed_steps"] for n in summary["network"]]
    assert timed[2] < max(timed[:2]), (timed, rates)
    if rates[2] is not None:
        assert rates[2] < max(r for r in rates[:2] if r is not None) / 1.5, rates
    # the chief's checkpoint is finite, and the model learned
    import tensorflow as tf
    reader = tf.train.load_checkpoint(str(tmp_path / "ckpt"))
    kernels = [name for name in reader.get_variable_to_shape_map() if name.endswith("kernel")]
    assert kernels and all(np.isfinite(reader.get_tensor(name)).all() for name in kernels)
    assert reader.get_tensor("global_step") == steps
    assert summary["test_accuracy"] > 0.5


# --- time to accuracy --------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(420)
def test_convergence_on_a_tiny_budget_writes_every_column_and_both_plots(tmp_path):
    from ringtrain.bench import convergence
    out = run_bench(["convergence", "--np", "2", "--modes", "ring,ps-sync,ps-async", "--model", "mnist_mlp",
                 "--steps", "20", "--snapshot-every", "5", "--target", "0.5", "--out", str(tmp_path)], 400)
    result = json.loads((tmp_path / "convergence.json").read_text())
    assert [r["mode"] for r in result["rows"]] == ["ring", "ps-sync", "ps-async"]
    for row in result["rows"]:
        assert set(convergence.CSV_KEYS) <= set(row)
        assert row["rounds_reaching_target"] == 1 and row["seconds_to_target"] > 0
        assert row["samples_to_target"] > 0 and 0.5 <= row["final_accuracy"] <= 1
    for curve in result["curves"]:
        accuracies = [p[2] for p in curve["points"]]
        assert len(accuracies) == 4 and all(0 <= a <= 1 and math.isfinite(a) for a in accuracies)
        # seconds and samples grow snapshot to snapshot
        assert all(a[0] < b[0] and a[1] < b[1] for a, b in zip(curve["points"], curve["points"][1:]))
    # ring and sync PS run the same optimizer on the same global batches: every
    # snapshot holds the same samples, and their accuracies agree
    ring, sync = (next(c["points"] for c in result["curves"] if c["mode"] == m) for m in ("ring", "ps-sync"))
    assert [p[1] for p in ring] == [p[1] for p in sync]
    assert result["winner"] in ("ring", "ps-sync", "ps-async")
    header = (tmp_path / "convergence.csv").read_text().splitlines()[0].split(",")
    assert header == convergence.CSV_KEYS
    for name in ("convergence_time.png", "convergence_samples.png", "convergence.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    # the snapshots' weights are gone once evaluated; their index stays
    leftovers = [f for f in os.listdir(tmp_path / "runs" / "ring-r1-snapshots") if f.endswith(".npz")]
    assert leftovers == [] and "seconds to target" in out
