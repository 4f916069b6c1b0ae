"""The Keras optimizer that the shared --optimizer flag names (TF2 modes)."""


def keras_optimizer(name, lr):
    import keras
    if name == "sgd":
        return keras.optimizers.SGD(lr)
    if name == "momentum":
        return keras.optimizers.SGD(lr, momentum=0.9)
    return keras.optimizers.Adam(lr)
