"""Run on 2 ranks (mpirun -np 2): TF collective mode's gradient exchange
(workloads.gradients.all_reduce_in_buckets) in the strategy's replica step,
as its train step makes it. Every rank gives gradients of its own, a None
among them, exchanged in one pack and in buckets whose first layers'
gradients go last and alone (tf_buckets): each must come back as the two
ranks' sum. Prints one JSON line per case: {"rank", "check", "ok",
"detail"}."""
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402

from ringtrain import collective  # noqa: E402
from ringtrain.workloads.gradients import all_reduce_in_buckets, tf_buckets  # noqa: E402
from ringtrain.workloads.tfenv import import_tensorflow_quietly, set_threads, step_function  # noqa: E402

RANK, WORKERS = collective.cluster(0)  # (TF_CONFIG from mpirun's ranks, a free port each)
assert len(WORKERS) == 2, "run on 2 ranks"
tf = import_tensorflow_quietly()
set_threads(1)
strategy = collective.connect(tf, "RING")
MB = 2**20
# the model's order: two small first layers, a None, 1 MiB, 2 MiB, a small last layer
SHAPES = [(3, 3), (5,), None, (256, 1024), (512, 1024), (7,)]
# (tf_buckets' indices: of the gradients not None)
CASES = {"one-pack": (0, [[4, 3, 2, 1, 0]]), "buckets-first-layers-last": (MB, [[4, 3], [2], [1, 0]]),
         "fits-one-bucket": (16 * MB, [[4, 3, 2, 1, 0]])}


def gradients(rank):
    return [None if s is None else (np.arange(np.prod(s), dtype=np.float32).reshape(s) % 1000) * (rank + 1) + rank
            for s in SHAPES]


def exchanged(bucket_bytes):
    """Each rank's gradients, all-reduced as the train step all-reduces them."""
    def replica():
        grads = [None if g is None else tf.constant(g) for g in gradients(RANK)]
        summed = all_reduce_in_buckets(tf, grads, bucket_bytes)
        assert summed[2] is None, "the None gradient did not stay None"
        return [s for s in summed if s is not None]
    return [strategy.experimental_local_results(t)[0].numpy() for t in step_function(lambda: strategy.run(replica))()]


with collective.chief_leaves_first(RANK, WORKERS):  # (rank 1 keeps its server up for rank 0's last pull)
    for case, (bucket_bytes, expected) in CASES.items():
        try:
            buckets = tf_buckets([4 * int(np.prod(s)) for s in SHAPES if s is not None], bucket_bytes)
            assert buckets == expected, f"buckets {buckets}, not {expected}"
            want = [a + b for a, b in zip(gradients(0), gradients(1)) if a is not None]
            for i, (got, sum_) in enumerate(zip(exchanged(bucket_bytes), want)):
                np.testing.assert_array_equal(got, sum_, err_msg=f"gradient {i}")
            report = {"rank": RANK, "check": case, "ok": True, "detail": ""}
        except Exception as e:  # noqa: BLE001 -- the report names it
            report = {"rank": RANK, "check": case, "ok": False, "detail": f"{type(e).__name__}: {e}"}
        print(json.dumps(report), flush=True)
