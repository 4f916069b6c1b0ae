"""Where each variable lives: the three replica_device_setter strategies the classic distributed-TensorFlow tutorials
describe.

- round_robin: replica_device_setter's default; variable k goes to PS k mod P,
  whatever its size (two PS can end up with all weights on one, all biases
  on the other).
- greedy:      each variable goes to the PS holding the fewest bytes so far,
  as tf.contrib.training.GreedyLoadBalancingStrategy did (contrib is gone,
  so it is re-implemented here in a few lines).
- partitioned: variables of at least --partition-min-bytes are split along
  their first axis into one shard per PS; shards and small variables are
  placed round-robin, so a split variable's shards land on all P tasks.
"""
from collections import defaultdict

import numpy as np
import tensorflow as tf

def variable_bytes(op):
    """Bytes of the variable an op (VarHandleOp / VariableV2) creates."""
    shape = tf.TensorShape(op.get_attr("shape"))
    return (shape.num_elements() or 0) * tf.as_dtype(op.get_attr("dtype")).size


class GreedyBytesStrategy:
    """ps_strategy for replica_device_setter: least-loaded PS by bytes."""

    def __init__(self, num_ps):
        self.loads = [0] * num_ps

    def __call__(self, op):
        task = int(np.argmin(self.loads))  # ties go to the lowest task index
        self.loads[task] += variable_bytes(op)
        return task


def device_setter(placement, cluster_spec, task_index):
    """The device function for building a worker's replica of the graph:
    variables on the PS job, everything else on this worker."""
    num_ps = cluster_spec.num_tasks("ps")
    strategy = GreedyBytesStrategy(num_ps) if placement == "greedy" else None
    return tf.compat.v1.train.replica_device_setter(
        cluster=cluster_spec, worker_device=f"/job:worker/task:{task_index}", ps_strategy=strategy)


def variable_factory(placement, num_ps, partition_min_bytes):
    """The models' make_variable(name, initial_value, trainable): get_variable,
    so that variables land in the graph collections the Saver and
    MonitoredTrainingSession use, and can be partitioned."""

    def make_variable(name, initial_value, trainable=True):
        partitioner = None
        if (placement == "partitioned" and num_ps > 1 and initial_value.nbytes >= partition_min_bytes
                and initial_value.shape[0] >= num_ps):
            partitioner = tf.compat.v1.fixed_size_partitioner(num_ps)
        return tf.compat.v1.get_variable(
            name, shape=initial_value.shape, dtype=tf.float32, trainable=trainable,
            initializer=_slice_of(initial_value), partitioner=partitioner, use_resource=True)

    return make_variable


def _slice_of(value):
    """An initializer that yields the seeded numpy value, or the part of it a
    partition covers, so that partitioned and whole models start identical."""

    def initializer(shape, dtype=tf.float32, partition_info=None):
        part = value
        if partition_info is not None:
            start = partition_info.var_offset
            part = value[tuple(slice(o, o + n) for o, n in zip(start, shape))]
        return tf.constant(part, dtype=dtype)

    return initializer


def describe(variables):
    """[(name, device, bytes)] and {ps device: bytes} for graph-mode variables."""
    rows, per_ps = [], defaultdict(int)
    for v in variables:
        size = v.shape.num_elements() * v.dtype.size
        device = tf.DeviceSpec.from_string(v.device)
        where = f"/job:{device.job}/task:{device.task}"
        rows.append((v.op.name, where, size))
        per_ps[where] += size
    return rows, dict(sorted(per_ps.items()))


def format_table(rows, per_ps, placement):
    lines = [f"placement {placement}: {len(rows)} variables"]
    width = max((len(name) for name, _, _ in rows), default=10)
    lines += [f"  {name:<{width}}  {where}  {size:>10,d} B" for name, where, size in rows]
    lines += [f"  total on {where}: {size:,d} B" for where, size in per_ps.items()]
    return "\n".join(lines)
