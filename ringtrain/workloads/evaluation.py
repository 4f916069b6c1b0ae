"""Test-split evaluation, the same in every mode: correct answers and the
summed loss over a worker's share of the test split, batch by batch, read
through the source's own pipeline (workloads/pipeline.py)."""
from dataclasses import dataclass


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


def evaluate(batch_metrics, source, rank=0, size=1, threads=0):
    """Sum batch_metrics(float images, labels) -> (correct, loss_sum) over
    this worker's disjoint share of the test split (all of it when size is 1);
    nothing where the source has no test split."""
    from ringtrain.workloads import pipeline
    total = Evaluation()
    if source.test is None:
        return total
    build = lambda tf: pipeline.limit_threads(tf, pipeline.eval_dataset(tf, source, rank, size), threads)
    for images, labels in pipeline.numpy_iterator(build, threads):
        correct, loss_sum = batch_metrics(images, labels)
        total += Evaluation(float(correct), float(loss_sum), len(labels))
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
