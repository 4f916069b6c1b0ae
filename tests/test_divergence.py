"""A run that diverges (issue 12, "no silent NaN"): it stops at once with one
line naming the step, the ranks and the last good checkpoint, exits non-zero,
and never writes NaN into JSON; --on-nan skip skips the bad updates instead.
Float flags refuse inf and nan before TF loads."""
import json

import pytest

from helpers import ONE_THREAD, assert_one_line_error, mpirun, run

pytestmark = pytest.mark.timeout(180)
DIVERGING = ["--model", "mnist_mlp", "--optimizer", "sgd", "--lr", "1e6", "--log-every", "1000", *ONE_THREAD]


def strict_json(line):
    """json.loads that refuses NaN and Infinity, as standard parsers do."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(line, parse_constant=refuse)


def ringtrain_errors(stderr):
    return [line for line in stderr.splitlines() if line.startswith("ringtrain")]


def test_a_diverging_run_stops_at_once_with_one_line_and_exits_non_zero():
    done = run(["ringtrain", *DIVERGING, "--steps", "60"], timeout=120)
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    errors = ringtrain_errors(done.stderr)
    assert len(errors) == 1 and "non-finite loss at step" in errors[0] and "rank(s) [0]" in errors[0], done.stderr
    assert "--on-nan skip" in errors[0]


@pytest.mark.slow
def test_a_diverging_ring_names_its_ranks_and_the_last_good_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    done = run(mpirun(2, *DIVERGING, "--steps", "60", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"),
               timeout=150)
    assert done.returncode != 0
    errors = ringtrain_errors(done.stderr)
    assert len(errors) == 1, done.stderr  # rank 0 alone says it
    step = int(errors[0].split("non-finite loss at step ")[1].split()[0])
    assert f"the last good checkpoint is {ckpt}/ckpt-{step - 1}:" in errors[0], errors[0]
    assert "rank(s) [0, 1]" in errors[0]


def test_on_nan_skip_goes_on_and_its_summary_is_strict_json(tmp_path):
    done = run(["ringtrain", *DIVERGING, "--steps", "30", "--on-nan", "skip",
                "--summary-json", str(tmp_path / "s.json")], timeout=120)
    assert done.returncode == 0, done.stderr
    printed = strict_json(done.stdout.strip().splitlines()[-1])
    saved = strict_json((tmp_path / "s.json").read_text())
    assert printed["skipped_steps"] == saved["skipped_steps"] > 0
    assert done.stdout.count("update skipped") == printed["skipped_steps"]
    assert printed["train_loss"] is None  # NaN is written as null


def test_strict_json_writes_null_for_nan_and_infinities():
    from ringtrain.workloads.summary import dumps
    text = dumps({"a": float("nan"), "b": [1.5, float("inf")], "c": {"d": -float("inf")}})
    assert strict_json(text) == {"a": None, "b": [1.5, None], "c": {"d": None}}


@pytest.mark.parametrize("flag,value", [("--lr", "inf"), ("--lr", "nan"), ("--warmup-epochs", "nan"),
                                        ("--fusion-threshold-mb", "nan"), ("--cycle-time-ms", "inf"),
                                        ("--seed", "-1")])
def test_float_flags_refuse_inf_and_nan_and_the_seed_a_negative(flag, value):
    assert_one_line_error(["ringtrain", flag, value], flag, code=2)


@pytest.mark.slow
def test_a_diverging_ps_run_stops_in_one_line_and_keeps_the_last_good_checkpoint(tmp_path):
    import numpy as np
    import tensorflow as tf
    from helpers import PS_BASELINE
    ckpt = tmp_path / "ckpt"
    done = run([*PS_BASELINE, "launch", "--num-ps", "1", "--num-workers", "1", *DIVERGING, "--steps", "60",
                "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1000"], timeout=150)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    said = [line for line in (done.stdout + done.stderr).splitlines() if "non-finite loss" in line]
    assert len(said) == 1 and "of worker 0" in said[0], done.stdout + done.stderr
    # the chief's checkpoint at step 0 (the only one before the bad update) is still the latest, and finite
    latest = tf.train.latest_checkpoint(str(ckpt))
    assert latest.endswith("model.ckpt-0") and f"the last good checkpoint is {latest}" in said[0]
    reader = tf.train.load_checkpoint(latest)
    assert all(np.isfinite(reader.get_tensor(name)).all() for name in reader.get_variable_to_shape_map())
