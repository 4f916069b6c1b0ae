"""A simulated accelerator (`--simulate-gpu MS`), so that N can exceed this
machine's cores, as on a GPU cluster.

The model's parameters are real variables with the real shapes, so every
gradient is as large as the real model's and every byte of it is really
exchanged. Its forward and backward passes are waits that use no CPU (a
tf.data sleep, which also runs inside TF2 PS workers' remote functions),
MS per step in all: a third forward, two thirds backward, spread evenly over
the layers. Backward runs in backprop order through tf.custom_gradient, so
each layer's gradients appear, with their real shapes, when backprop would
produce them: Horovod's overlap of communication with backprop stays real,
and the training code (GradientTape, DistributedGradientTape, PS optimizers)
is the same as for real models.

Each gradient is filled with a value computed from the worker's own batch,
so workers' gradients differ and only a working exchange keeps their weights
identical.
"""
import numpy as np
import tensorflow as tf

FORWARD_SHARE = 1 / 3  # backward takes about twice the forward pass


def wait(x, seconds):
    """x, after `seconds` (a number, or a tensor computed in the graph),
    without using the CPU: a one-element tf.data SleepDataset (take(1): it
    would sleep again for the end of sequence)."""
    if isinstance(seconds, (int, float)):
        if seconds <= 0:
            return x
        micros = tf.constant(int(seconds * 1e6), tf.int64)
    else:
        micros = tf.cast(tf.maximum(seconds, 0) * 1e6, tf.int64)
    dataset = tf.data.Dataset.from_tensors(x)
    slept = tf.raw_ops.SleepDataset(input_dataset=tf.data.experimental.to_variant(dataset),
                                    sleep_microseconds=micros,
                                    output_types=[x.dtype], output_shapes=[x.shape])
    return tf.data.experimental.from_variant(slept, dataset.element_spec).take(1).get_single_element()


class SimulatedModel(tf.Module):
    """layers: [(layer name, [(variable name, shape), ...]), ...] in forward order."""

    def __init__(self, layers, step_seconds, make_variable, num_classes=10):
        super().__init__(name="SimulatedModel")
        self.layers = [[make_variable(f"{layer}/{name}", np.zeros(shape, np.float32), True)
                        for name, shape in variables] for layer, variables in layers]
        self.forward_seconds = step_seconds * FORWARD_SHARE / len(layers)
        self.backward_seconds = step_seconds * (1 - FORWARD_SHARE) / len(layers)
        self.num_classes = num_classes

    def __call__(self, images, training=False):
        h = tf.reduce_mean(tf.reshape(images, [tf.shape(images)[0], -1]), axis=1)  # [batch]
        for variables in self.layers:
            h = self._layer(h, variables)
        return tf.stack([h * (0.01 * (c + 1)) for c in range(self.num_classes)], axis=1)

    def _layer(self, h, variables):
        forward, backward = self.forward_seconds, self.backward_seconds

        @tf.custom_gradient
        def layer(h):
            # Touch every weight: where weights live on a PS, this pulls them all.
            touched = tf.add_n([tf.reshape(v, [-1])[0] for v in variables])
            out = wait(h + 1e-30 * touched, forward)

            def grad(dy, variables=None):
                dy = wait(dy, backward)
                value = 1e-3 * tf.reduce_mean(dy * h)  # from this worker's own batch
                return dy, [tf.fill(tf.shape(v), value) for v in variables]

            return out, grad

        return layer(h)


def layers_of(model_class, seed):
    """A real model's trainable variable shapes, grouped into layers by name
    prefix, without creating a single TF variable (so that graph mode and a
    PS placement are untouched)."""
    layers = {}

    def record(name, value, trainable=True):
        if trainable:
            layer, _, var = name.rpartition("/")
            layers.setdefault(layer or name, []).append((var, value.shape))
        return value

    model_class(seed=seed, make_variable=record)
    return list(layers.items())
