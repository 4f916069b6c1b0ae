"""Run on 2 ranks (mpirun -np 2): ring mode's gradient exchange
(train.ExchangeWithVote) in a tf.function, as its train step uses it. For
each reduce op, compression and grouping ringtrain uses, every rank gives
gradients of its own (a dense one, a rank-1 one that carries the vote, an
IndexedSlices one and a None), and rank 1 votes to stop: each gradient alone,
grouped (the K micro-batches' sum) and in buckets (--bucket-mb: the dense ones
in one). (Grouped has no IndexedSlices left, and Adasum takes none; Adasum's
result is checked against adasum_reference, per tensor, however sent.) Prints
one JSON line per case: {"rank", "check", "ok", "detail"}."""
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from adasum_reference import adasum  # noqa: E402
from ringtrain.train import ExchangeWithVote  # noqa: E402
from ringtrain.workloads.tfenv import set_threads  # noqa: E402

hvd.init()
set_threads(1)  # (as ring mode sets them)
RANK, SIZE = hvd.rank(), hvd.size()
assert SIZE == 2, "run on 2 ranks"


def gradients(rank, sparse):
    kernel = np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * rank
    bias = np.array([1.0, -2.0, 0.5], np.float32) * (rank + 1)
    rows = tf.constant([[1.0, 2.0]]) * (rank + 1)
    rows = tf.IndexedSlices(rows, tf.constant([rank]), tf.constant([4, 2])) if sparse else rows
    return [tf.constant(kernel), None, rows, tf.constant(bias)]


CASES = {"sum": (hvd.Sum, hvd.Compression.none), "average": (hvd.Average, hvd.Compression.none),
         "average-fp16": (hvd.Average, hvd.Compression.fp16), "adasum": (hvd.Adasum, hvd.Compression.none)}

for name, (op, compression) in CASES.items():
    for how in ("", "-grouped", "-bucketed"):
        case, grouped = f"{name}{how}", how == "-grouped"
        try:
            sparse = not grouped and op != hvd.Adasum
            exchange = ExchangeWithVote(hvd, tf.constant(float(RANK)), op, compression,
                                        bucket_bytes=2**20 if how == "-bucketed" else 0)
            # (traced as ring mode's step is, without AutoGraph: no generated code left in /tmp)
            step = tf.function(lambda: (exchange(gradients(RANK, sparse), grouped), exchange.votes), autograph=False)
            reduced, votes = step()
            assert float(votes) == 1.0, f"votes {float(votes)}, not rank 1's one vote"
            assert reduced[1] is None, "the None gradient did not stay None"
            if sparse:  # (allgathered, as Horovod does with IndexedSlices)
                assert isinstance(reduced[2], tf.IndexedSlices), "the IndexedSlices gradient became dense"
                assert sorted(reduced[2].indices.numpy().tolist()) == [0, 1], reduced[2].indices
            both = [gradients(r, sparse) for r in range(SIZE)]
            for i in (0, 3):
                want = adasum(*(g[i].numpy() for g in both)) if op == hvd.Adasum \
                    else sum(g[i].numpy() for g in both) / (SIZE if op == hvd.Average else 1)
                got = reduced[i].numpy()
                assert got.shape == want.shape, f"gradient {i}: shape {got.shape}, not {want.shape}"
                np.testing.assert_allclose(got, want, rtol=1e-3 if compression == hvd.Compression.fp16
                                           else 1e-5 if op == hvd.Adasum else 1e-6)
            report = {"rank": RANK, "check": case, "ok": True, "detail": ""}
        except Exception as e:  # noqa: BLE001 -- the report names it
            report = {"rank": RANK, "check": case, "ok": False, "detail": f"{type(e).__name__}: {e}"}
        print(json.dumps(report), flush=True)
