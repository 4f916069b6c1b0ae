"""A run that diverges: it stops at once with one
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


def test_strict_json_writes_null_for_nan_and_infinities():
    from ringtrain.workloads.summary import dumps
    text = dumps({"a": float("nan"), "b": [1.5, float("inf")], "c": {"d": -float("inf")}})
    assert strict_json(text) == {"a": None, "b": [1.5, None], "c": {"d": None}}


@pytest.mark.parametrize("flag,value", [("--lr", "inf"), ("--lr", "nan"), ("--warmup-epochs", "nan"),
                                        ("--fusion-threshold-mb", "nan"), ("--cycle-time-ms", "inf"),
                                        ("--seed", "-1")])
def test_float_flags_refuse_inf_and_nan_and_the_seed_a_negative(flag, value):
    assert_one_line_error(["ringtrain", flag, value], flag, code=2)
