"""ringtrain: synchronous data-parallel TensorFlow training over Horovod's ring-allreduce."""
__version__ = "0.1.0"
