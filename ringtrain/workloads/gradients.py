"""Applying an update only when it is finite: the one guard behind
--on-nan, for Keras optimizers in a tf.function (ring, towers, TF2 PS, TF's
collective mode) and for tf.compat.v1 optimizers in a graph (the PS of the
classic distributed-TensorFlow tutorials). A non-finite gradient never
reaches the weights; the loop decides whether to stop or go on."""


def all_finite(tf, grads):
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(g))) for g in grads])


def apply_if_finite(optimizer, grads, variables, agree=False):
    """optimizer.apply_gradients(zip(grads, variables)) unless a gradient is
    not finite; returns whether it applied (a bool tensor). In a tf.function,
    alone or in a strategy's replica context. agree=True: `grads` are this
    worker's own, which the optimizer all-reduces (TF's collective mode); the
    workers agree on "finite" first, with one 4-byte all-reduce of how many of
    them hold a non-finite gradient (a sum is non-finite when one of its terms
    is; two huge finite ones whose sum overflows are not caught)."""
    import tensorflow as tf
    grads = list(grads)

    def apply(grads=grads):
        optimizer.apply_gradients(zip(grads, variables))
        return tf.constant(True)

    skip = lambda: tf.constant(False)
    context = tf.distribute.get_replica_context()
    if not tf.distribute.has_strategy() or context is None:
        return tf.cond(all_finite(tf, grads), apply, skip)
    finite = all_finite(tf, grads)
    if agree:
        broken = context.all_reduce(tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(finite, tf.float32))
        finite = tf.equal(broken, 0.0)

    # Under a tf.distribute strategy the Keras optimizer's step may be a merge_call,
    # which a branch of a cond in replica context may not make: the cond runs in
    # cross-replica context, as Keras's own LossScaleOptimizer does it.
    def cross_replica(distribution, finite, grads):
        def apply_on_every_replica():
            distribution.extended.call_for_each_replica(apply, args=(grads,))
            return tf.constant(True)
        finite = distribution.experimental_local_results(finite)[0]
        return tf.cond(finite, apply_on_every_replica, skip)

    return context.merge_call(cross_replica, args=(finite, grads))


class SkipNonFinite:
    """A tf.compat.v1 optimizer whose apply_gradients applies only a finite
    update, and counts the ones it skips in `skipped` (a variable beside the
    global step). The global step advances either way: synchronous PS hands
    out its tokens by it. Wraps the optimizer SyncReplicasOptimizer applies
    (the workers' average) or, async, the one each worker applies."""

    def __init__(self, tf, optimizer, skipped):
        self._tf, self._optimizer, self.skipped = tf, optimizer, skipped

    def __getattr__(self, name):  # compute_gradients, get_slot, variables...
        return getattr(self._optimizer, name)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        tf = self._tf
        grads_and_vars = [(g, v) for g, v in grads_and_vars if g is not None]
        # (slots are made outside the cond: TF1's optimizer makes them in an init scope)
        finite = all_finite(tf, [g for g, _ in grads_and_vars])
        applied = tf.cond(finite, lambda: self._apply(grads_and_vars), lambda: tf.constant(False))
        with tf.control_dependencies([applied]):
            count = tf.cond(applied, lambda: tf.identity(self.skipped), lambda: self.skipped.assign_add(1))
            with tf.control_dependencies([count]):
                return global_step.assign_add(1).op if global_step is not None else tf.no_op()

    def _apply(self, grads_and_vars):
        tf = self._tf
        with tf.control_dependencies([self._optimizer.apply_gradients(grads_and_vars)]):
            return tf.constant(True)
