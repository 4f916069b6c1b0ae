"""Models from outside the catalog, for every eager mode and the bench.

`--model` takes, besides the catalog's names:
- `keras:NAME`, a network of keras.applications (ResNet50, MobileNetV2, VGG16...),
  built with weights=None (nothing is downloaded) and logits out;
- `package.module:function`, the user's own factory. It is called as
  function(input_shape, num_classes) and returns either a Keras model or a
  tf.Module with the catalog models' contract: model(images, training) gives
  logits for float32 NHWC images in [0, 1], and model.trainable_variables
  and model.variables hold its weights.

Weights are seeded (keras.utils.set_random_seed before the model is built),
so every process builds the same initial weights; ring mode broadcasts
rank 0's anyway.
"""
import importlib
import re

from ringtrain.common.errors import UsageError

KERAS_PREFIX = "keras:"
FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def is_user_model(name):
    return name.startswith(KERAS_PREFIX) or bool(FACTORY.match(name))


def check_name(name):
    """A one-line UsageError for a name that is neither kind (no import)."""
    if name.startswith(KERAS_PREFIX):
        if not re.match(r"^[A-Za-z_]\w*$", name[len(KERAS_PREFIX):]):
            raise UsageError(f"--model {name}: give a keras.applications name, e.g. keras:ResNet50")
    elif not FACTORY.match(name):
        raise UsageError(f"unknown model {name!r}: give a catalog name, keras:NAME (keras.applications) "
                         f"or package.module:function (your own factory)")


def factory(name):
    """The callable (input_shape, num_classes) -> model that `name` names, or
    a one-line UsageError (imports Keras for keras:NAME, the module otherwise)."""
    check_name(name)
    from ringtrain.workloads.tfenv import import_tensorflow_quietly
    import_tensorflow_quietly()  # Keras and most factories import it: keep its start-up lines off stderr
    if name.startswith(KERAS_PREFIX):
        import keras
        app = name[len(KERAS_PREFIX):]
        build = getattr(keras.applications, app, None)
        if not callable(build):
            raise UsageError(f"--model {name}: keras.applications has no {app} "
                             f"(see keras.applications, e.g. ResNet50, MobileNetV2, VGG16)")
        return lambda input_shape, num_classes: build(
            weights=None, input_shape=tuple(input_shape), classes=num_classes, classifier_activation=None)
    module_name, function_name = name.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UsageError(f"--model {name}: cannot import {module_name} ({e}): put its folder on "
                         f"PYTHONPATH on every host") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise UsageError(f"--model {name}: {module_name} has no function {function_name}")
    return function


def build(name, image_shape, num_classes, seed=0):
    """The model, with seeded weights, checked against the contract."""
    import keras
    keras.utils.set_random_seed(seed)
    try:
        model = factory(name)(tuple(image_shape), num_classes)
    except UsageError:
        raise
    except ValueError as e:  # keras.applications on a too-small input, for one
        raise UsageError(f"--model {name} cannot take {tuple(image_shape)} images with {num_classes} "
                         f"classes: {str(e).splitlines()[0]} (give --image-shape)") from None
    if not callable(model) or not hasattr(model, "trainable_variables"):
        raise UsageError(f"--model {name} returned a {type(model).__name__}: the factory must return "
                         f"a Keras model or a tf.Module (see the README's own-model section)")
    if is_keras(model) and not model.built:
        model.build((None, *image_shape))
    if not model.trainable_variables:
        raise UsageError(f"--model {name} has no trainable variables: build its layers in the factory")
    return model


def with_synchronized_batch_norm(model, make_layer):
    """The Keras model with each BatchNormalization layer replaced by
    make_layer(its config), weights kept: batch statistics then come from
    the global batch, as one process on N x b would compute them."""
    import keras
    if not is_keras(model):
        raise UsageError("--sync-batch-norm replaces Keras BatchNormalization layers: the catalog's models keep "
                         "their statistics per worker; give keras:NAME or a factory's Keras model")
    replaced = []

    def clone(layer):
        config = layer.get_config()
        if isinstance(layer, keras.layers.BatchNormalization):
            replaced.append(layer.name)
            config.pop("synchronized", None)
            return make_layer(config)
        return layer.__class__.from_config(config)

    try:
        synced = keras.models.clone_model(model, clone_function=clone)
    except ValueError as e:
        raise UsageError(f"--sync-batch-norm cannot rebuild this model ({str(e).splitlines()[0]}): a subclassed "
                         f"model can use keras.layers.BatchNormalization(synchronized=True) itself") from None
    if not replaced:
        raise UsageError("--sync-batch-norm: the model has no BatchNormalization layer: drop the flag")
    synced.set_weights(model.get_weights())
    return synced


def is_keras(model):
    import keras
    return isinstance(model, keras.Model)


def layers(model):
    """[(layer, [(variable, shape), ...])] of trainable weights in forward
    order: the gradient profile that --simulate-gpu and `profile` use."""
    if is_keras(model):
        return [(layer.name, [(v.name, tuple(v.shape)) for v in layer.trainable_weights])
                for layer in _leaf_layers(model) if layer.trainable_weights]
    grouped = {}
    for v in model.trainable_variables:
        layer, _, var = v.name.split(":")[0].rpartition("/")
        grouped.setdefault(layer or var, []).append((var, tuple(v.shape)))
    return list(grouped.items())


def _leaf_layers(model):
    """Layers that own weights, nested models opened (a Sequential inside a
    functional model would otherwise count as one layer)."""
    for layer in model.layers:
        if hasattr(layer, "layers") and layer.layers:
            yield from _leaf_layers(layer)
        else:
            yield layer
