"""The shared flags, read once at the edge into small named configs: each
part of a run gets only the piece it uses (the model builder the model's,
the loop the loop's). A mode reads its own flags into a config of its own."""
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    name: str
    seed: int = 0
    dropout: bool = True
    simulate_gpu_ms: float = None  # the simulated accelerator's step time, if any
    image_shape: tuple = None      # the dataset's: models from outside the catalog are built for it
    sync_batch_norm: bool = False  # batch statistics over the global batch (ring and TF collective modes)

    def build(self, make_variable=None, synchronized_batch_norm=None):
        """The model with seeded initial weights (imports TensorFlow).
        synchronized_batch_norm: the mode's layer that computes batch
        statistics over every worker, for --sync-batch-norm."""
        from ringtrain.workloads import models, user_models
        options = {"make_variable": make_variable} if make_variable else {}
        model = models.build(self.name, seed=self.seed, dropout=self.dropout, simulate_gpu_ms=self.simulate_gpu_ms,
                             image_shape=self.image_shape, **options)
        if self.sync_batch_norm and not models.is_simulated(model):
            assert synchronized_batch_norm, "this mode refuses --sync-batch-norm before it builds"
            model = user_models.with_synchronized_batch_norm(model, synchronized_batch_norm)
        return model

    def statistics_to_average(self, model):
        """Batch norm's moving statistics, which workers that all-reduce their
        gradients average every step, so that every worker holds one model
        (what checkpoints, snapshots and the evaluation read); none with
        --sync-batch-norm, where every worker computes them on the global batch."""
        from ringtrain.workloads import models
        return [] if self.sync_batch_norm else models.moving_statistics(model)


@dataclass(frozen=True)
class DataConfig:
    batch_size: int = 32  # per worker
    seed: int = 0         # shuffling
    threads: int = 0      # tf.data's pool (0: TF's default)


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "adam"
    lr: float = 1e-3

    def keras(self, lr=None):
        from ringtrain.workloads.optimizers import keras_optimizer
        return keras_optimizer(self.name, self.lr if lr is None else lr)

    def v1(self):
        from ringtrain.workloads.optimizers import v1_optimizer
        return v1_optimizer(self.name, self.lr)


@dataclass(frozen=True)
class LoopConfig:
    """What workloads/loop.py does around every mode's step."""
    epochs: int = 1
    steps: int = None             # overrides epochs
    warmup_steps: int = 3         # not timed
    log_every: int = 20
    log_dir: str = None           # TensorBoard scalars
    checkpoint_dir: str = None
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    resume: str = None            # None, "latest", or a checkpoint prefix or folder
    on_nan: str = "stop"          # or "skip"
    stall_timeout: float = 120.0  # 0: off
    straggler: object = None      # workloads.straggler.Straggler
    snapshot_every: int = None
    snapshot_dir: str = None
    summary_json: str = None
    dump_weights: str = None      # "{rank}" is replaced


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig
    data: DataConfig
    optimizer: OptimizerConfig
    loop: LoopConfig
    flags: dict  # every flag as given: the summary's "config", so that it says how the run was made


def from_args(args):
    """The shared configs from parsed flags (after flags.load_training_data)."""
    get = lambda name, default=None: getattr(args, name, default)
    return RunConfig(
        model=ModelConfig(args.model, args.seed, not args.no_dropout, args.simulate_gpu, args.image_shape,
                          args.sync_batch_norm),
        data=DataConfig(args.batch_size, args.seed, args.threads),
        optimizer=OptimizerConfig(args.optimizer, args.lr),
        loop=LoopConfig(
            epochs=args.epochs, steps=args.steps, warmup_steps=args.warmup_steps, log_every=args.log_every,
            log_dir=get("log_dir"), checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
            keep_checkpoints=args.keep_checkpoints, resume=args.resume, on_nan=args.on_nan,
            stall_timeout=args.stall_timeout, straggler=args.straggler, snapshot_every=args.snapshot_every,
            snapshot_dir=args.snapshot_dir, summary_json=get("summary_json"), dump_weights=get("dump_weights")),
        flags=dict(sorted(vars(args).items())))
