"""Models from outside the catalog: a keras.applications network by name and
the user's own factory (examples/my_model.py, the README's example), in ring
mode, TF collective mode, TF2 PS and towers; what batch norm's statistics do in each;
`ringtrain-bench profile`; and the one-line refusals."""
import json
import os
import sys

import numpy as np
import pytest

from helpers import (BENCH, BIN, ENV, ONE_THREAD, REPO, assert_one_line_error, assert_same_weights, last_json, mpirun,
                     run_ok, weights)

EXAMPLES_ENV = dict(ENV, PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(REPO, "examples"),
                                                                   ENV.get("PYTHONPATH")])))
RINGTRAIN = os.path.join(BIN, "ringtrain")
FACTORY = ["--model", "my_model:small_cnn"]
# SGD, no lr scaling or warm-up: the updates are a pure function of the data.
DETERMINISTIC = [*FACTORY, "--optimizer", "sgd", "--lr", "0.05", "--no-lr-scaling", "--warmup-epochs", "0",
                 "--log-every", "1000", "--steps", "6", *ONE_THREAD]
USUAL_FIELDS = {"images_per_sec", "images_per_sec_per_worker", "step_time_sec", "test_accuracy", "train_loss",
                "steps", "world_size", "gradient_bytes", "model", "wall_time_sec"}


def moving_statistics(arrays, model="my_model:small_cnn"):
    """Which of a --dump-weights' arrays (model.variables order) are not
    trained (batch norm's moving statistics), read from the model itself."""
    import keras
    from ringtrain.workloads import user_models
    sys.path.insert(0, os.path.join(REPO, "examples"))
    try:
        built = user_models.build(model, (32, 32, 3), 10)
    finally:
        sys.path.pop(0)
    trainable = {id(v) for v in built.trainable_variables}
    assert len(built.variables) == len(arrays)
    assert all(isinstance(v, keras.Variable) for v in built.variables)
    return [i for i, v in enumerate(built.variables) if id(v) not in trainable]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sync_batch_norm_makes_two_ranks_one_process_on_the_global_batch(tmp_path):
    """--sync-batch-norm: 2 ranks x batch 8 equal one process on batch 16 in
    every weight, batch norm's moving statistics included, in ring mode and
    in TF's collective mode; the factory's summary has the usual fields."""
    one, ring, collective = (str(tmp_path / f"{name}-{{rank}}.npz") for name in ("one", "ring", "collective"))
    run_ok([RINGTRAIN, *DETERMINISTIC, "--sync-batch-norm", "--batch-size", "16", "--dump-weights", one],
           env=EXAMPLES_ENV)
    out = run_ok(mpirun(2, *DETERMINISTIC, "--sync-batch-norm", "--batch-size", "8", "--dump-weights", ring),
                 env=EXAMPLES_ENV, timeout=240)
    summary = last_json(out)
    assert USUAL_FIELDS <= set(summary) and summary["world_size"] == 2 and summary["model"] == "my_model:small_cnn"
    # without --data, a model of your own trains on the embedded MNIST, resized to its input (32x32x3)
    assert summary["data"] == "mnist" and summary["data_source"].startswith("embedded:")
    assert "read at 32x32x3" in out
    run_ok(mpirun(2, *DETERMINISTIC, "--sync-batch-norm", "--batch-size", "8", "--backend", "tf-collective",
                  "--dump-weights", collective), env=EXAMPLES_ENV, timeout=240)
    reference = weights(one, 0)
    assert len(moving_statistics(reference)) == 2  # the example's one batch norm: mean and variance
    assert_same_weights(weights(ring, 0), weights(ring, 1), exact=True)
    for dump in (ring, collective):
        assert_same_weights(weights(dump, 0), reference)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_keras_resnet50_trains_under_mpirun_with_every_weight_identical_on_both_ranks(tmp_path):
    """keras:ResNet50 (weights=None, 32x32 synthetic images) under mpirun -np 2:
    the trained weights, and batch norm's moving statistics (averaged over the
    ranks every step), are identical on both ranks."""
    dump = str(tmp_path / "w-{rank}.npz")
    out = run_ok(mpirun(2, "--model", "keras:ResNet50", "--batch-size", "2", "--steps", "1", "--warmup-steps", "0",
                        "--optimizer", "sgd", *ONE_THREAD, "--dump-weights", dump), timeout=400)
    summary = last_json(out)
    assert USUAL_FIELDS <= set(summary) and summary["steps"] == 1 and summary["world_size"] == 2
    assert summary["gradient_bytes"] == 4 * 23_555_082  # ResNet50's 25,583,592 less its 1000-class head, at 10
    rank0, rank1 = weights(dump, 0), weights(dump, 1)
    statistics = moving_statistics(rank0, "keras:ResNet50")
    assert len(statistics) == 2 * 53  # 53 batch norms
    assert_same_weights(rank0, rank1, exact=True)
    assert all(not np.array_equal(rank0[i], np.zeros_like(rank0[i])) for i in statistics[::2])  # means moved


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_batch_norm_statistics_are_the_workers_average_in_ring_and_tf_collective_modes(tmp_path):
    """Without --sync-batch-norm each worker normalises by its own batch, and
    the moving statistics are averaged over the workers every step: after one
    step, 2 ranks x batch 8 hold, on both ranks, the moving mean that one
    process on batch 16 computes (the mean of the two halves' means); the
    variance, a mean of within-batch variances, is at most one process's."""
    one_step = [*FACTORY, "--optimizer", "sgd", "--steps", "1", "--warmup-steps", "0", *ONE_THREAD]
    one = str(tmp_path / "one-{rank}.npz")
    run_ok([RINGTRAIN, *one_step, "--batch-size", "16", "--dump-weights", one], env=EXAMPLES_ENV)
    mean, variance = moving_statistics(weights(one, 0))
    reference = weights(one, 0)
    for backend in ("horovod", "tf-collective"):
        dump = str(tmp_path / f"{backend}-{{rank}}.npz")
        run_ok(mpirun(2, *one_step, "--batch-size", "8", "--backend", backend, "--dump-weights", dump),
               env=EXAMPLES_ENV, timeout=240)
        rank0, rank1 = weights(dump, 0), weights(dump, 1)
        assert_same_weights(rank0, rank1, exact=True)
        np.testing.assert_allclose(rank0[mean], reference[mean], atol=1e-6, err_msg=backend)
        assert not np.allclose(rank0[mean], 0), backend  # (it moved: the initial mean is 0)
        assert (rank0[variance] <= reference[variance] + 1e-6).all(), backend


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_parity_runs_ringtrain_and_the_plain_horovod_script_side_by_side(tmp_path):
    """`ringtrain-bench parity`, one tiny round: all under mpirun -np 2 on the
    same network, the plain script with ringtrain's OpenMPI settings and with
    OpenMPI's defaults; their images/s and the ratios in the report."""
    out = run_ok([*BENCH, "parity", "--model", "mnist_cnn", "--batch-size", "4", "--steps", "4",
                  "--warmup-steps", "1", "--rounds", "1", "--out", str(tmp_path)], timeout=360)
    result = json.loads((tmp_path / "parity.json").read_text())
    [row] = result["rows"]
    assert row["plain_images_per_sec"] > 0 and row["ringtrain_images_per_sec"] > 0
    assert row["ratio"] == pytest.approx(row["ringtrain_images_per_sec"] / row["plain_images_per_sec"])
    assert row["settings_ratio"] == pytest.approx(row["plain_images_per_sec"]
                                                  / row["plain_ompi_defaults_images_per_sec"])
    printed = lambda tag: [line for line in (tmp_path / "runs" / f"{tag}-r1.log").read_text().splitlines()
                           if line.startswith("{")][-1]
    settings = {tag: json.loads(printed(tag))["mpi_settings"] for tag in ("plain", "plain-ompi-defaults")}
    assert settings["plain"]["OMPI_MCA_mpi_yield_when_idle"] == "1"
    assert "OMPI_MCA_mpi_yield_when_idle" not in settings["plain-ompi-defaults"]
    ours = json.loads((tmp_path / "runs" / "ringtrain-r1.json").read_text())
    assert ours["model"] == "mnist_cnn" and ours["world_size"] == 2 and ours["timed_samples"] == 2 * 4 * 3
    assert json.loads(printed("plain"))["input"] == "constant"  # (the default: one batch)
    assert "ringtrain ÷ plain" in out and "ringtrain ÷ plain" in (tmp_path / "report.html").read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_parity_runs_tf_collective_mode_against_the_plain_mwms_script(tmp_path):
    """`ringtrain-bench parity --recipe tf-collective`, one tiny round on mnist_cnn: both under
    mpirun -np 2, each worker's timed samples counted, the ratio in the report; the plain
    script reads its images through tf.data (--plain-input), as ringtrain does."""
    out = run_ok([*BENCH, "parity", "--recipe", "tf-collective", "--model", "mnist_cnn", "--batch-size", "8",
                  "--steps", "4", "--warmup-steps", "1", "--rounds", "1", "--plain-input", "tf.data",
                  "--out", str(tmp_path)], timeout=240)
    [row] = json.loads((tmp_path / "parity.json").read_text())["rows"]
    assert row["ratio"] == pytest.approx(row["tf_collective_images_per_sec"] / row["plain_images_per_sec"])
    plain = json.loads([line for line in (tmp_path / "runs" / "plain-mwms-r1.log").read_text().splitlines()
                        if line.startswith("{")][-1])
    ours = json.loads((tmp_path / "runs" / "tf-collective-r1.json").read_text())
    assert plain["world_size"] == ours["world_size"] == 2
    assert plain["timed_samples"] == ours["timed_samples"] == 2 * 8 * 3
    assert ours["mode"] == "tf-collective" and ours["model"] == "mnist_cnn"
    assert plain["input"] == "tf.data" and "the plain script reading its images through tf.data" in out
    assert "ringtrain ÷ plain MWMS" in out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_factory_trains_under_tf2_parameter_servers_and_towers_with_one_shared_copy_of_the_statistics(tmp_path):
    """TF2 PS keeps batch norm's statistics on a PS task, towers on the CPU: one
    copy, which every worker's (tower's) step updates from its own batch."""
    dump = str(tmp_path / "ps-{rank}.npz")
    out = run_ok([os.path.join(BIN, "ps-baseline"), "launch", "--api", "tf2", "--num-ps", "1", "--num-workers", "2",
                  *FACTORY, "--steps", "8", "--batch-size", "16", "--log-every", "4", *ONE_THREAD,
                  "--dump-weights", dump], env=EXAMPLES_ENV, timeout=240)
    summary = last_json(out)
    assert USUAL_FIELDS - {"images_per_sec_per_worker", "step_time_sec", "gradient_bytes"} <= set(summary)
    assert summary["mode"] == "ps-tf2" and summary["model"] == "my_model:small_cnn"
    assert summary["steps"] == 16 and 0 <= summary["test_accuracy"] <= 1
    towers = str(tmp_path / "towers-{rank}.npz")
    run_ok([os.path.join(BIN, "ps-baseline"), "towers", "--towers", "2", *FACTORY, "--steps", "4",
            "--batch-size", "8", *ONE_THREAD, "--dump-weights", towers], env=EXAMPLES_ENV, timeout=240)
    for path in (dump, towers):
        arrays = weights(path, 0)
        mean, variance = moving_statistics(arrays)
        assert np.isfinite(arrays[mean]).all() and np.isfinite(arrays[variance]).all(), path
        # updated by the steps (a mean of 0 and a variance of 1 are where they start)
        assert not np.allclose(arrays[mean], 0) and not np.allclose(arrays[variance], 1), path


def test_profile_of_the_catalog_and_of_keras_resnet50_agree(tmp_path):
    """The catalog's resnet50 (parameter shapes only) and keras.applications'
    ResNet50 at 1000 classes: the same 25,583,592 trainable parameters in the
    same 214 tensors (Keras builds a block's projection shortcut after its
    first convolution, the catalog before it: the order differs)."""
    results = {}
    for name, extra in (("resnet50", []), ("keras:ResNet50", ["--num-classes", "1000", "--step-ms", "100"])):
        path = str(tmp_path / f"{name.replace(':', '_')}.json")
        out = run_ok([*BENCH, "profile", "--model", name, "--measure-steps", "0", "--out", path, *extra], timeout=120)
        assert "trainable parameters: 25,583,592" in out, out
        with open(path) as f:
            results[name] = json.load(f)
    catalog, keras_ = results["resnet50"], results["keras:ResNet50"]
    assert catalog["trainable_parameters"] == keras_["trainable_parameters"] == 25_583_592
    assert catalog["tensors"] == keras_["tensors"] == 214
    shapes = lambda p: [tuple(s) for _, variables in p["layers"] for _, s in variables]
    assert sorted(shapes(catalog)) == sorted(shapes(keras_))
    assert keras_["step_ms"] == 100 and keras_["step_ms_source"] == "given (--step-ms)"


def tiny_profile(tmp_path, model="my_net"):
    """A gradient profile as ringtrain-bench profile writes one: two layers, a 20 ms step."""
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"model": model, "step_ms": 20, "layers": [
        ["dense", [["kernel", [784, 32]], ["bias", [32]]]], ["head", [["kernel", [32, 10]], ["bias", [10]]]]]}))
    return str(path)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_profile_given_to_simulate_gpu_is_the_model_it_trains(tmp_path):
    profile = tiny_profile(tmp_path)
    summary = last_json(run_ok([RINGTRAIN, "--simulate-gpu", profile, "--steps", "4", "--warmup-steps", "1",
                                *ONE_THREAD], timeout=100))
    assert summary["model"] == profile
    assert summary["gradient_bytes"] == 4 * (784 * 32 + 32 + 32 * 10 + 10)  # the profile's tensors
    assert min(summary["step_time_sec"]) >= 0.020  # at the profile's step time


def test_a_profile_given_to_simulate_gpu_takes_no_other_model_and_a_bad_one_is_one_line(tmp_path):
    profile = tiny_profile(tmp_path)
    for tool in ("ringtrain", "ps-baseline", "ringtrain-bench"):
        words = ["launch"] if tool == "ps-baseline" else ["scaling", "--out", str(tmp_path / "r")] \
            if tool == "ringtrain-bench" else []
        assert_one_line_error([os.path.join(BIN, tool), *words, "--model", "mnist_mlp", "--simulate-gpu", profile],
                              "is my_net's profile, its tensors and its step time: drop --model mnist_mlp",
                              code=2, env=EXAMPLES_ENV)
    assert_one_line_error([RINGTRAIN, "--simulate-gpu", str(tmp_path / "none.json")],
                          f"--simulate-gpu {tmp_path / 'none.json'}: cannot read the profile", code=2)
    (tmp_path / "bad.json").write_text("{")
    assert_one_line_error([RINGTRAIN, "--simulate-gpu", str(tmp_path / "bad.json")], "is not a gradient profile",
                          code=2)


# (The ones that import TensorFlow, to find the model, take seconds each: not in the quick suite.)
SLOW = pytest.mark.slow


@pytest.mark.parametrize("args, expected", [
    pytest.param(["ringtrain", "--model", "keras:NoSuchNet"], "keras.applications has no NoSuchNet", marks=SLOW),
    pytest.param(["ringtrain", "--model", "no_such_module:build"], "cannot import no_such_module", marks=SLOW),
    pytest.param(["ringtrain", "--model", "my_model:no_such_function"], "has no function no_such_function",
                 marks=SLOW),
    pytest.param(["ringtrain", "--model", "keras:ResNet50", "--image-shape", "8x8x3", "--steps", "1"],
                 "give --image-shape", marks=SLOW),
    (["ringtrain", "--model", "cifar_resnet", "--sync-batch-norm", "--steps", "1"],
     "cifar_resnet is one of the catalog's own models"),
    pytest.param(["ps-baseline", "towers", "--model", "my_model:small_cnn", "--sync-batch-norm"], "drop it",
                 marks=SLOW),
    (["ringtrain", "--model", "mnist_mlp", "--image-shape", "32x32x3"], "mnist_mlp takes 28x28x1 images"),
    (["ringtrain", "--model", "a b"], "unknown model 'a b'"),
    (["ps-baseline", "launch", "--model", "my_model:small_cnn"], "use --api tf2"),
    (["ps-baseline", "launch", "--api", "tf2", "--placement", "partitioned", "--model", "my_model:small_cnn"],
     "use --placement round_robin"),
    (["ps-baseline", "launch", "--api", "tf2", "--model", "my_model:small_cnn", "--sync-batch-norm"],
     "--sync-batch-norm needs workers that train one global batch together"),
    (["ringtrain-bench", "parity", "--model", "resnet50", "--out", "/tmp/never"], "give keras:NAME"),
])
def test_bad_model_input_is_one_line(args, expected):
    assert_one_line_error([os.path.join(BIN, args[0]), *args[1:]], expected, within=30, env=EXAMPLES_ENV)
