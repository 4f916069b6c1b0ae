"""Test-split evaluation, the same in every mode: correct answers and the
summed loss over a rank's share of the test split, batch by batch."""
from dataclasses import dataclass

from ringtrain.workloads.data import as_float
from ringtrain.workloads.sharding import eval_shard

EVAL_BATCH = 256


@dataclass
class Evaluation:
    correct: float = 0.0
    loss_sum: float = 0.0
    samples: int = 0

    def __add__(self, other):
        return Evaluation(self.correct + other.correct, self.loss_sum + other.loss_sum,
                          self.samples + other.samples)

    @property
    def accuracy(self):
        return self.correct / self.samples if self.samples else None

    @property
    def loss(self):
        return self.loss_sum / self.samples if self.samples else None


def evaluate(batch_metrics, dataset, rank=0, size=1, batch_size=EVAL_BATCH):
    """Sum batch_metrics(float images, labels) -> (correct, loss_sum) over
    this rank's disjoint share of the test split (all of it when size is 1)."""
    idx = eval_shard(len(dataset.test_labels), rank, size)
    total = Evaluation()
    for start in range(0, len(idx), batch_size):
        rows = idx[start:start + batch_size]
        correct, loss_sum = batch_metrics(as_float(dataset.test_images[rows]), dataset.test_labels[rows])
        total += Evaluation(float(correct), float(loss_sum), len(rows))
    return total


def metrics_of(model):
    """An eager model's metrics on a test batch, (correct, loss sum), traced
    once and reused for the last, shorter batch; None for a model on the
    simulated accelerator, which learns nothing worth evaluating."""
    from ringtrain.workloads import models
    from ringtrain.workloads.tfenv import step_function
    if models.is_simulated(model):
        return None
    return step_function(lambda images, labels: models.correct_and_loss_sum(model(images, training=False), labels),
                         reduce_retracing=True)
