"""What each model takes, known without importing TensorFlow, so that bad
flags fail in well under a second with one line."""
from dataclasses import dataclass

from workloads.errors import UsageError


@dataclass(frozen=True)
class ModelSpec:
    image_shape: tuple
    default_dataset: str


MODEL_SPECS = {
    "mnist_mlp": ModelSpec((28, 28, 1), "mnist"),
    "mnist_cnn": ModelSpec((28, 28, 1), "mnist"),
    "cifar_resnet": ModelSpec((32, 32, 3), "cifar10"),
}


def model_spec(name):
    if name not in MODEL_SPECS:
        raise UsageError(f"unknown model {name!r}: choose one of {', '.join(MODEL_SPECS)}")
    return MODEL_SPECS[name]


def check_compatible(model_name, dataset):
    shape = model_spec(model_name).image_shape
    if tuple(dataset.train_images.shape[1:]) != shape:
        raise UsageError(f"model {model_name} takes {shape} images but dataset {dataset.name} "
                         f"has {tuple(dataset.train_images.shape[1:])}: pick a matching pair")
