"""Horovod's Keras API on Keras 3 (patch 0007), under real mpirun and
horovodrun --gloo: every call of Horovod's Keras recipe, numbers against one
process on the global batch; the elastic recipe losing a rank across hosts;
the example; the synthetic ResNet-50 recipe."""
import os
import signal

import pytest

from helpers import BIN, REPO, SCRIPTS, Tasks, json_in, on_two_ranks, run_ok

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
PYTHON = os.path.join(BIN, "python")
FLOAT = 1e-5  # weights after a few steps, against the same steps in one process


@pytest.fixture(scope="module", params=["mpi", "gloo"])
def keras_api(request, tmp_path_factory):
    """tests/scripts/keras_api.py once per launcher: every check on both ranks."""
    lines = on_two_ranks("keras_api.py", str(tmp_path_factory.mktemp("keras")), gloo=request.param == "gloo")
    checks = {(line["rank"], line["check"]): line for line in lines}
    failed = [f"rank {r} {name}: {line['detail']}" for (r, name), line in checks.items() if not line["ok"]]
    assert not failed, "\n".join(failed)
    assert {r for r, _ in checks} == {0, 1}
    return request.param, checks


def each_rank(keras_api, check):
    launcher, checks = keras_api
    return [checks[(rank, check)] for rank in (0, 1)]


def test_fit_and_train_on_batch_equal_one_process_on_the_global_batch(keras_api):
    for check in ("fit_distributed_optimizer", "fit_horovod_keras", "train_on_batch"):
        for line in each_rank(keras_api, check):
            assert line["vs_reference"] < FLOAT and line["across_ranks"] == 0, line
    assert all(line["iterations"] == 3 for line in each_rank(keras_api, "fit_distributed_optimizer"))


def test_fp16_compression_stays_within_half_precision_of_one_process(keras_api):
    for line in each_rank(keras_api, "fp16_compression"):
        assert line["vs_reference"] < 1e-3 and line["across_ranks"] == 0, line


def test_gradient_aggregation_makes_one_update_of_the_aggregated_batches(keras_api):
    """backward_passes_per_step=2: 4 passes, 2 updates, each one process's step on
    the 4 passes' batches; average_aggregated_gradients=False sums them."""
    for line in each_rank(keras_api, "gradient_aggregation"):
        for tag in ("averaged", "summed"):
            assert line[f"{tag}_vs_reference"] < FLOAT and line[f"{tag}_across_ranks"] == 0, line
            assert line[f"{tag}_iterations"] == 4, line


def test_gradient_aggregation_keeps_local_variables_local(keras_api):
    for line in each_rank(keras_api, "gradient_aggregation_with_local_variables"):
        assert line["averaged_vs_reference"] < FLOAT and line["summed_vs_reference"] < FLOAT, line
        assert line["local_layer_across_ranks"] > 1e-3, line  # each rank's own data moved it


def test_sparse_gradients_allgathered_or_as_dense_equal_one_process(keras_api):
    for line in each_rank(keras_api, "sparse_gradients"):
        for tag in ("sparse", "sparse_as_dense"):
            assert line[f"{tag}_vs_reference"] < FLOAT and line[f"{tag}_across_ranks"] == 0, line


def test_adasum_combines_gradients_by_adasum_under_mpi_and_says_why_not_under_gloo(keras_api):
    launcher, _ = keras_api
    for line in each_rank(keras_api, "adasum_op"):
        if launcher == "gloo":
            assert line["error"].startswith("ValueError: ") and "needs MPI" in line["error"], line
            assert "\n" not in line["error"] and "mpirun" in line["error"], line
        else:
            assert line["vs_reference"] < FLOAT and line["across_ranks"] == 0, line
            assert line["vs_averaging"] > 1e-3, line  # not the average


def test_partial_distributed_optimizer_keeps_local_layers_local(keras_api):
    for line in each_rank(keras_api, "partial_distributed_optimizer"):
        for api in ("horovod_tensorflow_keras", "horovod_keras"):
            assert line[f"{api}_vs_reference"] < FLOAT and line[f"{api}_shared_across_ranks"] == 0, line
            assert line[f"{api}_local_across_ranks"] > 1e-3, line


def test_broadcast_callback_sends_the_roots_values_but_not_local_variables(keras_api):
    for line in each_rank(keras_api, "broadcast_callback_with_local_variables"):
        assert line["shared_minus_root"] == 0 and line["local_minus_own"] == 0, line


def test_metric_average_callback_logs_the_mean_of_the_ranks(keras_api):
    for line in each_rank(keras_api, "metric_average_callback"):
        assert line["minus_mean_of_ranks"] < 1e-6 and line["across_ranks"] == 0, line
        assert line["ranks_own_differ_by"] > 1e-3, line  # there was something to average


def test_learning_rate_callbacks_follow_horovods_formulas_with_momentum_correction(keras_api):
    for line in each_rank(keras_api, "learning_rate_callbacks"):
        assert line["lr_minus_formula"] < 1e-7, line
        assert line["vs_reference"] < FLOAT and line["across_ranks"] == 0, line


def test_best_model_checkpoint_keeps_the_best_epoch_and_load_model_wraps_it(keras_api):
    for line in each_rank(keras_api, "best_model_checkpoint"):
        assert line["saved_minus_best_epoch"] == 0 and line["loaded_distributed"], line


def test_load_model_of_a_keras_file_goes_on_training_as_one_process_would(keras_api):
    for line in each_rank(keras_api, "load_model"):
        assert line["optimizer_state_after_load"] == 0 and line["loaded_distributed"], line
        assert line["vs_reference"] < FLOAT and line["across_ranks"] == 0, line
        # saved as the Keras class it wraps: plain Keras loads it, without Horovod
        assert line["plain_keras_loads"] == "keras.src.optimizers.sgd.SGD" and not line["plain_distributed"], line


KERAS3_WAY = {"compute_gradients": "apply_gradients()", "get_gradients": "apply_gradients()",
              "lr": "optimizer.learning_rate", "from_config_lr": "learning_rate=",
              "legacy_opts": "load without it", "not_keras3_optimizer": "keras.optimizers",
              "best_model_checkpoint_no_path": "filepath="}


def test_keras2_calls_say_in_one_line_what_keras3_has_instead(keras_api):
    for line in each_rank(keras_api, "keras2_calls"):
        assert set(line["errors"]) == set(KERAS3_WAY), line
        for call, way in KERAS3_WAY.items():
            message = line["errors"][call]
            assert "\n" not in message and way in message.split(":", 1)[1], (call, message)
        assert line["variables_call"] and line["from_config_same"], line


def test_the_keras_apis_collectives_reduce_gather_and_broadcast(keras_api):
    for line in each_rank(keras_api, "keras_collectives"):
        for api in ("horovod_tensorflow_keras", "horovod_keras"):
            assert line[f"{api}_allreduce"] == [1.5, 1.0], line  # the mean of [1, 0] and [2, 2]
            assert line[f"{api}_allgather"] == [0, 1] and line[f"{api}_broadcast"] == [6.0], line


def test_keras_state_and_its_callbacks_sync_restore_and_commit(keras_api):
    for line in each_rank(keras_api, "elastic_state"):
        assert line["sync_minus_root"] == 0 and line["synced_batch_epoch"] == [20, 10], line
        assert line["restore_minus_saved"] == 0 and line["restored_batch_epoch"] == [20, 10], line
        assert line["commit_minus_committed"] == 0 and line["committed_batch_epoch"] == [21, 11], line
        # 2 epochs of 6 batches: the batch after each, back to 0 and the epoch counted at each
        # epoch's end, a commit every 2 batches and at each epoch's end
        assert line["batches"] == list(range(6)) * 2 and line["after_fit_batch_epoch"] == [0, 2], line
        assert line["commits"] == 8, line


def test_elastic_keras_recipe_goes_on_when_a_rank_is_lost(cluster, tmp_path):
    """horovodrun --gloo's elastic mode on h1..h3 (a discovery script reading a
    file): a rank killed on h3, the other two go on from the last commit with
    KerasState and finish every epoch with identical weights."""
    from test_cluster import assert_no_process_left_on_any_host, on, pid_on
    hosts_file = tmp_path / "elastic-hosts"
    hosts_file.write_text("h1:1\nh2:1\nh3:1\n")
    discover = os.path.join(REPO, "mpi_hostfiles", "discover_hosts.sh")
    with Tasks(str(tmp_path)) as tasks:
        tasks.start("elastic", on(cluster, "h1", "env", f"RINGTRAIN_ELASTIC_HOSTS={hosts_file}",
                                  os.path.join(BIN, "horovodrun"), "--gloo", "-np", "3", "--min-np", "2",
                                  "--max-np", "3", "--host-discovery-script", discover,
                                  # the survivor whose peer died first waits this long for it (default 30 s)
                                  "--gloo-timeout-seconds", "20",
                                  PYTHON, os.path.join(SCRIPTS, "keras_elastic.py"), "8", "20"))
        tasks.wait_for_text("elastic", "epoch 2: 3 ranks", timeout=180)
        victim = pid_on(cluster, "h3", lambda argv: any(w.endswith("keras_elastic.py") for w in argv))
        assert victim, "no rank on h3"
        os.kill(victim, signal.SIGKILL)
        assert tasks.wait("elastic", 180) == 0, tasks.log("elastic")[-3000:]
        log = tasks.log("elastic")
    ends = [found for found in map(json_in, log.splitlines()) if found and "weights_sha256" in found]
    assert sorted(end["rank"] for end in ends) == [0, 1], log[-3000:]
    assert all(end["world_sizes"] == [3, 2] and end["size"] == 2 and end["epoch"] == 8 for end in ends), ends
    assert ends[0]["weights_sha256"] == ends[1]["weights_sha256"], ends
    assert "epoch 8: 2 ranks" in log
    assert_no_process_left_on_any_host(cluster)


def test_the_keras_fit_example_reaches_97_percent_on_two_ranks():
    """examples/keras_fit.py as it is, on 2 ranks for 5 epochs as `make run` trains (under mpirun:
    horovodrun's start-up checks cost seconds and test nothing of the example's)."""
    out = run_ok(["mpirun", "-np", "2", "-x", "PATH", PYTHON, os.path.join(REPO, "examples", "keras_fit.py")],
                 timeout=280)
    line = next(line for line in out.splitlines() if "test accuracy" in line)
    accuracy = float(line.split("test accuracy")[1].split("%")[0])
    assert accuracy >= 97.0, out[-2000:]
    assert "on 1000 samples" in line and "Epoch 5/5" in out


def test_the_synthetic_resnet50_keras_recipe_runs_on_two_ranks():
    """Horovod's synthetic Keras benchmark recipe (keras.applications ResNet50, random images,
    DistributedOptimizer, the two callbacks, model.fit): a few steps at 32x32 under mpirun."""
    out = run_ok(["mpirun", "-np", "2", "-x", "PATH", PYTHON, os.path.join(REPO, "examples",
                                                                          "keras_synthetic_benchmark.py"),
                  "--model", "ResNet50", "--batch-size", "2", "--steps", "3", "--warmup-steps", "1"], timeout=280)
    result = [found for found in map(json_in, out.splitlines()) if found and "images_per_sec" in found][-1]
    assert result["world_size"] == 2 and result["timed_samples"] == 2 * 2 * 2 and result["images_per_sec"] > 0


def test_parity_runs_the_keras_fit_recipe_against_the_tape_in_alternating_rounds(tmp_path):
    """`ringtrain-bench parity --recipe keras-fit`: what each round launches, and its table (no launch here:
    the synthetic ResNet-50 test above runs the Keras script, and a parity run wrote docs/results)."""
    from ringtrain.bench import parity
    cfg = {"model": "keras:ResNet50", "np": 2, "image_shape": [32, 32, 3], "batch_size": 16, "steps": 30,
           "warmup_steps": 5, "lr": 0.01, "rounds": 2, "threads": 1, "timeout": 600, "recipe": "keras-fit"}
    commands = parity.commands(cfg, str(tmp_path / "summary.json"))
    assert set(commands) == {"plain", "keras-fit"}
    for impl, script in (("plain", "plain_horovod.py"), ("keras-fit", "keras_synthetic_benchmark.py")):
        argv, env = commands[impl]
        assert argv[0].endswith("mpirun") and os.path.basename(argv[argv.index("--model") - 1]) == script
        assert argv[argv.index("--model") + 1] == "ResNet50" and env == parity.RINGTRAINS_MPI  # same settings
    rows = [{"round": r, "plain_images_per_sec": 10.0, "keras_fit_images_per_sec": 9.9 + r / 10, "ratio": 0.99 + r / 100,
             "plain_step_p50_ms": 1600.0, "keras_fit_step_p50_ms": 1610.0} for r in (1, 2)]
    text = parity.markdown({"config": cfg, "rows": rows, "median_ratio": 1.005})
    table = [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    assert table[0][:4] == ["round", "GradientTape recipe img/s", "Keras fit recipe img/s", "fit ÷ GradientTape"]
    assert table[-1][:4] == ["2", "10.0", "10.1", "1.010"] and "fit ÷ GradientTape = 1.005" in text
