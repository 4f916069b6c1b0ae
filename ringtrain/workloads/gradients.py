"""Applying an update only when it is finite: the one guard behind
--on-nan, for Keras optimizers in a tf.function (ring, towers, TF2 PS, TF's
collective mode) and for tf.compat.v1 optimizers in a graph (the PS of the
classic distributed-TensorFlow tutorials). A non-finite gradient never
reaches the weights; the loop decides whether to stop or go on. Also how a
step's gradients are made (micro-batches accumulated, a loss scale undone)
and grouped into buckets for their all-reduce (TF's collective mode, ring mode)."""


def all_finite(tf, grads):
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(g))) for g in grads if g is not None])


# TF collective mode's buckets (--bucket-mb), measured: docs/results/2026-12-02-tf-ring-subdivisions.md
DEFAULT_BUCKET_MB = 16.0
# TF collective mode's last bucket, the first layers' gradients (tf_buckets), at most this;
# measured: docs/results/2026-12-02-tf-last-bucket-and-one-machine.md
LAST_BUCKET_MB = 1.0
# Ring mode's (--bucket-mb under Horovod), measured: docs/results/2026-11-29-ring-buckets.md
DEFAULT_RING_BUCKET_MB = 0.5


def ring_buckets(sizes, bucket_bytes):
    """Ring mode's buckets: lists of indices into `sizes` (each gradient's
    bytes, in the model's order), last layers first. A gradient of at least
    `bucket_bytes` is all-reduced alone, in place (in a fused bucket Horovod
    would copy it in and out of its fusion buffer); smaller ones are grouped,
    in the order backprop makes them, until a group holds `bucket_bytes`.
    0: each gradient alone (Horovod's fusion of whatever is ready in a cycle)."""
    buckets, small, filled = [], None, 0
    for i in reversed(range(len(sizes))):
        if not bucket_bytes or sizes[i] >= bucket_bytes:
            buckets.append([i])
            continue
        if small is None:
            small, filled = [], 0
            buckets.append(small)
        small.append(i)
        filled += sizes[i]
        if filled >= bucket_bytes:
            small = None
    return buckets


def tf_buckets(sizes, bucket_bytes, last_bytes=None):
    """TF collective mode's buckets: lists of indices into `sizes` (each
    gradient's bytes, in the model's order), last layers first, grouped as TF
    groups a pack (CommunicationOptions.bytes_per_pack): a new bucket once the
    last holds more than `bucket_bytes`. Where they fill more than one, the
    first layers' gradients, at most `last_bytes` of them (LAST_BUCKET_MB, or
    a bucket if less, unless given), are the last bucket, alone: backprop
    makes them last, so theirs is the all-reduce left when it ends. 0, or
    gradients that fit one bucket: one bucket (mnist_cnn's 4.8 MB with its
    first layers' apart ran no faster across hosts, and 2-3 % slower on one)."""
    if not bucket_bytes or sum(sizes) <= bucket_bytes:
        return [list(reversed(range(len(sizes))))] if sizes else []
    last_bytes = min(bucket_bytes, LAST_BUCKET_MB * 2**20) if last_bytes is None else last_bytes
    first, held = 0, 0
    while first < len(sizes) and held + sizes[first] <= last_bytes:
        first, held = first + 1, held + sizes[first]
    buckets, filled = [], 0
    for i in reversed(range(first, len(sizes))):
        if not buckets or filled > bucket_bytes:
            buckets.append([])
            filled = 0
        buckets[-1].append(i)
        filled += sizes[i]
    return buckets + ([list(reversed(range(first)))] if first else [])


def reduce_in_buckets(grads, plan, reduce):
    """`grads` reduced bucket by bucket, in the order of the buckets, each
    mode's plan and collective its own: `plan(present)` gives the buckets as
    lists of indices into the gradients that exist, `reduce(tensors)` one
    bucket's results in its order. None gradients (a variable the loss does
    not use) stay None."""
    present = [g for g in grads if g is not None]
    reduced = [None] * len(present)
    for bucket in plan(present):
        for i, r in zip(bucket, reduce([present[i] for i in bucket])):
            reduced[i] = r
    reduced = iter(reduced)
    return [None if g is None else next(reduced) for g in grads]


def all_reduce_in_buckets(tf, grads, bucket_bytes):
    """The SUM of every worker's `grads`, all-reduced in tf_buckets (0: one),
    each bucket one packed all-reduce of TF's own, started once backprop has
    made its gradients while backprop goes on to the earlier layers, as
    Horovod's fusion and PyTorch DDP's buckets do. The collectives keep the
    order they are made in on every worker (TF's ordering token). In a
    strategy's replica context; None gradients stay None."""
    context = tf.distribute.get_replica_context()
    return reduce_in_buckets(
        grads, lambda present: tf_buckets([g.shape.num_elements() * g.dtype.size for g in present], bucket_bytes),
        lambda tensors: context.all_reduce("SUM", tensors))


def already_summed(optimizer):
    """A Keras optimizer that applies the gradients it is given as they are:
    under a strategy Keras would all-reduce them again (one packed all-reduce,
    once backprop is done), and these are the all-reduced sum already.
    (Keras's TensorFlow optimizer's one hook for it: tests/test_private_apis.py.)"""
    optimizer._all_reduce_sum_gradients = lambda grads_and_vars: list(grads_and_vars)
    return optimizer


def apply_if_finite(optimizer, grads, variables):
    """optimizer.apply_gradients(zip(grads, variables)) unless a gradient is
    not finite; returns whether it applied (a bool tensor). In a tf.function,
    alone or in a strategy's replica context. Where workers step together,
    `grads` are the all-reduced sum, the same on every worker, so that all of
    them apply it, or skip it, together."""
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

    def __init__(self, tf, optimizer, skipped, loss_scale=None):
        """loss_scale: a LossScale (--precision mixed_float16), which every
        update, applied or skipped, moves."""
        self._tf, self._optimizer, self.skipped, self.loss_scale = tf, optimizer, skipped, loss_scale

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
            rescaled = self.loss_scale.update(applied)[0] if self.loss_scale else tf.no_op()
            with tf.control_dependencies([count, rescaled]):
                return global_step.assign_add(1).op if global_step is not None else tf.no_op()

    def _apply(self, grads_and_vars):
        tf = self._tf
        with tf.control_dependencies([self._optimizer.apply_gradients(grads_and_vars)]):
            return tf.constant(True)


# --- one update from K micro-batches (--accumulate), and float16's loss scale ---------

class LossScale:
    """Dynamic loss scaling, for --precision mixed_float16, as Keras's
    LossScaleOptimizer does it: the loss is multiplied by the scale before
    backprop, so that small gradients do not underflow in float16, and the
    gradients divided by it after. An update whose gradients overflowed is
    skipped and the scale halved; after GROWTH finite updates it doubles. One
    implementation for every mode, eager or graph: its two variables are
    checkpointed with the model."""
    INITIAL, GROWTH = 2.0 ** 15, 2000

    def __init__(self, tf, make_variable=None):
        self.tf = tf
        make = make_variable or (lambda name, value, dtype: tf.Variable(value, dtype=dtype, trainable=False,
                                                                         name=name))
        self.scale = make("loss_scale", self.INITIAL, tf.float32)
        self.finite_updates = make("loss_scale_finite_updates", 0, tf.int64)

    def variables(self):
        return {"loss_scale": self.scale, "loss_scale_finite_updates": self.finite_updates}

    def update(self, applied, loss_sum=None):
        """The scale after an update: applied (finite), or skipped (overflowed).
        Returns (the op, whether the loss scale explains the skip: the loss was
        finite and the scale still above 1, so that --on-nan does not stop for
        it; below that, a non-finite gradient is divergence)."""
        tf = self.tf
        before = tf.identity(self.scale)
        count = tf.where(applied, self.finite_updates + 1, tf.constant(0, tf.int64))
        grow = count >= self.GROWTH
        scale = tf.where(applied, tf.where(grow, before * 2.0, before), tf.maximum(before / 2.0, 1.0))
        op = tf.group(self.scale.assign(scale), self.finite_updates.assign(tf.where(grow, tf.zeros_like(count),
                                                                                   count)))
        overflow = tf.logical_and(tf.logical_not(applied), before > 1.0)
        if loss_sum is not None:
            overflow = tf.logical_and(overflow, tf.math.is_finite(loss_sum))
        return op, overflow


def rescaled(tf, loss_scale, applied, loss_sum):
    """After an update: float16's loss scale moved (an op, or nothing without
    one), and whether the update was skipped for an overflow the scale explains."""
    if loss_scale is None:
        return tf.no_op(), tf.constant(False)
    with tf.control_dependencies([applied]):
        return loss_scale.update(applied, loss_sum)


def accumulated(tf, model, batch, divisor, loss_scale=None, exchange=None, after_forward=None):
    """One update's gradients in a tf.function: the sum over its K micro-batches
    (batch: images [K, b, ...], labels, weights [K, b], the update's samples) of
    the gradient of weighted loss / divisor, one micro-batch after the other
    (one micro-batch's activations at a time), unscaled where a loss scale is
    given. exchange(grads, grouped): the mode's gradient exchange, before the
    unscaling; it returns them reduced. Where K is 1 it is given the tape's
    gradients (grouped=False), in a graph that starts each one's exchange as
    backprop makes it; else the K micro-batches' sum (grouped=True).
    after_forward(): run after the last forward pass. Returns (loss sum,
    samples, gradients)."""
    from ringtrain.workloads.models import weighted_loss_sum
    images, labels, weights, _ = batch
    variables, k = model.trainable_variables, images.shape[0]
    scale = tf.identity(loss_scale.scale) if loss_scale else None  # (one value for the whole update)
    total, grads = tf.constant(0.0), None
    for m in range(k):
        with tf.control_dependencies([g for g in grads or [] if g is not None]):  # one micro-batch at a time
            with tf.GradientTape() as tape:
                loss_sum = weighted_loss_sum(model, images[m], labels[m], weights[m])
                loss = loss_sum / divisor * (scale if scale is not None else 1.0)
            if after_forward and m == k - 1:
                after_forward()
            micro = tape.gradient(loss, variables)
        grads = micro if grads is None else [_add(tf, a, b) for a, b in zip(grads, micro)]
        total += loss_sum
    if exchange:
        grads = exchange(grads, grouped=k > 1)
    if scale is not None:
        grads = [None if g is None else g / scale for g in grads]
    return total, tf.reduce_sum(weights), grads


def _add(tf, a, b):
    if a is None or b is None:
        return b if a is None else a
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


def graph_accumulated(tf, model, feeds, divisor, compute_gradients, scale=None, before=()):
    """accumulated, in a tf.compat.v1 graph: compute_gradients(loss) gives
    [(gradient, variable)] (the optimizer's own, or its tower's); feeds:
    placeholders with K micro-batches. Returns (loss sum, [(gradient, variable)])."""
    from ringtrain.workloads.models import per_example_loss
    k, total, summed, deps = feeds.images.shape[0], 0.0, None, list(before)
    for m in range(k):
        with tf.control_dependencies(deps):
            logits = model(feeds.images[m], training=True)
        loss_sum = tf.reduce_sum(feeds.weights[m] * per_example_loss(logits, feeds.labels[m]))
        loss = loss_sum / divisor * (scale if scale is not None else 1.0)
        pairs = compute_gradients(loss)
        summed = pairs if summed is None else [(_add(tf, g, h), v) for (g, v), (h, _) in zip(summed, pairs)]
        deps, total = [g for g, _ in summed if g is not None], total + loss_sum
    if scale is not None:
        summed = [(None if g is None else g / scale, v) for g, v in summed]
    return total, summed
