"""TensorFlow process settings, applied before TF is first imported, and
how ringtrain compiles its steps."""
import contextlib
import functools
import os

# Keras, which `import tensorflow` loads, imports pandas, scikit-learn and matplotlib
# for integrations ringtrain never uses (fit on DataFrames, the scikit-learn
# wrappers, image galleries): 1.7 of a rank's 4.3 s of import here. They are
# hidden during that import only, and import as usual afterwards.
KERAS_EXTRAS = ("pandas", "sklearn", "matplotlib")

# TF's switch for its oneDNN kernels on x86 CPUs, read once as TF loads.
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def import_tensorflow_quietly():
    """Import TF with its start-up lines (absl INFO about oneDNN and CPU
    features, which no env var silences) kept off stderr, so that our own
    one-line messages stand alone. A failed import replays what TF said."""
    import sys
    import tempfile
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _remove_generated_code_at_exit()
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    keep_freed_memory()
    sys.stderr.flush()
    saved = os.dup(2)
    hidden = _Hidden(KERAS_EXTRAS)
    with tempfile.TemporaryFile() as captured, _collector_paused():
        os.dup2(captured.fileno(), 2)
        sys.meta_path.insert(0, hidden)
        try:
            import tensorflow
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            sys.meta_path.remove(hidden)
            os.dup2(saved, 2)
            os.close(saved)
    return tensorflow


@functools.cache
def _remove_generated_code_at_exit():
    """AutoGraph's files removed at a normal exit too, once per process: AutoGraph's
    own hook leaves their bytecode, and a bench worker or a PS task never ends
    through run_cli's exit_now."""
    import atexit
    from ringtrain.common.errors import remove_generated_code
    atexit.register(remove_generated_code)


def kernels_for(precision):
    """Before TF loads: float16 computed by TF's Eigen kernels, not oneDNN's.
    TF 2.21's oneDNN (3.7) runs float16 weight gradients of convolutions and
    dense layers with a bias through its reference kernels on an AVX-512 FP16
    CPU here: a mnist_cnn step took 5.2 s against 0.17 s on Eigen (float32 0.02 s),
    ResNet50's 14 s against 0.69 s (DEVELOPERS.md 1.9). A GPU computes on its
    own kernels either way; a user's own setting stays."""
    if precision == "mixed_float16":
        os.environ.setdefault(ONEDNN_ENV, "0")


def float16_note(precision, device):
    """What a float16 run on a CPU should say first: it is slow there."""
    if precision == "mixed_float16" and device and "GPU" not in device:
        return ("note: float16 on a CPU runs on TF's Eigen kernels, slower than float32; on a CPU, "
                "--precision mixed_bfloat16 is the 16-bit type to try (docs/data.md)")
    return None


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while TF imports, and what the import
    made frozen after it (gc.freeze: kept out of every later collection). TF's
    ~3,000 modules make some 460,000 tracked objects and almost no garbage, so the
    five full collections the import set off only walked them again and again: the
    import took 2.3-3.2 s of CPU here, 1.7-1.9 s without them (DEVELOPERS.md 4.11).
    Frozen, they are not walked by the collections that model building and tracing
    set off either."""
    import gc
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def keep_freed_memory():
    """Have glibc keep the memory a step frees for the next step. By its own
    thresholds it returned the freed top of the heap to the kernel, so a step's
    activations were faulted in again: 20,293 page faults a second on a TF
    collective rank of mnist_cnn here, 91 with this. (Where tf.data's
    from_generator fixes both thresholds at 128 KB, a plain script's kernels ran
    10-70 % slower: DEVELOPERS.md 4.15.) Blocks up to 32 MB (glibc's most) now
    come from the heap, and up to 256 MB freed stays there. Nothing where the C
    library is not glibc."""
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
    libc.mallopt(M_TRIM_THRESHOLD, 256 << 20)


class _Hidden:
    """An import hook under which the named top-level packages are not
    installed (those already imported stay)."""

    def __init__(self, names):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"{name} is hidden while TensorFlow loads", name=name)
        return None


def step_function(fn=None, **options):
    """tf.function without AutoGraph, for every step and evaluation ringtrain
    traces. AutoGraph rewrites each Python function a step calls (Horovod's
    tape, Keras's optimizer: 185 of them for one ring step) before tracing:
    3.5 s of a 10 s mnist_mlp run here. These steps, Keras's layers and
    Horovod's wrappers branch on Python values only (on tensors, tf.cond), so
    they need none of it; a model of the user's own must do the same."""
    import tensorflow as tf
    if fn is None:
        return lambda f: tf.function(f, autograph=False, **options)
    return tf.function(fn, autograph=False, **options)


def data_function(fn):
    """One of the pipeline's own functions for tf.data's map, traced without
    AutoGraph too: it branches on shapes and dtypes, on tensors with tf.cond.
    (AutoGraph converted it and each function it calls, on each trace.) Not
    for a whole dataset function: a user's own map functions inside it would
    lose AutoGraph, which they may need, as they keep it in every mode."""
    import tensorflow as tf
    return tf.autograph.experimental.do_not_convert(fn)


def set_threads(threads):
    """Pin TF's intra- and inter-op pools; 0 keeps TF's defaults."""
    import tensorflow as tf
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


def session_config(tf, threads, device_filters=None, inter_op_threads=None, precision="float32"):
    """A tf.compat.v1 session/server config with pinned thread pools (0: TF's default).
    In bfloat16, without Grappler's remapper: in a distributed TF1 session it fused
    Conv2D, BiasAdd and Relu into a _FusedConv2D that TF has no bfloat16 kernel
    for, and the first step failed (DEVELOPERS.md 1.9; the TF2 modes trained)."""
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads,
                                      inter_op_parallelism_threads=inter_op_threads or threads,
                                      device_filters=device_filters or [])
    if precision == "mixed_bfloat16":
        rewrites = config.graph_options.rewrite_options
        rewrites.remapping = rewrites.OFF
    return config
