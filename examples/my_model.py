"""A model of your own: `--model my_model:small_cnn`, with this folder on PYTHONPATH."""
import keras


def small_cnn(input_shape, num_classes):
    """Called on every worker with the dataset's image shape and class count.
    Returns logits (no softmax): ringtrain computes the loss."""
    return keras.Sequential([
        keras.Input(input_shape),
        keras.layers.Conv2D(16, 3, use_bias=False),  # batch norm's beta is the bias
        keras.layers.BatchNormalization(),
        keras.layers.ReLU(),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(num_classes),
    ])
