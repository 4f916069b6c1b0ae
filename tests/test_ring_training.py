"""Ring mode under a real launcher: the measured summary, learning, and Horovod's knobs.
(Every launcher's correctness is tests/test_correctness.py's.)"""
import os

import pytest

from helpers import (ONE_THREAD, assert_every_check_ok, assert_same_weights, horovodrun, last_json, on_two_ranks,
                     run_ok, weights)

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def test_embedded_mnist_learns_on_two_ranks_and_the_summary_measures_every_rank(tmp_path):
    out = run_ok(horovodrun(2, "--model", "mnist_mlp", "--epochs", "1", "--summary-json", str(tmp_path / "s.json"),
                            *ONE_THREAD))
    printed = last_json(out)
    with open(tmp_path / "s.json") as f:
        saved = last_json(f.read())
    assert saved["test_samples"] == 1000 and saved["test_accuracy"] > 0.85
    assert printed["images_per_sec"] == saved["images_per_sec"]
    per_worker = saved["images_per_sec_per_worker"]
    assert len(per_worker) == 2 and all(r > 0 for r in per_worker)
    # an epoch of 4,000 images in global batches of 64 (the last one 32): 63 steps, the first 3
    # warm-up, not timed
    assert saved["steps"] == 63 and saved["timed_samples"] == 4000 - 3 * 2 * 32
    # Global = all timed samples over the slowest rank's timed seconds (each rank timed
    # half the samples): not rank 0's rate x 2, nor the mean of the rates.
    slowest = max(saved["timed_samples"] / 2 / rate for rate in per_worker)
    assert saved["images_per_sec"] == pytest.approx(saved["timed_samples"] / slowest, rel=1e-9)
    assert saved["timed_seconds"] == pytest.approx(slowest, rel=1e-9)
    assert len(saved["window_images_per_sec"]) == 2
    assert {"test_accuracy", "train_loss", "wall_time_sec", "config"} <= set(saved)


def test_horovod_knobs_keep_ranks_identical_and_write_timeline_and_tensorboard(tmp_path):
    dump, timeline, logs = str(tmp_path / "w-{rank}.npz"), tmp_path / "timeline.json", tmp_path / "tb"
    run_ok(horovodrun(
        2, "--model", "mnist_mlp", "--steps", "8", "--log-every", "4", "--adasum",
        "--fp16-allreduce", "--cycle-time-ms", "2", "--fusion-threshold-mb", "16",
        "--horovod-timeline", str(timeline), "--log-dir", str(logs), "--dump-weights", dump,
        "--summary-json", str(tmp_path / "s.json"), *ONE_THREAD))
    summary = last_json((tmp_path / "s.json").read_text())
    assert summary["config"]["adasum"] and summary["config"]["fp16_allreduce"]
    assert_same_weights(weights(dump, 0), weights(dump, 1), exact=True)
    assert "ALLREDUCE" in timeline.read_text()
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(logs))


def test_ring_modes_exchange_sums_the_stop_votes_inside_the_gradients_for_every_op():
    # Sum, Average, Average in fp16 and Adasum, each alone, grouped (--accumulate) and in buckets
    # (--bucket-mb): rank 1's vote comes back as 1 on both ranks, the gradients as their sum or
    # average, their shapes, a None and an IndexedSlices gradient as they were
    # (tests/scripts/ring_exchange.py)
    assert_every_check_ok(on_two_ranks("ring_exchange.py"),
                          {f"{op}{how}" for op in ("sum", "average", "average-fp16", "adasum")
                           for how in ("", "-grouped", "-bucketed")})
