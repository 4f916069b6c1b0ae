"""Run on 2 ranks (mpirun, or horovodrun --gloo): Horovod's Keras API on Keras 3
(patch 0007), used as Horovod's Keras examples and its own Keras tests use it.

Each check prints one JSON line {"rank", "check", "ok", "detail", ...numbers}:
"ok" is false only when the check raised; the test judges the numbers. Where
training is numeric, a check trains a small model for a few steps of
`Model.fit` (2 ranks x batch B) and compares the weights with the same model
trained in this process without Horovod: one process on the global batch
(2B), or, where the ranks keep something of their own (local layers, Adasum),
both ranks' training simulated step by step. Usage: keras_api.py TMP_DIR
"""
import json
import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import horovod.keras as hvd_keras  # noqa: E402
import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from adasum_reference import adasum  # noqa: E402

hvd.init()
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
RANK, SIZE = hvd.rank(), hvd.size()
assert SIZE == 2, "run on 2 ranks"
TMP = sys.argv[1]
B = 4  # each rank's batch
LR = 0.1
GLOBAL_X = np.random.RandomState(0).normal(size=(64, 4)).astype("float32")  # the same on every rank
GLOBAL_Y = np.tanh(GLOBAL_X @ np.random.RandomState(1).normal(size=(4, 2))).astype("float32")
MSE = keras.losses.MeanSquaredError()


def check(fn):
    """Run one check; report it as one JSON line whatever happens."""
    try:
        numbers, ok, detail = fn() or {}, True, ""
    except Exception as e:  # noqa: BLE001 -- the report names it
        numbers, ok = {}, False
        detail = f"{type(e).__name__}: {e} | {traceback.format_exc(limit=4)[-700:]}"
    sys.stdout.write(json.dumps({"rank": RANK, "check": fn.__name__, "ok": ok, "detail": detail, **numbers}) + "\n")
    sys.stdout.flush()


# --- models, data and references ---------------------------------------------------------------

def mlp():
    """4 -> 8 (tanh) -> 2, the same seeded weights on every rank."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])
    rng = np.random.RandomState(2)
    model.set_weights([rng.normal(scale=0.5, size=w.shape).astype("float32") for w in model.get_weights()])
    return model


def step_rows(step, rank, batch=B):
    """This rank's share of global step `step`: the global batch is SIZE x batch rows."""
    start = step * SIZE * batch + rank * batch
    return slice(start, start + batch)


def rank_data(steps, rank=RANK, batch=B):
    rows = np.concatenate([np.arange(64)[step_rows(s, rank, batch)] for s in range(steps)])
    return GLOBAL_X[rows], GLOBAL_Y[rows]


def fit(model, optimizer, steps, callbacks=(), epochs=1, batch=B):
    """`epochs` epochs of fit, each the first `steps` steps of this rank's data."""
    model.compile(optimizer=optimizer, loss="mse")
    x, y = rank_data(steps, batch=batch)
    return model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0, callbacks=list(callbacks))


def gradients(model, x, y):
    with tf.GradientTape() as tape:
        loss = MSE(y, model(x, training=True))
    return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


def one_process(steps, lr=LR, momentum=0.0, batch=SIZE * B):
    """Plain Keras in this process, no Horovod: `steps` steps on the global batch."""
    model = mlp()
    optimizer = keras.optimizers.SGD(lr, momentum=momentum)
    for s in range(steps):
        rows = slice(s * batch, (s + 1) * batch)
        grads = gradients(model, GLOBAL_X[rows], GLOBAL_Y[rows])
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return model.get_weights()


def simulated_ranks(updates, combine=lambda gs: sum(gs) / len(gs), local=(), passes=1, average=True, lr=LR):
    """Both ranks' models, SGD, stepped as Horovod steps them: each rank sums its
    gradients over `passes` backward passes (divided by `passes` if average),
    the shared variables take combine(every rank's), the `local` ones (indices)
    their own, divided by the size. Returns each rank's weights."""
    models = [mlp() for _ in range(SIZE)]
    for u in range(updates):
        per_rank = []
        for r, model in enumerate(models):
            total = None
            for p in range(passes):
                x, y = GLOBAL_X[step_rows(u * passes + p, r)], GLOBAL_Y[step_rows(u * passes + p, r)]
                grads = gradients(model, x, y)
                total = grads if total is None else [t + g for t, g in zip(total, grads)]
            per_rank.append([t / passes for t in total] if average else total)
        for i in range(len(per_rank[0])):
            shared = combine([grads[i] for grads in per_rank])
            for r, model in enumerate(models):
                grad = per_rank[r][i] / SIZE if i in local else shared
                model.trainable_variables[i].assign_sub(lr * grad)
    return [model.get_weights() for model in models]


def max_diff(a, b):
    return float(max(np.max(np.abs(np.asarray(x) - np.asarray(y))) for x, y in zip(a, b)))


def across_ranks(weights):
    """The largest difference between any rank's weights and rank 0's."""
    flat = np.concatenate([np.ravel(w) for w in weights]).astype("float64")
    every = hvd_tf.allgather(tf.expand_dims(tf.constant(flat), 0)).numpy()
    return float(np.max(np.abs(every - every[0])))


def against(model, reference, **more):
    return {"vs_reference": max_diff(model.get_weights(), reference),
            "across_ranks": across_ranks(model.get_weights()), **more}


def one_line_error(call):
    """The message of the exception call() raises, for the test to read."""
    try:
        call()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return "no error"


# --- the checks ------------------------------------------------------------------------------------

def fit_distributed_optimizer():
    """Horovod's Keras recipe: DistributedOptimizer, the broadcast callback, model.fit."""
    model = mlp()
    fit(model, hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9)), steps=3,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return against(model, one_process(3, momentum=0.9), iterations=int(model.optimizer.iterations.numpy()))


def fit_horovod_keras():
    """The same through horovod.keras, the standalone-Keras API."""
    model = mlp()
    fit(model, hvd_keras.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9)), steps=3,
        callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)])
    return against(model, one_process(3, momentum=0.9))


def train_on_batch():
    model = mlp()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9)), loss="mse")
    x, y = rank_data(3)
    for s in range(3):
        model.train_on_batch(x[s * B:(s + 1) * B], y[s * B:(s + 1) * B])
    return against(model, one_process(3, momentum=0.9))


def fp16_compression():
    model = mlp()
    fit(model, hvd.DistributedOptimizer(keras.optimizers.SGD(LR), compression=hvd.Compression.fp16), steps=3)
    return against(model, one_process(3))


def gradient_aggregation():
    """backward_passes_per_step=2: 4 passes of batch B on 2 ranks make 2 updates,
    each one process's step on 4B rows (summed, not averaged: twice the step)."""
    numbers = {}
    for average in (True, False):
        model = mlp()
        fit(model, hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9), backward_passes_per_step=2,
                                            average_aggregated_gradients=average), steps=4)
        reference = one_process(2, lr=LR if average else 2 * LR, momentum=0.9, batch=2 * SIZE * B)
        tag = "averaged" if average else "summed"
        numbers[f"{tag}_vs_reference"] = max_diff(model.get_weights(), reference)
        numbers[f"{tag}_across_ranks"] = across_ranks(model.get_weights())
        numbers[f"{tag}_iterations"] = int(model.optimizer.iterations.numpy())
    return numbers


def gradient_aggregation_with_local_variables():
    """backward_passes_per_step=2 with the first layer registered local: that layer
    keeps each rank's own (aggregated gradient / size), the rest is averaged."""
    numbers = {}
    for average in (True, False):
        model = mlp()
        optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(LR), backward_passes_per_step=2,
                                             average_aggregated_gradients=average)
        for var in model.layers[0].trainable_weights:
            optimizer.register_local_var(var)
        fit(model, optimizer, steps=4)
        reference = simulated_ranks(2, local=(0, 1), passes=2, average=average)[RANK]
        numbers[f"{'averaged' if average else 'summed'}_vs_reference"] = max_diff(model.get_weights(), reference)
    numbers["local_layer_across_ranks"] = across_ranks(model.get_weights()[:2])  # differs: each rank's own
    return numbers


def sparse_gradients():
    """An Embedding's gradient is sparse (tf.IndexedSlices): allgathered, or
    allreduced as dense with sparse_as_dense=True."""
    ids = np.random.RandomState(3).randint(0, 10, size=(64, 3))
    targets = np.random.RandomState(4).normal(size=(64, 1)).astype("float32")

    def embedding_model():
        model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(10, 4),
                                  keras.layers.Flatten(), keras.layers.Dense(1)])
        rng = np.random.RandomState(5)
        model.set_weights([rng.normal(size=w.shape).astype("float32") for w in model.get_weights()])
        return model

    reference = embedding_model()
    optimizer = keras.optimizers.SGD(LR)
    for s in range(3):
        rows = slice(s * SIZE * B, (s + 1) * SIZE * B)
        with tf.GradientTape() as tape:
            loss = MSE(targets[rows], reference(ids[rows], training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, reference.trainable_variables),
                                      reference.trainable_variables))
    rows = np.concatenate([np.arange(64)[step_rows(s, RANK)] for s in range(3)])
    numbers = {}
    for dense in (True, False):
        model = embedding_model()
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR), sparse_as_dense=dense),
                      loss="mse")
        model.fit(ids[rows], targets[rows], batch_size=B, shuffle=False, verbose=0)
        tag = "sparse_as_dense" if dense else "sparse"
        numbers[f"{tag}_vs_reference"] = max_diff(model.get_weights(), reference.get_weights())
        numbers[f"{tag}_across_ranks"] = across_ranks(model.get_weights())
    return numbers


def adasum_op():
    """op=hvd.Adasum: each gradient combined by Adasum, not averaged (MPI only)."""
    if hvd.gloo_enabled() and not hvd.mpi_enabled():
        return {"error": one_line_error(lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(LR), op=hvd.Adasum))}
    model = mlp()
    fit(model, hvd.DistributedOptimizer(keras.optimizers.SGD(LR), op=hvd.Adasum), steps=3)
    averaged = simulated_ranks(3)[RANK]
    return against(model, simulated_ranks(3, combine=lambda gs: adasum(*gs))[RANK],
                   vs_averaging=max_diff(model.get_weights(), averaged))


def partial_distributed_optimizer():
    """local_layers keep each rank's own gradient (divided by the size); tf.keras and keras APIs."""
    numbers = {}
    for api in (hvd, hvd_keras):
        model = mlp()
        fit(model, api.PartialDistributedOptimizer(keras.optimizers.SGD(LR), local_layers=[model.layers[0]]), steps=3)
        tag = api.__name__.replace(".", "_")
        numbers[f"{tag}_vs_reference"] = max_diff(model.get_weights(), simulated_ranks(3, local=(0, 1))[RANK])
        numbers[f"{tag}_shared_across_ranks"] = across_ranks(model.get_weights()[2:])
        numbers[f"{tag}_local_across_ranks"] = across_ranks(model.get_weights()[:2])
    return numbers


def broadcast_callback_with_local_variables():
    """Horovod's own test: every rank starts from its own values; after a step of fit
    (learning rate 0, so only the broadcast moves them) the shared variables hold
    the root's and the local ones (the first layer's) their own."""
    root = SIZE - 1
    model = mlp()
    model.set_weights([np.full(w.shape, float(RANK), "float32") for w in model.get_weights()])
    local = model.layers[0].variables
    fit(model, hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), steps=1,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(root, local_variables=local)])
    weights = model.get_weights()
    return {"shared_minus_root": max_diff(weights[2:], [np.full(w.shape, float(root)) for w in weights[2:]]),
            "local_minus_own": max_diff(weights[:2], [np.full(w.shape, float(RANK)) for w in weights[:2]])}


class Record(keras.callbacks.Callback):
    """What the callbacks before it left: each epoch's logs, each batch's learning rate."""

    def __init__(self):
        super().__init__()
        self.epochs, self.lrs = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(self.model.optimizer.learning_rate.numpy()))

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs))


def metric_average_callback():
    """Each epoch's loss on every rank becomes the ranks' mean."""
    raw = Record()
    history = fit(mlp(), hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), steps=2, epochs=2,
                  callbacks=[raw, hvd.callbacks.MetricAverageCallback()]).history["loss"]
    own = np.array([e["loss"] for e in raw.epochs])
    every = hvd_tf.allgather(tf.constant([own])).numpy()
    return {"minus_mean_of_ranks": float(np.max(np.abs(np.array(history) - every.mean(axis=0)))),
            "ranks_own_differ_by": float(np.max(np.abs(every[0] - every[1]))),
            "across_ranks": float(max(abs(a - b) for a, b in zip(history, hvd_tf.broadcast_object(history, 0))))}


def learning_rate_callbacks():
    """Warm-up over 2 epochs, then a 0.25x schedule for epoch 2, with momentum
    correction; 3 epochs of 2 steps. The learning rate each batch saw against
    Horovod's formulas, and the weights against one process stepping with the
    same rates and the same correction (velocity x new_lr / old_lr)."""
    initial, steps_per_epoch, warmup, momentum = 0.2, 2, 2, 0.9
    seen = Record()
    model = mlp()
    fit(model, hvd.DistributedOptimizer(keras.optimizers.SGD(initial, momentum=momentum)), steps=steps_per_epoch,
        epochs=3, callbacks=[hvd.callbacks.LearningRateWarmupCallback(initial, warmup_epochs=warmup),
                             hvd.callbacks.LearningRateScheduleCallback(initial, multiplier=lambda epoch: 0.25,
                                                                        start_epoch=2, end_epoch=3),
                             seen])
    expected = []
    for epoch in range(3):
        for batch in range(steps_per_epoch):
            if epoch < warmup:
                e = epoch + batch / steps_per_epoch + 1 / steps_per_epoch
                expected.append(initial / SIZE * (e * (SIZE - 1) / warmup + 1))
            else:
                expected.append(expected[-1] if batch else initial * 0.25)
    reference, velocity, previous = mlp(), None, initial
    for s, lr in enumerate(expected):
        rows = slice(s % steps_per_epoch * SIZE * B, (s % steps_per_epoch + 1) * SIZE * B)
        grads = gradients(reference, GLOBAL_X[rows], GLOBAL_Y[rows])
        velocity = [0 * g for g in grads] if velocity is None else [v * lr / previous for v in velocity]
        velocity = [momentum * v - lr * g for v, g in zip(velocity, grads)]
        for var, v in zip(reference.trainable_variables, velocity):
            var.assign_add(v)
        previous = lr
    return against(model, reference.get_weights(), lr_minus_formula=max_diff([seen.lrs], [expected]))


def best_model_checkpoint():
    """BestModelCheckpoint (rank 0 only, as Horovod's examples save) keeps the epoch
    whose loss was lowest; hvd.load_model brings it back with a DistributedOptimizer."""
    path = os.path.join(TMP, "best.keras")

    class EpochWeights(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            ends.append(self.model.get_weights())

    ends = []
    callbacks = [EpochWeights()]
    if RANK == 0:
        callbacks.append(hvd.callbacks.BestModelCheckpoint(monitor="loss", filepath=path))
    losses = fit(mlp(), hvd.DistributedOptimizer(keras.optimizers.SGD(1.5)), steps=1, epochs=4,
                 callbacks=callbacks).history["loss"]
    hvd_tf.broadcast_object(0, 0)  # the file is written before anyone reads it
    best = int(np.argmin(losses))
    loaded = hvd.load_model(path)
    return {"best_epoch": best, "losses": [round(v, 4) for v in losses],
            "saved_minus_best_epoch": max_diff(loaded.get_weights(), ends[best]),
            "loaded_distributed": bool(getattr(type(loaded.optimizer), "_HOROVOD_DISTRIBUTED", False))}


def load_model():
    """A model trained with a DistributedOptimizer and saved as .keras (rank 0):
    hvd.load_model wraps its optimizer again with its state, and two more steps
    of fit equal one process's fourth and fifth. Plain Keras loads it too."""
    path = os.path.join(TMP, "trained.keras")
    model = mlp()
    fit(model, hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9)), steps=3)
    if RANK == 0:
        model.save(path)
    hvd_tf.broadcast_object(0, 0)
    loaded = hvd.load_model(path)
    state = max_diff(loaded.optimizer.variables, model.optimizer.variables)
    x, y = rank_data(5)
    loaded.fit(x[3 * B:], y[3 * B:], batch_size=B, shuffle=False, verbose=0)
    plain = keras.models.load_model(path).optimizer
    return against(loaded, one_process(5, momentum=0.9), optimizer_state_after_load=state,
                   loaded_distributed=bool(getattr(type(loaded.optimizer), "_HOROVOD_DISTRIBUTED", False)),
                   plain_keras_loads=f"{type(plain).__module__}.{type(plain).__name__}",
                   plain_distributed=bool(getattr(type(plain), "_HOROVOD_DISTRIBUTED", False)))


def keras2_calls():
    """Keras 2 calls that Keras 3 does not have: each says so in one line, naming
    the Keras 3 way. Also what still works: variables() and a rebuild from config."""
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01))
    model = mlp()
    config = opt.get_config()
    errors = {
        "compute_gradients": one_line_error(lambda: opt.compute_gradients(lambda: 0.0, model.trainable_variables)),
        "get_gradients": one_line_error(lambda: opt.get_gradients(0.0, model.trainable_variables)),
        "lr": one_line_error(lambda: opt.lr),
        "from_config_lr": one_line_error(lambda: opt.from_config({**config, "lr": 0.1})),
        "legacy_opts": one_line_error(lambda: hvd.load_model(os.path.join(TMP, "none.keras"), legacy_opts=True)),
        "not_keras3_optimizer": one_line_error(
            lambda: hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))),
        "best_model_checkpoint_no_path": one_line_error(lambda: hvd.callbacks.BestModelCheckpoint()),
    }
    return {"errors": errors, "variables_call": len(opt.variables()) == len(opt.variables),
            "from_config_same": opt.from_config(config).get_config() == config
            and type(opt).from_config(config).get_config() == config}


def keras_collectives():
    """The Keras APIs' own allreduce, allgather and broadcast of plain values."""
    numbers = {}
    for api in (hvd, hvd_keras):
        tag = api.__name__.replace(".", "_")
        numbers[f"{tag}_allreduce"] = np.asarray(api.allreduce(np.array([RANK + 1.0, 2.0 * RANK]))).tolist()
        numbers[f"{tag}_allgather"] = np.asarray(api.allgather(np.array([[RANK]]))).ravel().tolist()
        numbers[f"{tag}_broadcast"] = np.asarray(api.broadcast(np.array([RANK + 5.0]), root_rank=1)).tolist()
    return numbers


def elastic_state():
    """Horovod's own test of hvd.elastic.KerasState (sync, restore, commit), then
    its three callbacks through two epochs of fit."""
    model = mlp()
    model.set_weights([np.full(w.shape, float(RANK + 1), "float32") for w in model.get_weights()])
    optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001))
    model.compile(optimizer=optimizer, loss="mse")
    optimizer.build(model.trainable_variables)
    state = hvd.elastic.KerasState(model, batch=20 + RANK, epoch=10 + RANK)
    state.sync()
    synced = max_diff(model.get_weights(), [np.ones(w.shape) for w in model.get_weights()])
    numbers = {"sync_minus_root": synced, "synced_batch_epoch": [state.batch, state.epoch]}
    model.set_weights([np.full(w.shape, 7.0, "float32") for w in model.get_weights()])
    state.batch, state.epoch = 21, 11
    state.restore()
    numbers["restore_minus_saved"] = max_diff(model.get_weights(), [np.ones(w.shape) for w in model.get_weights()])
    numbers["restored_batch_epoch"] = [state.batch, state.epoch]
    model.set_weights([np.full(w.shape, 7.0, "float32") for w in model.get_weights()])
    state.batch, state.epoch = 21, 11
    state.commit()
    state.restore()
    numbers["commit_minus_committed"] = max_diff(model.get_weights(),
                                                 [np.full(w.shape, 7.0) for w in model.get_weights()])
    numbers["committed_batch_epoch"] = [state.batch, state.epoch]

    commits, batches = [], []
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    original = state.commit
    state.commit = lambda: (commits.append(1), original())

    class Batches(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            batches.append(state.batch)

    x, y = rank_data(6)
    model.fit(x, y, batch_size=B, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                         hvd.elastic.CommitStateCallback(state, batches_per_commit=2), Batches()])
    numbers.update(after_fit_batch_epoch=[state.batch, state.epoch], commits=len(commits), batches=batches)
    return numbers


for fn in (fit_distributed_optimizer, fit_horovod_keras, train_on_batch, fp16_compression, gradient_aggregation,
           gradient_aggregation_with_local_variables, sparse_gradients, adasum_op, partial_distributed_optimizer,
           broadcast_callback_with_local_variables, metric_average_callback, learning_rate_callbacks,
           best_model_checkpoint, load_model, keras2_calls, keras_collectives, elastic_state):
    check(fn)
