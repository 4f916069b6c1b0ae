"""The networks the plain scripts (plain_horovod.py, plain_mwms.py) train,
built as a Keras user builds them: a keras.applications name, or mnist_cnn."""
import keras


def build(name, shape, classes):
    if name == "mnist_cnn":  # the conv net of Horovod's TF2 MNIST example
        layers = keras.layers
        return keras.Sequential([keras.Input(shape), layers.Conv2D(32, 3, activation="relu"),
                                 layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(), layers.Dropout(0.25),
                                 layers.Flatten(), layers.Dense(128, activation="relu"), layers.Dropout(0.5),
                                 layers.Dense(classes)])
    return getattr(keras.applications, name)(weights=None, input_shape=shape, classes=classes,
                                             classifier_activation=None)
