"""The optimizers the shared --optimizer flag names: one table, for the Keras
optimizers (ring mode, PS --api tf2) and the tf.compat.v1 ones (PS v1 graphs)."""

# name: (Keras class and options, tf.compat.v1.train class and options)
OPTIMIZERS = {
    "sgd": (("SGD", {}), ("GradientDescentOptimizer", {})),
    "momentum": (("SGD", {"momentum": 0.9}), ("MomentumOptimizer", {"momentum": 0.9})),
    "adam": (("Adam", {}), ("AdamOptimizer", {})),
}


def keras_optimizer(name, lr):
    import keras
    cls, options = OPTIMIZERS[name][0]
    return getattr(keras.optimizers, cls)(lr, **options)


def v1_optimizer(name, lr):
    import tensorflow as tf
    cls, options = OPTIMIZERS[name][1]
    return getattr(tf.compat.v1.train, cls)(lr, **options)
