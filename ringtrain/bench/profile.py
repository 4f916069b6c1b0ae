"""`ringtrain-bench profile`: what a model sends in one gradient exchange,
and what one step of it costs on this machine.

It prints the parameter counts, the gradient bytes, the tensor count and
the largest tensors, times a few training steps here, and writes the
gradient profile (tensors in forward order, a step time) to a file that
`--model FILE.json` trains on the simulated accelerator, in every mode and
in the bench. The step time written is --step-ms when given (a published
GPU figure, say), else the one measured here.
"""
import json
import statistics
import time

import numpy as np

from ringtrain.common.errors import UsageError


def run(model_name, image_shape, num_classes, batch_size, measure_steps, step_ms, threads, seed=0):
    from ringtrain.workloads import catalog, models
    from ringtrain.workloads.tfenv import import_tensorflow_quietly, set_threads
    tf = import_tensorflow_quietly()
    set_threads(threads)
    shape = catalog.image_shape(model_name, image_shape)
    num_classes = _classes(model_name, num_classes)
    layers = models.gradient_layers(model_name, seed, shape, num_classes)
    tensors = [(f"{layer}/{var}", shape_) for layer, variables in layers for var, shape_ in variables]
    sizes = [int(np.prod(s)) for _, s in tensors]
    measured = None
    if measure_steps and not catalog.simulated_step_ms(model_name):
        model = models.build(model_name, seed=seed, image_shape=shape, num_classes=num_classes)
        measured = _time_steps(tf, models, model, shape, num_classes, batch_size, measure_steps)
    non_trainable = None
    if measured is not None:
        non_trainable = sum(int(np.prod(v.shape)) for v in model.variables) - sum(sizes)
    return {"model": model_name, "image_shape": list(shape), "num_classes": num_classes,
            "trainable_parameters": sum(sizes), "non_trainable_parameters": non_trainable,
            "gradient_bytes": 4 * sum(sizes), "tensors": len(tensors),
            "largest": sorted(([name, list(s), 4 * n] for (name, s), n in zip(tensors, sizes)),
                              key=lambda row: -row[2])[:5],
            "batch_size": batch_size, "threads": threads, "measured_step_ms": measured,
            "step_ms": step_ms or measured or catalog.simulated_step_ms(model_name),
            "step_ms_source": "given (--step-ms)" if step_ms else (
                "measured on this machine" if measured else "the catalog's published P100 step"),
            "layers": [[layer, [[var, list(s)] for var, s in variables]] for layer, variables in layers]}


def _classes(model_name, num_classes):
    """--num-classes is for models from outside the catalog; the catalog's have their own."""
    from ringtrain.workloads import user_models
    from ringtrain.workloads.models import NUM_CLASSES
    from ringtrain.workloads.profiles import PROFILES, classes
    own = classes(PROFILES[model_name]()) if model_name in PROFILES else NUM_CLASSES
    if user_models.is_user_model(model_name):
        return num_classes or NUM_CLASSES
    if num_classes not in (None, own):
        raise UsageError(f"--num-classes {num_classes}: {model_name} has {own} classes; other counts are for "
                         f"keras:NAME and factories")
    return own


def _time_steps(tf, models, model, shape, num_classes, batch_size, steps):
    """The median of `steps` timed SGD steps (forward, backward, update) after one untimed."""
    import keras
    from ringtrain.workloads.tfenv import step_function
    rng = np.random.default_rng(0)
    images = tf.constant(rng.random((batch_size, *shape), np.float32))
    labels = tf.constant(rng.integers(0, num_classes, batch_size, dtype=np.int32))
    weights = tf.ones([batch_size])
    optimizer = keras.optimizers.SGD(0.01)

    @step_function
    def step():
        with tf.GradientTape() as tape:
            loss = models.weighted_loss_sum(model, images, labels, weights) / batch_size
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step().numpy()  # tracing and the first run
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step().numpy()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def write(profile, path):
    with open(path, "w") as f:
        json.dump(profile, f, indent=1)
        f.write("\n")


def markdown(profile):
    p = profile
    lines = [f"# Gradient profile of {p['model']}", "",
             f"- input {'x'.join(map(str, p['image_shape']))}, {p['num_classes']} classes",
             f"- trainable parameters: {p['trainable_parameters']:,d}"
             + (f" (and {p['non_trainable_parameters']:,d} not trained, e.g. batch-norm statistics)"
                if p["non_trainable_parameters"] else ""),
             f"- gradient bytes per exchange (float32): {p['gradient_bytes']:,d} in {p['tensors']} tensors",
             f"- one step here (batch {p['batch_size']}, {p['threads'] or 'default'} TF thread(s), SGD): "
             + (f"{p['measured_step_ms']:,.1f} ms" if p["measured_step_ms"] else "not measured"),
             f"- step time in the profile: {p['step_ms']:,.1f} ms, {p['step_ms_source']}" if p["step_ms"]
             else "- step time in the profile: none (give --step-ms MS)",
             "", "| largest tensors | shape | bytes |", "|---|---|---:|"]
    lines += [f"| {name} | {'x'.join(map(str, shape))} | {size:,d} |" for name, shape, size in p["largest"]]
    return "\n".join(lines) + "\n"
