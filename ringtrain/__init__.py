"""ringtrain: synchronous data-parallel TensorFlow training over Horovod's ring-allreduce."""
from ringtrain.common.version import __version__  # noqa: F401
