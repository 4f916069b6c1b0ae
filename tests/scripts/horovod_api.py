"""Run on 2 ranks (mpirun, or horovodrun --gloo): the parts of Horovod's TF API
that ringtrain uses, and the Keras 3 paths patch 0005 fixes, used the way
Horovod's documentation and its own tests use them. Each check prints one
JSON line {"rank", "check", "ok", "detail"}; the test wants every check ok on
every rank. Usage: horovod_api.py TIMELINE_PATH
"""
import json
import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")  # what hvd.start_timeline() asks for
import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from adasum_reference import adasum  # noqa: E402

hvd.init()
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
RANK, SIZE = hvd.rank(), hvd.size()
assert SIZE == 2, "run on 2 ranks"


def check(fn):
    """Run one check; report it as a JSON line whatever happens."""
    try:
        detail = fn() or ""
        ok = True
    except Exception as e:  # noqa: BLE001 -- the report names it
        ok, detail = False, f"{type(e).__name__}: {e} | {traceback.format_exc(limit=3)[-600:]}"
    sys.stdout.write(json.dumps({"rank": RANK, "check": fn.__name__, "ok": ok, "detail": str(detail)}) + "\n")
    sys.stdout.flush()


def gathered(tensor):
    """Every rank's value of `tensor`, stacked: [SIZE, ...]."""
    return hvd.allgather(tf.expand_dims(tf.convert_to_tensor(tensor), 0)).numpy()


def rank_model():
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(4), tf.keras.layers.Dense(2)])
    for v in model.variables:  # different weights per rank, on purpose
        v.assign(tf.fill(v.shape, float(RANK + 1)) * 0.1)
    return model


def distributed_gradient_tape():
    """The tape's gradients are the mean of every rank's own gradients."""
    model = rank_model()
    x = tf.fill([2, 3], float(RANK + 1))
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(model(x) ** 2)
    local = tape.gradient(loss, model.trainable_variables)
    averaged = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
    for mine, avg in zip(local, averaged):
        np.testing.assert_allclose(avg.numpy(), gathered(mine).mean(axis=0), rtol=1e-6)
    return f"{len(averaged)} tensors"


def broadcast():
    """broadcast_variables and broadcast_object hand every rank rank 0's values."""
    model = rank_model()
    hvd.broadcast_variables(model.variables, root_rank=0)
    for v in model.variables:
        np.testing.assert_array_equal(v.numpy(), np.full(v.shape, 0.1, np.float32))
    assert hvd.broadcast_object({"from": RANK}, root_rank=0) == {"from": 0}


def allgather():
    """Ranks of different first dimensions, concatenated in rank order."""
    rows = RANK + 1
    out = hvd.allgather(tf.fill([rows, 2], float(RANK))).numpy()
    np.testing.assert_array_equal(out, np.array([[0, 0], [1, 1], [1, 1]], np.float32))
    assert hvd.allgather_object(RANK) == [0, 1]


def join():
    """Rank 0 joins first; rank 1's allreduce still completes, rank 0 adding zeros."""
    if RANK == 1:
        total = hvd.allreduce(tf.ones([3]), op=hvd.Sum, name="join_check").numpy()
        np.testing.assert_array_equal(total, np.ones(3, np.float32))
    last = hvd.join()
    assert last == 1, f"last rank to join: {last}"


def timeline():
    """start_timeline/stop_timeline write a valid trace with the allreduce made in between."""
    path = sys.argv[1]
    hvd.start_timeline(path, mark_cycles=False)
    hvd.allreduce(tf.ones([16])).numpy()
    hvd.stop_timeline()
    if RANK == 0:
        events = json.load(open(path))
        assert any(e.get("name") == "ALLREDUCE" for e in events), events[:6]
        assert any((e.get("args") or {}).get("shape") == "[16]" for e in events), events[:6]
        return f"{len(events)} events"


def partial_distributed_gradient_tape():
    """Horovod's own test: 0, 1 and 2 local layers; local gradients stay this
    rank's (divided by size), the others are averaged; eager and tf.function."""
    x = np.random.RandomState(RANK).random_sample((1, 3)).astype("float32")
    for graph in (False, True):
        for num_local in range(3):
            model = rank_model()
            local_layers = model.layers[:num_local]

            def grads():
                with tf.GradientTape(persistent=True) as tape:
                    loss = tf.reduce_sum(model(x, training=True) ** 2)
                plain = tape.gradient(loss, model.trainable_weights)
                tape = hvd.PartialDistributedGradientTape(tape, local_layers=local_layers)
                reduced = tape.gradient(loss, model.trainable_weights)
                local, global_ = tape.get_local_and_global_gradients(loss, model.trainable_weights)
                if not graph:  # (a tf.function cannot return variables)
                    # it hands back the caller's own variables, which its optimizer knows
                    assert {id(v) for v, _ in local} == local_ids
                return plain, reduced, [g for _, g in local], [g for _, g in global_]

            local_ids = {id(v) for layer in local_layers for v in layer.trainable_weights}
            plain, reduced, local, global_ = tf.function(grads)() if graph else grads()
            for var, mine, got in zip(model.trainable_weights, plain, reduced):
                expected = mine.numpy() / SIZE if id(var) in local_ids else gathered(mine).mean(axis=0)
                np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)
            assert len(local) == len(local_ids) and len(local) + len(global_) == len(model.trainable_weights)
    return "eager and graph, 0-2 local layers"


def register_local_source():
    """Horovod's model-parallel test: an embedding local to each rank,
    registered with register_local_source inside a tf.function step."""
    vocab = 7 if RANK == 0 else 9
    embedding = tf.keras.layers.Embedding(vocab, 3, embeddings_initializer=tf.keras.initializers.Constant(RANK + 1.))
    dense = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer=tf.keras.initializers.Constant(1.))
    optimizer = tf.keras.optimizers.SGD(learning_rate=1.)
    inputs = hvd.alltoall(tf.constant([RANK + 1, RANK], dtype=tf.int64))
    embedding(inputs), dense(tf.zeros([1, 6]))  # build both

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            y = hvd.alltoall(embedding(ids))
            loss = tf.reduce_mean(dense(tf.reshape(y, [1, 6])))
        tape = hvd.DistributedGradientTape(tape)
        tape.register_local_source(embedding.weights[0])
        variables = embedding.trainable_variables + dense.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    step(inputs)
    kernels = gathered(dense.kernel)
    np.testing.assert_array_equal(kernels[0], kernels[1])  # the shared layer agrees
    assert embedding.weights[0].shape[0] == vocab  # the local one kept its own shape


def sync_batch_normalization():
    """Horovod's own test: SyncBatchNormalization on each rank's slice equals
    BatchNormalization on the whole batch; moving statistics too."""
    for cols in (2, 1):
        x = np.stack([np.array([[r, r + 1], [r * 2, r * 2 + 1], [r * 3, r * 3 + 1], [r * 4, r * 4 + 1]],
                               np.float32)[:, :cols] for r in range(SIZE)])
        bn = tf.keras.layers.BatchNormalization(axis=1)
        sync_bn = hvd.SyncBatchNormalization(axis=1)
        expected = bn(x, training=True).numpy()
        got = sync_bn(np.expand_dims(x[RANK], 0), training=True).numpy()
        np.testing.assert_allclose(got, np.expand_dims(expected[RANK], 0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(sync_bn.moving_mean.numpy(), bn.moving_mean.numpy(), rtol=1e-5)
        np.testing.assert_allclose(sync_bn.moving_variance.numpy(), bn.moving_variance.numpy(), rtol=1e-5)


def sync_batch_normalization_keras2_keywords():
    """Keras 2 code passes BatchNormalization keywords Keras 3 lacks: accepted
    at their 'off' values, refused in one line otherwise."""
    layer = hvd.SyncBatchNormalization(axis=-1, momentum=0.9, epsilon=1e-5, fused=False, renorm=False,
                                       renorm_clipping=None, renorm_momentum=0.99, virtual_batch_size=None,
                                       adjustment=None, trainable=True)
    layer(tf.ones([2, 3]), training=True)
    try:
        hvd.SyncBatchNormalization(renorm=True)
    except ValueError as e:
        assert "renorm" in str(e) and "\n" not in str(e), e
    else:
        raise AssertionError("renorm=True was accepted")


def grouped_allreduce_under_adasum():
    """Patch 0012: a grouped allreduce under Adasum (it raised NameError) gives, to the
    bit, what one allreduce per tensor gives, eagerly and in a tf.function; and that is
    Adasum's combination of the ranks' tensors. (Adasum is MPI's only.)"""
    rng = np.random.default_rng(RANK)
    tensors = [tf.constant(rng.standard_normal(shape).astype(np.float32)) for shape in [(3, 5), (7,), (64, 32), (1,)]]
    alone = [hvd.allreduce(t, op=hvd.Adasum, name=f"adasum.alone{i}").numpy() for i, t in enumerate(tensors)]
    grouped = hvd.grouped_allreduce(tensors, op=hvd.Adasum, name="adasum.grouped")
    traced = tf.function(lambda: hvd.grouped_allreduce(tensors, op=hvd.Adasum, name="adasum.traced"),
                         autograph=False)()
    for one, group, trace, mine in zip(alone, grouped, traced, tensors):
        np.testing.assert_array_equal(group.numpy(), one)
        np.testing.assert_array_equal(trace.numpy(), one)
        np.testing.assert_allclose(one, adasum(*gathered(mine)), rtol=1e-5, atol=1e-6)
    return f"{len(tensors)} tensors"


for fn in (distributed_gradient_tape, broadcast, allgather, timeline, partial_distributed_gradient_tape,
           register_local_source, sync_batch_normalization, sync_batch_normalization_keras2_keywords, join,
           *([grouped_allreduce_under_adasum] if hvd.mpi_enabled() and not hvd.gloo_enabled() else [])):
    check(fn)
