"""Which accelerator a worker process uses: the GPU of its local index
(ring ranks by local rank, PS workers by their order among the workers of
their host), or none. Runs before TF's runtime starts.

The GPUs a process may take are TF's physical GPUs; with
RINGTRAIN_ASSUMED_GPUS=N set (the tests, on a machine without GPUs), N GPUs
that exist as names only: each process then reports the GPU it asks for,
and nothing is pinned, so that what every mode asks for is checked here too."""
import os

ASSUMED_GPUS_ENV = "RINGTRAIN_ASSUMED_GPUS"


def assumed_gpus():
    """The count of GPUs assumed by name (RINGTRAIN_ASSUMED_GPUS), or None."""
    text = os.environ.get(ASSUMED_GPUS_ENV, "")
    return int(text) if text.isdigit() and int(text) > 0 else None


def pin_gpu(local_index):
    """Make GPU `local_index` this process's only GPU, with memory growth;
    returns what the worker computes on ("GPU:i", or "CPU" without GPUs).
    local_index None: this process computes on no GPU (a PS task)."""
    assumed = assumed_gpus()
    if assumed:
        return "CPU" if local_index is None else f"GPU:{local_index % assumed}"
    import tensorflow as tf
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus or local_index is None:
        if gpus:
            tf.config.set_visible_devices([], "GPU")
        return "CPU"
    gpu = gpus[local_index % len(gpus)]
    tf.config.experimental.set_memory_growth(gpu, True)
    tf.config.set_visible_devices(gpu, "GPU")
    return f"GPU:{local_index % len(gpus)}"


def gpu_count(tf):
    """The GPUs one process may spread its towers over."""
    return assumed_gpus() or len(tf.config.list_physical_devices("GPU"))


def local_index(addresses, index):
    """The position of task `index` among the tasks of `addresses` ("host:port")
    on its own host: its GPU, where each worker of a host takes one."""
    host = addresses[index].rpartition(":")[0]
    return sum(1 for a in addresses[:index] if a.rpartition(":")[0] == host)


def remote_workers_device(tf):
    """What a coordinator's workers compute on, as TF lists their devices once
    it is connected to them (TF2 PS: the coordinator computes nothing itself):
    "GPU" where a worker has one, else "CPU"."""
    if assumed_gpus():
        return "GPU"
    names = [d.name for d in tf.config.list_logical_devices() if "/job:worker/" in d.name]
    return "GPU" if any("/device:GPU:" in n for n in names) else "CPU"
