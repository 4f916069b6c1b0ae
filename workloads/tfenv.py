"""TensorFlow process settings, applied before TF is first imported."""
import os


def import_tensorflow_quietly():
    """Import TF with its start-up lines (absl INFO about oneDNN and CPU
    features, which no env var silences) kept off stderr, so that our own
    one-line messages stand alone. A failed import replays what TF said."""
    import sys
    import tempfile
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    return tensorflow


def set_threads(threads):
    """Pin TF's intra- and inter-op pools; 0 keeps TF's defaults."""
    import tensorflow as tf
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


def session_config(tf, threads, device_filters=None, inter_op_threads=None):
    """A tf.compat.v1 session/server config with pinned thread pools (0: TF's default)."""
    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads,
                                    inter_op_parallelism_threads=inter_op_threads or threads,
                                    device_filters=device_filters or [])
