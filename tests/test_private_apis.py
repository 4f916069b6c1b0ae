"""The one private TensorFlow API ringtrain uses, checked against the TF
installed: if TF changes it, this says what broke and where, instead of a PS
run failing half-way."""
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
