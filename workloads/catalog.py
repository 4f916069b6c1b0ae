"""What each model takes, known without importing TensorFlow, so that bad
flags fail in well under a second with one line."""
from dataclasses import dataclass

from ringtrain.workloads.errors import UsageError


@dataclass(frozen=True)
class ModelSpec:
    image_shape: tuple
    default_dataset: str
    # Gradient profiles only (workloads/profiles.py): they always run on the simulated
    # accelerator, by default with this published per-GPU step time (bench/COLUMNS.md).
    simulated_step_ms: float = None


MODEL_SPECS = {
    "mnist_mlp": ModelSpec((28, 28, 1), "mnist"),
    "mnist_cnn": ModelSpec((28, 28, 1), "mnist"),
    "cifar_resnet": ModelSpec((32, 32, 3), "cifar10"),
    # TF's benchmarks page, DGX-1 P100, batch 64 per GPU, synthetic data: 219 img/s, 154 img/s
    "resnet50": ModelSpec((28, 28, 1), "synthetic", simulated_step_ms=64 / 219 * 1e3),
    "vgg16": ModelSpec((28, 28, 1), "synthetic", simulated_step_ms=64 / 154 * 1e3),
}


def simulated_step_ms(model_name, simulate_gpu_ms=None):
    """The simulated accelerator's step time for a run, or None for real compute."""
    return simulate_gpu_ms or model_spec(model_name).simulated_step_ms


def model_spec(name):
    if name not in MODEL_SPECS:
        raise UsageError(f"unknown model {name!r}: choose one of {', '.join(MODEL_SPECS)}")
    return MODEL_SPECS[name]


def check_compatible(model_name, dataset):
    shape = model_spec(model_name).image_shape
    if tuple(dataset.train_images.shape[1:]) != shape:
        raise UsageError(f"model {model_name} takes {shape} images but dataset {dataset.name} "
                         f"has {tuple(dataset.train_images.shape[1:])}: pick a matching pair")
