"""A dataset of the user's own code: `--data package.module:function`, a
function of no arguments that returns a tf.data.Dataset of (image, label),
unbatched (images HxWxC or HxW, uint8 in 0..255 or floats in [0, 1]; labels
integers), or a (train, test) pair of them. It is called in the graph that
reads it (each epoch, in each process; inside TF2 PS's dataset function on
the workers), so it must build the same dataset each time, and from
TensorFlow's ops (a tf.py_function cannot run on a remote worker).

At the start it is read once, to count it and find its labels' range (its
length need not be known), in a process of its own: TensorFlow's runtime
started there, not in the trainer, whose thread pools and execution mode
each mode still sets. Imports TensorFlow."""
import json
import os
import subprocess
import sys

from ringtrain.common.errors import UsageError, first_line, one_line
from ringtrain.workloads.user_models import function_named


def open_factory(name, flag="--data"):
    """[(make, records, (lowest, highest label))] of its train split, and of
    its test split where it returns a pair, counted and checked; make(tf)
    builds the dataset in the graph at hand."""
    from ringtrain.workloads.tfenv import import_tensorflow_quietly
    done = subprocess.run([sys.executable, "-m", "ringtrain.workloads.factories", name, flag], capture_output=True,
                          text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.strip()]
        raise UsageError(said[-1] if done.returncode == 2 and said else
                         f"{flag} {name}: reading it failed ({said[-1] if said else f'exit {done.returncode}'})")
    import_tensorflow_quietly()  # (before the user's module imports it: its start-up lines kept off stderr)
    function, counted = function_named(name, flag), json.loads(done.stdout.splitlines()[-1])
    return [(lambda tf, which=which: _made(tf, function, name, flag)[which], count, (low, high))
            for which, (count, low, high) in enumerate(counted)]


def main(name, flag):
    """In a process of its own: each split's [records, lowest label, highest label], as JSON."""
    from ringtrain.workloads.tfenv import import_tensorflow_quietly
    tf = import_tensorflow_quietly()
    try:
        function = function_named(name, flag)
        parts = len(_made(tf, function, name, flag))
        counted = [_count(tf, lambda tf, which=which: _made(tf, function, name, flag)[which], name, flag)
                   for which in range(parts)]
    except UsageError as e:
        sys.stderr.write(one_line(e) + "\n")
        return 2
    print(json.dumps(counted), flush=True)
    return 0


def _made(tf, function, name, flag):
    try:
        made = function()
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001 -- the user's code: say what it raised, in one line
        raise UsageError(f"{flag} {name} raised {type(e).__name__}: {first_line(e)}") from None
    parts = tuple(made) if isinstance(made, (tuple, list)) else (made,)
    if not 1 <= len(parts) <= 2 or not all(isinstance(p, tf.data.Dataset) for p in parts):
        what = type(made).__name__ + (f" of {', '.join(type(p).__name__ for p in parts)}" if len(parts) > 1 else "")
        raise UsageError(f"{flag} {name} returned a {what}: it must return a tf.data.Dataset of (image, label), "
                         "or a (train, test) pair of them")
    for part in parts:
        _check_elements(tf, part.element_spec, name, flag)
    return parts


def _check_elements(tf, spec, name, flag):
    shape = lambda s: s.shape.rank if isinstance(s, tf.TensorSpec) else None
    if not (isinstance(spec, tuple) and len(spec) == 2 and shape(spec[0]) in (2, 3) and shape(spec[1]) == 0
            and spec[1].dtype.is_integer):
        raise UsageError(f"{flag} {name}'s dataset gives {spec}: each element must be (image, label), an HxWxC (or "
                         "HxW) image and an integer label, unbatched (ringtrain batches it)")


def _count(tf, make, name, flag):
    """(records, lowest label, highest label), read once in a graph of its own."""
    with tf.Graph().as_default():
        labels = make(tf).map(lambda image, label: tf.cast(label, tf.int64))
        big = tf.constant(2 ** 62, tf.int64)
        totals = labels.reduce((tf.constant(0, tf.int64), big, -big),
                               lambda acc, y: (acc[0] + 1, tf.minimum(acc[1], y), tf.maximum(acc[2], y)))
        try:
            with tf.compat.v1.Session() as session:
                count, low, high = (int(v) for v in session.run(totals))
        except tf.errors.OpError as e:
            raise UsageError(f"{flag} {name}: reading its dataset failed: {first_line(e.message)}") from None
    if not count:
        raise UsageError(f"{flag} {name}'s dataset is empty: it must give (image, label) elements")
    return count, low, high


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
