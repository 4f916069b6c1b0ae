"""Which accelerator a worker process uses: the GPU of its local index
(ring ranks by local rank, PS workers by their order among the workers of
their host), or none. Runs before TF's runtime starts."""


def pin_gpu(local_index):
    """Make GPU `local_index` this process's only GPU, with memory growth;
    returns what the worker computes on ("GPU:i", or "CPU" without GPUs).
    local_index None: this process computes on no GPU (a PS task)."""
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


def local_index(addresses, index):
    """The position of task `index` among the tasks of `addresses` ("host:port")
    on its own host: its GPU, where each worker of a host takes one."""
    host = addresses[index].rpartition(":")[0]
    return sum(1 for a in addresses[:index] if a.rpartition(":")[0] == host)
