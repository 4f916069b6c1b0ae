"""Checkpoints: standard files, written by rank 0, resumable on any rank count."""
import pytest

from helpers import ONE_THREAD, assert_same_weights, horovodrun, last_json, run_ok, weights

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

# Momentum, so that a resume that lost optimizer state would show in the weights.
EXACT = ["--model", "mnist_mlp", "--optimizer", "momentum", "--lr", "0.02", "--no-lr-scaling",
         "--warmup-epochs", "0", "--log-every", "1000", *ONE_THREAD]


def test_resume_on_a_different_rank_count_continues_exactly(tmp_path, mnist_records):
    """2 ranks x 16 for 6 steps, then 1 rank x 32 for 6 more == 2 ranks x 16 for 12
    steps, reading TFRecords (record by record: a seeded shuffle buffer, each
    rank every other record): a resume reads exactly the samples it would have.
    The checkpoints are standard TF checkpoints that hold the progress. The newest
    (step 9) is cut short, so the resume falls back to the one before it, whose
    position it reads: the data's position is the checkpoint's."""
    import tensorflow as tf
    straight, resumed = str(tmp_path / "straight-{rank}.npz"), str(tmp_path / "resumed-{rank}.npz")
    ckpt = tmp_path / "ckpt"
    data = ["--data", mnist_records, "--shard-by", "record"]
    run_ok(horovodrun(2, *EXACT, *data, "--batch-size", "16", "--steps", "12", "--dump-weights", straight))
    summary = last_json(run_ok(horovodrun(2, *EXACT, *data, "--batch-size", "16", "--steps", "9",
                                          "--checkpoint-every", "6", "--checkpoint-dir", str(ckpt))))
    assert summary["checkpoint"].endswith("ckpt-9")
    reader = tf.train.load_checkpoint(summary["checkpoint"])
    assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 9
    assert reader.get_tensor("samples_in_epoch/.ATTRIBUTES/VARIABLE_VALUE") == 9 * 2 * 16
    assert tf.train.get_checkpoint_state(str(ckpt)).all_model_checkpoint_paths[-2].endswith("ckpt-6")
    newest = next(ckpt.glob("ckpt-9.data-*"))
    newest.write_bytes(newest.read_bytes()[:100])  # as a crash mid-write would leave it
    out = run_ok(["ringtrain", *EXACT, *data, "--batch-size", "32", "--steps", "12",
                  "--checkpoint-dir", str(ckpt), "--resume", "--dump-weights", resumed])
    assert "steps 6..12" in out
    assert last_json(out)["steps"] == 12
    assert_same_weights(weights(straight, 0), weights(resumed, 0))


def test_resume_from_an_empty_folder_starts_fresh_and_of_another_models_checkpoint_is_one_line(tmp_path):
    from helpers import assert_one_line_error
    ckpt = tmp_path / "ckpt"
    assert "steps 0..2" in run_ok(["ringtrain", *EXACT, "--steps", "2", "--checkpoint-dir", str(ckpt), "--resume"])
    assert_one_line_error(["ringtrain", "--model", "mnist_cnn", "--steps", "2", *ONE_THREAD,
                           "--resume", str(ckpt / "ckpt-2")], "cannot restore checkpoint", within=60, code=2)
