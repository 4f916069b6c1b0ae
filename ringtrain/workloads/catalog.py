"""What each model takes, known without importing TensorFlow, so that bad
flags fail in well under a second with one line.

`--model` names a catalog model, a gradient profile file (FILE.json, written
by `ringtrain-bench profile`), or a model from outside the catalog
(workloads/user_models.py: keras:NAME or package.module:function)."""
import functools
import json
import os
from dataclasses import dataclass

from ringtrain.workloads import user_models
from ringtrain.common.errors import UsageError


@dataclass(frozen=True)
class ModelSpec:
    image_shape: tuple  # None: the dataset's (models from outside the catalog)
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
    # Not on that page: between ResNet-50 and ResNet-152 (91 img/s) by their multiply-adds
    # (3.8, 7.6 and 11.3 G per image, He et al. 2015): 500 ms
    "resnet101": ModelSpec((28, 28, 1), "synthetic",
                           simulated_step_ms=64e3 / 219 + (7.6 - 3.8) / (11.3 - 3.8) * (64e3 / 91 - 64e3 / 219)),
}
# keras:NAME and factories: synthetic images of --image-shape, 32x32x3 unless given
# (the smallest input keras.applications' ResNets and VGGs take).
USER_MODEL = ModelSpec(None, "synthetic")
USER_IMAGE_SHAPE = (32, 32, 3)


def simulated_step_ms(model_name, simulate_gpu_ms=None):
    """The simulated accelerator's step time for a run, or None for real compute."""
    return simulate_gpu_ms or model_spec(model_name).simulated_step_ms


def model_spec(name):
    if name in MODEL_SPECS:
        return MODEL_SPECS[name]
    if name.endswith(".json"):
        return ModelSpec((28, 28, 1), "synthetic", simulated_step_ms=read_profile(name)["step_ms"])
    if user_models.is_user_model(name):
        return USER_MODEL
    raise UsageError(f"unknown model {name!r}: choose one of {', '.join(MODEL_SPECS)}, keras:NAME "
                     f"(keras.applications), package.module:function (your own factory) or a profile FILE.json")


def check_model(name):
    """model_spec, and for a model from outside the catalog, its factory
    found (this imports it: Keras, or the user's module)."""
    spec = model_spec(name)
    if spec is USER_MODEL:
        user_models.factory(name)
    return spec


def image_shape(name, given=None):
    """The input shape a run uses: --image-shape, else the model's own."""
    return tuple(given) if given else (model_spec(name).image_shape or USER_IMAGE_SHAPE)


def check_compatible(model_name, dataset):
    shape = model_spec(model_name).image_shape
    if shape is not None and tuple(dataset.train_images.shape[1:]) != shape:
        raise UsageError(f"model {model_name} takes {shape} images but dataset {dataset.name} "
                         f"has {tuple(dataset.train_images.shape[1:])}: pick a matching pair")


def read_profile(path, flag="--model"):
    """A gradient profile file: {"model", "step_ms", "layers": [[layer, [[var, shape]...]]...]},
    read once (flag parsing, the step time and the gradient layers all ask for
    it); `flag` is the one that named it, for a bad file's one line."""
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot read the profile ({e.strerror}): write one with "
                         f"ringtrain-bench profile") from None
    return _read_profile(path, stamp, flag)


@functools.lru_cache(maxsize=8)
def _read_profile(path, stamp, flag):
    try:
        with open(path) as f:
            profile = json.load(f)
        layers = [(str(layer), [(str(var), tuple(int(d) for d in shape)) for var, shape in variables])
                  for layer, variables in profile["layers"]]
        step_ms = float(profile["step_ms"])
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot read the profile ({e.strerror}): write one with "
                         f"ringtrain-bench profile") from None
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{flag} {path} is not a gradient profile ({type(e).__name__}: {e}): write one "
                         f"with ringtrain-bench profile --out FILE.json") from None
    if not layers or not step_ms > 0:
        raise UsageError(f"{flag} {path}: the profile has no layers or no positive step_ms: write it again "
                         f"with ringtrain-bench profile --step-ms MS")
    return {"model": profile.get("model", os.path.basename(path)), "step_ms": step_ms, "layers": layers}
