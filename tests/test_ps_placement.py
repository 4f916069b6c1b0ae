"""Each --placement puts the variables where it says: checked on the graph a
worker builds, and once with real servers and --show-placement."""
import re

import pytest

from helpers import PS_BASELINE, TINY, last_json, run_ok


def placed(placement, num_ps=2, model="mnist_mlp"):
    """{variable name: (ps task, bytes)} as a worker's graph places them."""
    import tensorflow as tf
    from ps_baseline import placement as P
    from ringtrain.workloads import models

    spec = tf.train.ClusterSpec({"ps": [f"localhost:{1000 + i}" for i in range(num_ps)],
                                 "worker": ["localhost:2000"]})
    with tf.Graph().as_default():
        with tf.compat.v1.device(P.device_setter(placement, spec, 0)):
            models.build(model, 0, P.variable_factory(placement, num_ps, 64 * 1024))
            rows, per_ps = P.describe(tf.compat.v1.global_variables())
    return {name: (int(where.rsplit(":", 1)[1]), size) for name, where, size in rows}, per_ps


def test_round_robin_alternates_in_creation_order():
    where, _ = placed("round_robin")
    assert [task for task, _ in where.values()] == [0, 1, 0, 1, 0, 1]
    assert where["dense_1/kernel"][0] == where["dense_2/kernel"][0] == 0  # all kernels on one PS


def test_greedy_puts_each_variable_on_the_least_loaded_ps():
    where, per_ps = placed("greedy")
    loads = [0, 0]
    for task, size in where.values():
        assert loads[task] == min(loads)
        loads[task] += size
    _, round_robin = placed("round_robin")
    assert max(per_ps.values()) < max(round_robin.values())  # better balanced


def test_partitioned_splits_big_variables_over_every_ps():
    where, _ = placed("partitioned", num_ps=2)
    assert where["dense_1/kernel/part_0"] == (0, 784 * 500 * 4 // 2)
    assert where["dense_1/kernel/part_1"] == (1, 784 * 500 * 4 // 2)
    assert {where["dense_2/kernel/part_0"][0], where["dense_2/kernel/part_1"][0]} == {0, 1}
    assert "dense_1/bias" in where and "logits/kernel" in where  # small ones stay whole


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_partitioned_training_on_real_servers_shows_its_placement():
    out = run_ok([*PS_BASELINE, "launch", "--num-ps", "2", "--num-workers", "1", "--placement",
                  "partitioned", "--show-placement", "--steps", "10", *TINY], timeout=240)
    table = dict(re.findall(r"\[worker0\]\s+(\S+/part_\d+)\s+/job:ps/task:(\d)", out))
    assert table["dense_1/kernel/part_0"] != table["dense_1/kernel/part_1"]
    assert re.search(r"total on /job:ps/task:0: [\d,]+ B", out)
    assert re.search(r"total on /job:ps/task:1: [\d,]+ B", out)
    summary = last_json(out)
    assert summary["placement"] == "partitioned" and summary["steps"] == 10
