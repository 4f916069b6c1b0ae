"""The private TensorFlow and Keras APIs ringtrain uses, checked against the
versions installed: if one changes, this says what broke and where, instead
of a run failing half-way (or, worse, all-reducing its gradients twice)."""
import pytest


def test_sync_replicas_optimizer_still_counts_its_pending_gradients():
    from ps_baseline.worker_v1 import pending_gradients
    from ringtrain.workloads.tfenv import import_tensorflow_quietly
    tf = import_tensorflow_quietly()
    with tf.Graph().as_default():
        weight = tf.compat.v1.get_variable("w", [], initializer=tf.zeros_initializer(), use_resource=True)
        step = tf.compat.v1.train.get_or_create_global_step()
        sync = tf.compat.v1.train.SyncReplicasOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                                        replicas_to_aggregate=2, total_num_replicas=2)
        sync.apply_gradients(sync.compute_gradients(weight * weight), global_step=step)
        try:
            pending = pending_gradients(tf, sync)
        except RuntimeError as e:
            pytest.fail(str(e))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert sess.run(pending) == 0  # nothing pushed yet


def test_keras_still_all_reduces_the_gradients_through_the_hook_tf_collective_mode_replaces():
    """TF collective mode all-reduces the gradients itself, in buckets as backprop
    makes them, and has Keras apply the sum as it is (gradients.already_summed)."""
    import inspect

    from keras.src.backend.tensorflow.optimizer import TFOptimizer
    assert "self._all_reduce_sum_gradients(" in inspect.getsource(TFOptimizer._backend_update_step), \
        "Keras's TF optimizer no longer all-reduces through _all_reduce_sum_gradients: see gradients.already_summed"


def test_the_strategy_keeps_the_coordination_service_configured_before_it(tmp_path):
    """TF collective mode gives TF's heartbeat --stall-timeout plus TF's own 10 s
    (collective.tf_heartbeat_after); MultiWorkerMirroredStrategy must start its
    coordination service with that, not its own. One worker, in its own process."""
    import json
    import os
    import sys

    from helpers import run
    from ringtrain.multihost.net import free_ports
    [port] = free_ports(1)
    script = ("from ringtrain.workloads.tfenv import import_tensorflow_quietly, set_threads\n"
              "from ringtrain.collective import connect\n"
              "from tensorflow.python.eager import context\n"
              "tf = import_tensorflow_quietly(); set_threads(1)\n"
              "strategy = connect(tf, 'RING', stall_timeout=30)\n"
              "print(strategy.num_replicas_in_sync, context.context().coordination_service.heartbeat_timeout_in_ms)\n")
    config = {"cluster": {"worker": [f"localhost:{port}"]}, "task": {"type": "worker", "index": 0}}
    done = run([sys.executable, "-c", script], timeout=120,
               env=dict(os.environ, TF_CONFIG=json.dumps(config), TMPDIR=str(tmp_path)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["1", "40000"], done.stdout


def test_tfs_ring_is_cut_into_the_subdivisions_its_runtime_would_make(monkeypatch):
    """TF collective mode turns on the subdivisions TF's Python API turns off
    (collective.ring_in_subdivisions): every CollectiveReduceV2 the strategy's
    launcher makes must carry max_subdivs_per_device=0, TF's runtime default."""
    import inspect

    from ringtrain.collective import ring_in_subdivisions
    from ringtrain.workloads.tfenv import import_tensorflow_quietly
    from tensorflow.python.distribute.cross_device_utils import CollectiveReplicaLauncher
    from tensorflow.python.ops import collective_ops
    tf = import_tensorflow_quietly()
    launch = inspect.getsource(CollectiveReplicaLauncher.all_reduce)
    assert "collective_ops.all_reduce_v2(" in launch and "max_subdivs_per_device" not in launch, \
        "TF's strategy no longer makes its all-reduce through collective_ops.all_reduce_v2 as it did"
    monkeypatch.setattr(collective_ops, "all_reduce_v2", collective_ops.all_reduce_v2)  # TF's own, afterwards
    ring_in_subdivisions()
    ring_in_subdivisions()  # twice, as a second strategy in one process would
    reduce = tf.function(lambda x: collective_ops.all_reduce_v2(x, 2, 1, 1)).get_concrete_function(
        tf.TensorSpec([4], tf.float32))
    [op] = [op for op in reduce.graph.get_operations() if op.type == "CollectiveReduceV2"]
    assert op.get_attr("max_subdivs_per_device") == 0
