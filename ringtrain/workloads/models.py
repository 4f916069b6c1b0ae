"""The models, defined once for every mode.

They are tf.Modules over raw tf.Variables, not Keras layers, because the same
definition must run in three places: a tf.function under Horovod, TF2's
ParameterServerStrategy, and the classic distributed-TensorFlow tutorials' tf.compat.v1 graph-mode PS, where
Keras 3 layers do not work. Initial values come from a seeded numpy RNG, so
every process, in every mode, starts from identical weights.

`make_variable(name, initial_value, trainable)` lets PS mode decide how a
variable is created (e.g. partitioned across PS tasks); it defaults to
tf.Variable.
"""
import numpy as np
import tensorflow as tf

from ringtrain.workloads import user_models
from ringtrain.workloads.catalog import (MODEL_SPECS, USER_IMAGE_SHAPE, model_spec, read_profile,
                                         simulated_step_ms)
from ringtrain.workloads.profiles import PROFILES
from ringtrain.workloads.simulated import SimulatedModel, layers_of

NUM_CLASSES = 10
BN_MOMENTUM, BN_EPSILON = 0.9, 1e-3


def default_variable(name, initial_value, trainable=True):
    return tf.Variable(initial_value, name=name, trainable=trainable)


class Model(tf.Module):
    """Base: seeded initialisers and the variable factory."""
    catalog_name = None  # key into workloads.catalog.MODEL_SPECS

    def __init__(self, seed=0, make_variable=default_variable, compute_dtype=tf.float32):
        super().__init__(name=type(self).__name__)
        self.image_shape = MODEL_SPECS[self.catalog_name].image_shape
        self._rng = np.random.default_rng(seed)
        self._make_variable = make_variable
        # --precision mixed_*: the weights stay float32, the compute casts them (as a Keras mixed policy does)
        self.compute_dtype = compute_dtype

    def _c(self, value):
        """A weight or an input in the compute's dtype (nothing to do in float32)."""
        return tf.cast(value, self.compute_dtype)

    def _var(self, name, value, trainable=True):
        return self._make_variable(name, value.astype(np.float32), trainable)

    def _dense(self, name, fan_in, fan_out):
        limit = np.sqrt(6.0 / (fan_in + fan_out))  # Glorot uniform, as Keras' Dense
        kernel = self._var(f"{name}/kernel", self._rng.uniform(-limit, limit, (fan_in, fan_out)))
        bias = self._var(f"{name}/bias", np.zeros(fan_out))
        return kernel, bias

    def _conv(self, name, size, c_in, c_out, bias=True):
        std = np.sqrt(2.0 / (size * size * c_in))  # He normal: ReLU nets
        kernel = self._var(f"{name}/kernel", self._rng.normal(0, std, (size, size, c_in, c_out)))
        return (kernel, self._var(f"{name}/bias", np.zeros(c_out))) if bias else (kernel,)

    def __call__(self, images, training=False):
        """images: float32 NHWC in [0, 1]. Returns logits."""
        raise NotImplementedError


class MnistMLP(Model):
    """784-500-500-10, the classic distributed-TensorFlow tutorials' model."""
    catalog_name = "mnist_mlp"

    def __init__(self, seed=0, make_variable=default_variable, compute_dtype=tf.float32):
        super().__init__(seed, make_variable, compute_dtype)
        self.layers = [self._dense("dense_1", 784, 500), self._dense("dense_2", 500, 500),
                       self._dense("logits", 500, NUM_CLASSES)]

    def __call__(self, images, training=False):
        x = tf.reshape(self._c(images), [-1, 784])
        for i, (kernel, bias) in enumerate(self.layers):
            x = tf.nn.bias_add(tf.matmul(x, self._c(kernel)), self._c(bias))
            if i < len(self.layers) - 1:
                x = tf.nn.relu(x)
        return x


class MnistCNN(Model):
    """The conv net of Horovod's TF2 MNIST example:
    conv32-conv64-maxpool-dropout(0.25)-dense128-dropout(0.5)-dense10."""
    catalog_name = "mnist_cnn"

    def __init__(self, seed=0, make_variable=default_variable, dropout=True, compute_dtype=tf.float32):
        super().__init__(seed, make_variable, compute_dtype)
        self.conv1 = self._conv("conv_1", 3, 1, 32)
        self.conv2 = self._conv("conv_2", 3, 32, 64)
        self.dense = self._dense("dense_1", 12 * 12 * 64, 128)
        self.logits = self._dense("logits", 128, NUM_CLASSES)
        self.dropout = dropout

    def __call__(self, images, training=False):
        # (bias_add, not +: TF's graph optimizer fuses conv or matmul, bias and ReLU into one
        # kernel, and the bias's gradient is one BiasAddGrad; with + they ran as three kernels
        # and a Sum, about 6 ms of a 170 ms step here: DEVELOPERS.md 4.15)
        drop = training and self.dropout
        c = self._c
        x = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(c(images), c(self.conv1[0]), 1, "VALID"), c(self.conv1[1])))
        x = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, c(self.conv2[0]), 1, "VALID"), c(self.conv2[1])))
        x = tf.nn.max_pool2d(x, 2, 2, "VALID")
        if drop:
            x = tf.nn.dropout(x, rate=0.25)
        x = tf.reshape(x, [-1, 12 * 12 * 64])
        x = tf.nn.relu(tf.nn.bias_add(tf.matmul(x, c(self.dense[0])), c(self.dense[1])))
        if drop:
            x = tf.nn.dropout(x, rate=0.5)
        return tf.nn.bias_add(tf.matmul(x, c(self.logits[0])), c(self.logits[1]))


class BatchNorm(tf.Module):
    """Batch normalisation with moving statistics as non-trainable variables.
    The moving-average updates are returned, not run, so that graph mode can
    attach them to the output (eager and tf.function run them either way)."""

    def __init__(self, model, name, channels):
        super().__init__(name=name.replace("/", "_"))
        self.gamma = model._var(f"{name}/gamma", np.ones(channels))
        self.beta = model._var(f"{name}/beta", np.zeros(channels))
        self.moving_mean = model._var(f"{name}/moving_mean", np.zeros(channels), trainable=False)
        self.moving_variance = model._var(f"{name}/moving_variance", np.ones(channels),
                                          trainable=False)

    def __call__(self, x, training, updates):
        dtype, x = x.dtype, tf.cast(x, tf.float32)  # (in float32 under mixed precision, as Keras' own)
        if training:
            mean, variance = tf.nn.moments(x, axes=[0, 1, 2])
            updates.append(self.moving_mean.assign(
                BN_MOMENTUM * self.moving_mean + (1 - BN_MOMENTUM) * mean))
            updates.append(self.moving_variance.assign(
                BN_MOMENTUM * self.moving_variance + (1 - BN_MOMENTUM) * variance))
        else:
            mean, variance = self.moving_mean, self.moving_variance
        return tf.cast(tf.nn.batch_normalization(x, mean, variance, self.beta, self.gamma, BN_EPSILON), dtype)


class CifarResNet(Model):
    """ResNet-20 for CIFAR-10 (He et al. 2016, section 4.2): 3 stages of 3 basic
    blocks with 16/32/64 filters; 1x1 projection shortcuts where shapes change."""
    catalog_name = "cifar_resnet"

    def __init__(self, seed=0, make_variable=default_variable, blocks_per_stage=3, compute_dtype=tf.float32):
        super().__init__(seed, make_variable, compute_dtype)
        self.stem = self._conv("stem", 3, 3, 16, bias=False)
        self.stem_bn = BatchNorm(self, "stem_bn", 16)
        self.blocks = []
        c_in = 16
        for stage, c_out in enumerate((16, 32, 64)):
            for b in range(blocks_per_stage):
                stride = 2 if stage > 0 and b == 0 else 1
                self.blocks.append(self._block(f"stage{stage + 1}_block{b + 1}", c_in, c_out, stride))
                c_in = c_out
        self.logits = self._dense("logits", 64, NUM_CLASSES)

    def _block(self, name, c_in, c_out, stride):
        block = {"stride": stride,
                 "conv1": self._conv(f"{name}/conv1", 3, c_in, c_out, bias=False)[0],
                 "bn1": BatchNorm(self, f"{name}/bn1", c_out),
                 "conv2": self._conv(f"{name}/conv2", 3, c_out, c_out, bias=False)[0],
                 "bn2": BatchNorm(self, f"{name}/bn2", c_out)}
        if stride != 1 or c_in != c_out:
            block["shortcut"] = self._conv(f"{name}/shortcut", 1, c_in, c_out, bias=False)[0]
            block["shortcut_bn"] = BatchNorm(self, f"{name}/shortcut_bn", c_out)
        return block

    def __call__(self, images, training=False):
        updates, c = [], self._c
        x = tf.nn.conv2d(c(images), c(self.stem[0]), 1, "SAME")
        x = tf.nn.relu(self.stem_bn(x, training, updates))
        for block in self.blocks:
            y = tf.nn.conv2d(x, c(block["conv1"]), block["stride"], "SAME")
            y = tf.nn.relu(block["bn1"](y, training, updates))
            y = tf.nn.conv2d(y, c(block["conv2"]), 1, "SAME")
            y = block["bn2"](y, training, updates)
            if "shortcut" in block:
                x = tf.nn.conv2d(x, c(block["shortcut"]), block["stride"], "SAME")
                x = block["shortcut_bn"](x, training, updates)
            x = tf.nn.relu(x + y)
        x = tf.reduce_mean(x, axis=[1, 2])
        logits = tf.nn.bias_add(tf.matmul(x, c(self.logits[0])), c(self.logits[1]))
        # Graph mode only runs what the fetched output depends on.
        with tf.control_dependencies(updates):
            return tf.identity(logits)


MODELS = {cls.catalog_name: cls for cls in (MnistMLP, MnistCNN, CifarResNet)}


def build(name, seed=0, make_variable=default_variable, dropout=True, simulate_gpu_ms=None,
          image_shape=None, num_classes=NUM_CLASSES, precision="float32"):
    """The model `name` with seeded initial weights; dropout=False makes
    training deterministic (only mnist_cnn has dropout). On the simulated
    accelerator (simulate_gpu_ms, or a gradient profile such as resnet50),
    the model's parameter shapes with waits for compute (workloads/simulated.py).
    Models from outside the catalog take `image_shape` and `num_classes` (the dataset's).
    precision mixed_float16 or mixed_bfloat16: float32 weights, the compute in 16 bits."""
    model_spec(name)  # a UsageError for unknown names
    step_ms = simulated_step_ms(name, simulate_gpu_ms)
    if step_ms:
        return SimulatedModel(gradient_layers(name, seed, image_shape), step_ms / 1000.0, make_variable)
    if user_models.is_user_model(name):
        return user_models.build(name, image_shape or USER_IMAGE_SHAPE, num_classes, seed, precision)
    options = {"dropout": dropout} if name == "mnist_cnn" else {}
    compute = {"float32": tf.float32, "mixed_float16": tf.float16, "mixed_bfloat16": tf.bfloat16}[precision]
    return MODELS[name](seed=seed, make_variable=make_variable, compute_dtype=compute, **options)


def gradient_layers(name, seed=0, image_shape=None, num_classes=NUM_CLASSES):
    """[(layer, [(variable, shape)...])] of a model's trainable variables in
    forward order, without a variable where the caller builds: a model from
    outside the catalog is built in a throwaway graph, which holds no
    distribution strategy's scope and starts no TF runtime (thread pools
    can still be set after)."""
    model_spec(name)
    if name in PROFILES:
        return PROFILES[name]()
    if name.endswith(".json"):
        return read_profile(name)["layers"]
    if user_models.is_user_model(name):
        with tf.Graph().as_default():
            return user_models.layers(user_models.build(name, image_shape or USER_IMAGE_SHAPE, num_classes, seed))
    return layers_of(MODELS[name], seed)


def gradient_shapes(name, image_shape=None):
    """The shapes of a model's trainable variables, in order."""
    return [list(shape) for _, variables in gradient_layers(name, 0, image_shape) for _, shape in variables]


def variable_name(v):
    """A variable's unique name: Keras 3's path (its .name is the layer's
    own, "kernel"), a tf.Variable's name without ":0"."""
    name = getattr(v, "path", None) or v.name
    return name[:-2] if name.endswith(":0") else name


def named_weights(model):
    """[(name, numpy value)] of every variable, trainable or not, for
    snapshots, --dump-weights and the equality checks."""
    return [(variable_name(v), v.numpy()) for v in model.variables]


def moving_statistics(model):
    """The variables a training forward pass updates and no gradient does:
    batch norm's moving mean and variance (non-trainable, floating point; a
    Keras seed generator's integer state is not one)."""
    return [v for v in model.variables if not v.trainable and tf.as_dtype(v.dtype).is_floating]


def gradient_bytes(model):
    """Bytes of one gradient exchange: every trainable variable once (Keras 3
    variables give their shape as a tuple and dtype as a name)."""
    return sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in model.trainable_variables)


def is_simulated(model):
    """A simulated model learns nothing worth evaluating."""
    return isinstance(model, SimulatedModel)


def per_example_loss(logits, labels):
    # (in float32 under mixed precision too: the softmax of 16-bit logits loses too much)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=tf.cast(logits, tf.float32))


def weighted_loss_sum(model, images, labels, weights):
    """A training batch's loss, summed with each sample's weight (0 for the
    padding of a short last batch). `training=` by keyword: Keras takes no
    other way."""
    return tf.reduce_sum(weights * per_example_loss(model(images, training=True), labels))


def correct_and_loss_sum(logits, labels):
    """One test batch's correct answers and summed loss (eager or graph mode)."""
    logits = tf.cast(logits, tf.float32)
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels),
                                    tf.float32))
    return correct, tf.reduce_sum(per_example_loss(logits, labels))
