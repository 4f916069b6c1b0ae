"""Adding a mode is writing its module and registering it, nothing else.

The diff below adds a trivial mode, `solo` (one process trains alone), to a
copy of the checkout: a new module, and one entry in the registry. With
nothing more, `ringtrain --backend solo` trains through the shared loop, and
the bench lists it and knows how to launch it."""
import os
import shutil
import subprocess
import sys

import pytest

from helpers import ENV, ONE_THREAD, REPO, last_json

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SOLO_MODULE = '''"""`ringtrain --backend solo`: one process trains alone (a trivial mode)."""
from ringtrain.workloads import loop
from ringtrain.workloads.checkpoints import ObjectStore, Progress
from ringtrain.workloads.mode import Alone, Identity, Mode, StepResult
from ringtrain.workloads.sharding import updates_per_epoch


def main(config, args, dataset):
    from ringtrain.workloads.tfenv import import_tensorflow_quietly
    import_tensorflow_quietly()
    model = config.model.build()
    optimizer = config.optimizer.keras()
    optimizer.build(model.trainable_variables)
    loop.Training(config, dataset, Solo(config, dataset, model, optimizer)).run()
    return 0


class Solo(Mode):
    def __init__(self, config, dataset, model, optimizer):
        import tensorflow as tf
        from ringtrain.workloads import models
        from ringtrain.workloads.evaluation import metrics_of
        self.config, self.dataset, self.model = config, dataset, model
        self.identity, self.agree = Identity("solo", "ringtrain", workers=1), Alone()
        self.store = ObjectStore(config.loop.keep_checkpoints, model=model, optimizer=optimizer)
        self.steps_per_epoch = updates_per_epoch(dataset, 1, config.data.batch_size, config.data.accumulate)
        self.evaluate = metrics_of(model)

        @tf.function
        def train_step(images, labels, weights, global_count):
            # (an update is K micro-batches of b: this mode trains on them as one batch)
            images, labels, weights = (tf.reshape(t, [-1, *t.shape[2:]]) for t in (images, labels, weights))
            with tf.GradientTape() as tape:
                loss_sum = models.weighted_loss_sum(model, images, labels, weights)
                loss = loss_sum / global_count
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss_sum, tf.reduce_sum(weights)
        self.train_step = train_step

    def start(self, restored):
        return restored or Progress()

    def batches(self, start):
        from ringtrain.workloads import pipeline
        c = self.config.data
        return pipeline.batches_from(self.dataset, 0, 1, c, start.epoch, start.batches_done(1, c.per_update))

    def step(self, number, batch, straggler):
        return StepResult(*self.train_step(*batch))

    def weights(self):
        from ringtrain.workloads import models
        return models.named_weights(self.model)
'''
REGISTRATION = '''    RegisteredMode("solo", "solo", "ringtrain --backend solo", "ringtrain", {"backend": "solo"},
                   "ringtrain.solo:main", "mpirun", ("--backend", "solo"), pinning="none"),
'''


@pytest.fixture(scope="module")
def checkout_with_solo(tmp_path_factory):
    """A copy of the checkout's two packages, with the diff applied."""
    root = tmp_path_factory.mktemp("with-solo")
    for package in ("ringtrain", "ps_baseline"):
        shutil.copytree(os.path.join(REPO, package), root / package, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "ringtrain" / "solo.py").write_text(SOLO_MODULE)
    registry = root / "ringtrain" / "modes.py"
    text = registry.read_text()
    end = text.index("\n)\n", text.index("MODES = ("))  # the registry's last entry
    registry.write_text(text[:end + 1] + REGISTRATION + text[end + 1:])
    return root


def python(root, *args, timeout=180):
    """This venv's Python with the copy first on the path (a plain checkout imports as the package)."""
    env = dict(ENV, PYTHONPATH=str(root))
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_new_mode_trains_through_the_shared_loop(checkout_with_solo, tmp_path):
    summary = tmp_path / "solo.json"
    done = python(checkout_with_solo, "-m", "ringtrain", "--backend", "solo", "--model", "mnist_mlp", "--steps", "20",
                  "--log-every", "10", *ONE_THREAD, "--checkpoint-dir", str(tmp_path / "ckpt"),
                  "--summary-json", str(summary))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = last_json(summary.read_text())
    # the loop's own work: its summary, the evaluation, a checkpoint at the last step
    assert result["mode"] == "solo" and result["steps"] == 20 and result["world_size"] == 1, result
    assert result["test_accuracy"] > 0.5 and result["checkpoint"].endswith("ckpt-20"), result
    assert "epoch 1 step 20/20" in done.stdout


def test_the_command_and_the_bench_know_it(checkout_with_solo):
    script = """
import json
from ringtrain import cli, modes
from ringtrain.bench import bench_modes, scaling, sites
cfg = dict(model="mnist_mlp", data="synthetic", steps=3, threads=1, modes=["solo"], np=[1])
print(json.dumps({"backends": modes.backends(), "bench": list(scaling.MODES),
                  "help": cli.parser().format_help(),
                  "command": scaling.command("solo", 2, 0, cfg, 16, "s.json", sites.this_machine(), ".")}))
"""
    done = python(checkout_with_solo, "-c", script, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    found = last_json(done.stdout)
    assert "solo" in found["backends"] and "solo" in found["bench"] and "solo" in found["help"]
    command = found["command"]
    assert command[0].endswith("mpirun") and command[command.index("--backend") + 1] == "solo", command
