"""`ps-baseline towers --towers K`: single-machine multi-device training, as
the classic distributed-TensorFlow tutorials describe it (TF's
cifar10_multi_gpu_train): one process, one tower of the model per device,
the towers' gradients averaged on the CPU and applied once.

The K devices are K GPUs where there are that many; otherwise the CPU is split
into K logical devices, so that the same code path runs on a CPU-only machine.
Everything else is the shared loop's (workloads/loop.py). Lines that the
towers add are marked `# Towers:`.
"""
from ringtrain.workloads import config as run_config
from ringtrain.workloads import loop
from ringtrain.workloads.mode import Alone, Identity, Mode, StepResult, StragglerWait
from ringtrain.common.parsing import add_version, positive_int
from ringtrain.workloads.flags import OneLineParser, add_training_flags, load_training_data, refuse_sync_batch_norm
from ringtrain.workloads.outputs import check_outputs
from ringtrain.workloads.preemption import PREEMPTION
from ringtrain.workloads.sharding import steps_per_epoch
from ringtrain.workloads.straggler import check as check_straggler

PROG = "ps-baseline towers"


def parser():
    p = OneLineParser(prog=PROG, description="One process, one tower per device (K GPUs, or the CPU split "
                      "into K logical devices): gradients averaged on the CPU, applied once per step.")
    add_version(p)
    p.add_argument("--towers", type=positive_int, default=2, metavar="K", help="towers (default %(default)s)")
    add_training_flags(p)
    return p


def tower_devices(tf, k):
    """K GPUs if there are as many, else the CPU split into K logical devices.
    Must run before TF's runtime starts."""
    from ringtrain.workloads.devices import gpu_count
    if gpu_count(tf) >= k:  # Towers: one GPU each (with GPUs assumed by name, TF places their ops on the CPU)
        return [f"/device:GPU:{i}" for i in range(k)]
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * k)
    return [d.name for d in tf.config.list_logical_devices("CPU")][:k]


def main(argv):
    args = parser().parse_args(argv)
    PREEMPTION.install(PROG)  # a scheduler's signal: ends at once, or, once training runs, saves first
    check_outputs(args)
    dataset = load_training_data(args)  # numpy: bad input fails before TF loads
    check_straggler(args.straggler, args.towers, "tower")
    refuse_sync_batch_norm(args, "towers share their variables but not their batches' statistics")
    from ringtrain.workloads.tfenv import import_tensorflow_quietly
    import_tensorflow_quietly()
    return train(run_config.from_args(args), args.towers, dataset)


def train(config, k, dataset):
    import tensorflow as tf
    if config.data.threads:
        # Towers: one pool thread per tower, so the towers compute side by side.
        tf.config.threading.set_intra_op_parallelism_threads(config.data.threads)
        tf.config.threading.set_inter_op_parallelism_threads(config.data.threads * k)
    devices = tower_devices(tf, k)

    # Towers: the variables, the optimizer and the averaging live on the CPU.
    with tf.device("/device:CPU:0"):
        model = config.model.build()
        optimizer = config.optimizer.keras()
        optimizer.build(model.trainable_variables)
    loop.Training(config, dataset, Towers(tf, config, dataset, model, optimizer, devices)).run()
    return 0


class Towers(Mode):
    """The towers' one process, as the shared loop runs it."""

    def __init__(self, tf, config, dataset, model, optimizer, devices):
        from ringtrain.workloads.checkpoints import ObjectStore
        from ringtrain.workloads.evaluation import metrics_of
        k = len(devices)
        self.tf, self.config, self.dataset, self.model, self.devices = tf, config, dataset, model, devices
        self.identity = Identity("towers", PROG, k, local_workers=tuple(range(k)), worker_word="tower",
                                 device=", ".join(devices))
        self.agree, self.straggler = Alone(), StragglerWait.IN_STEP
        self.store = ObjectStore(config.loop.keep_checkpoints, model=model, optimizer=optimizer)
        self.steps_per_epoch = steps_per_epoch(len(dataset.train_labels), k, config.data.batch_size)
        self.describe = f"{k} tower(s) on {', '.join(devices)} x batch {config.data.batch_size}"
        self.train_step, self.evaluate = make_train_step(tf, model, optimizer, devices), metrics_of(model)

    def start(self, restored):
        from ringtrain.workloads.checkpoints import Progress
        return restored or Progress()

    def batches(self, start):
        from ringtrain.workloads import pipeline
        c, k = self.config.data, self.identity.workers
        # Towers: each tower reads its own disjoint shard of every epoch, as a worker would.
        towers = [pipeline.batches_from(self.dataset, i, k, c.batch_size, c.seed, start.epoch,
                                        start.batches_done(k, c.batch_size), c.threads) for i in range(k)]
        for parts in zip(*towers):
            yield parts[0][0], parts[0][1], [batch for _, _, batch in parts]

    def step(self, number, batches, straggler):
        # --straggler: how many times its compute each tower waits after it, this step
        loss_sum, samples, applied, broke, waited = self.train_step(batches, self.tf.constant(straggler))
        return StepResult(loss_sum, samples, bool(applied), waited=waited.numpy(),
                          broke=tuple(int(i) for i in self.tf.where(broke).numpy().ravel()))

    def weights(self):
        from ringtrain.workloads import models
        return models.named_weights(self.model)

    def summary_fields(self, reports):
        from ringtrain.workloads import models
        return dict(devices=self.devices, gradient_bytes=models.gradient_bytes(self.model))


def make_train_step(tf, model, optimizer, devices):
    from ringtrain.workloads import models
    from ringtrain.workloads.gradients import apply_if_finite
    from ringtrain.workloads.straggler import wait_after
    from ringtrain.workloads.tfenv import step_function
    k = len(devices)

    @step_function
    def train_step(batches, extra):
        grads, loss_sums, counts, waits = [], [], [], []
        for i, (device, (images, labels, weights, global_count)) in enumerate(zip(devices, batches)):
            # Towers: forward and backward of this tower's batch on its own device.
            with tf.device(device):
                started = tf.timestamp()
                with tf.control_dependencies([started]), tf.GradientTape() as tape:
                    loss_sum = models.weighted_loss_sum(model, images, labels, weights)
                    # the global batch's mean per-tower share, as in every other mode
                    loss = loss_sum / (global_count / k)
                tower_grads, waited = wait_after(tf, tape.gradient(loss, model.trainable_variables),
                                                 started, extra[i])  # --straggler
            grads.append(tower_grads)
            loss_sums.append(loss_sum)
            counts.append(tf.reduce_sum(weights))
            waits.append(waited)
        # Towers: the mean gradient, on the CPU, applied once (if finite).
        with tf.device("/device:CPU:0"):
            mean = [tf.add_n(list(per_var)) / k for per_var in zip(*grads)]
            applied = apply_if_finite(optimizer, mean, model.trainable_variables)
            broke = tf.logical_not(tf.math.is_finite(tf.stack(loss_sums)))
            return tf.add_n(loss_sums), tf.add_n(counts), applied, broke, tf.stack(waits)

    return train_step
