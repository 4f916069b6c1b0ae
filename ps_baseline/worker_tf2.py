"""The same training through TF's current PS API (`--api tf2`, async only):
tf.distribute.ParameterServerStrategy + ClusterCoordinator.

Here PS and worker tasks only run servers; a separate coordinator task (job
"chief") owns the program: it creates the variables on the PS tasks and
schedules step functions onto whichever worker is free. Lines that
distribution adds are marked `# PS:`.
"""
import threading
import time

from ringtrain.ps_baseline import reports, servers
from ringtrain.workloads import models, pipeline
from ringtrain.workloads.console import Console
from ringtrain.workloads.evaluation import Evaluation, evaluate
from ringtrain.workloads.optimizers import keras_optimizer
from ringtrain.workloads.sharding import steps_per_epoch
from ringtrain.workloads.straggler import summary_fields, wait_after
from ringtrain.workloads.summary import StepTimer, build_summary
from ringtrain.workloads.tfenv import import_tensorflow_quietly


def inter_op_threads(threads):
    """TF2's remote functions deadlock with a single inter-op thread (a
    blocked receive holds the only one), so --threads 1 still gets 2 here."""
    return max(threads, 2) if threads else 0


def serve(tf, cluster, job_name, task_index, threads, log):
    """PS and worker tasks: a server that joins (the launcher stops it)."""
    server = servers.start_server(tf, cluster, job_name, task_index, threads, inter_op_threads(threads))
    log(f"{job_name} task {task_index} serving at {server.target} for the TF2 coordinator")
    joiner = threading.Thread(target=server.join, daemon=True)  # Ctrl-C still reaches Python
    joiner.start()
    while joiner.is_alive():
        joiner.join(0.5)
    return 0


def train(args, cluster, dataset):
    tf = import_tensorflow_quietly()
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads(args.threads))
    num_workers, num_ps = len(cluster.worker), len(cluster.ps)
    console = Console(prefix="coordinator: ")
    servers.wait_for_tasks(cluster, "ps", args.startup_timeout)
    servers.wait_for_tasks(cluster, "worker", args.startup_timeout)

    # PS: the strategy places variables on the PS tasks; the coordinator schedules steps.
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster.as_dict()), task_type="chief", task_id=0, rpc_layer="grpc")
    partitioner = (tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=args.partition_min_bytes, max_shards=num_ps)
        if args.placement == "partitioned" else None)
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    per_epoch = steps_per_epoch(len(dataset.train_labels), num_workers, args.batch_size)
    total_steps = args.steps or per_epoch * args.epochs
    total_updates = total_steps * num_workers  # as v1 async: every worker's batch is one update
    state = TrainingState(tf, strategy, args)
    if state.manager and state.manager.latest_checkpoint:
        state.checkpoint.restore(state.manager.latest_checkpoint)
        console.line(f"restored {state.manager.latest_checkpoint} at global step {state.steps()}")
    iterator = per_worker_iterators(tf, coordinator, per_worker_dataset(args, dataset, num_workers, per_epoch,
                                                                        total_steps))
    worker_step = make_worker_step(tf, strategy, state, num_workers)

    done = state.steps()
    console.begin(f"{num_workers} worker(s), {num_ps} ps, {per_epoch} steps/epoch, "
                  f"{total_updates} updates in all, starting at {done}")
    # The coordinator sees only whole windows, so it times the cluster as one:
    # the first window (tracing) is warm-up, every later one is measured.
    timer, wall_start = StepTimer(warmup_steps=1, window_steps=1), time.perf_counter()
    loss_sum = loss_count = waited = 0.0
    while done < total_updates:
        window = min(args.log_every * num_workers, total_updates - done)
        results = [coordinator.schedule(worker_step, args=(iterator,)) for _ in range(window)]
        coordinator.join()
        values = [r.fetch() for r in results]
        loss_sum, loss_count = sum(float(v[0]) for v in values), sum(float(v[1]) for v in values)
        waited += sum(float(v[2]) for v in values)
        timer.step_done(loss_count)
        done += window
        console.progress(done, total_updates, f"global step {state.steps()}/{total_updates} "
                         f"loss {loss_sum / max(loss_count, 1):.4f}", loss_count)
        if state.manager and args.checkpoint_every and (done // num_workers) % args.checkpoint_every < args.log_every:
            state.manager.save(checkpoint_number=done)
    wall_seconds = time.perf_counter() - wall_start
    steps = state.steps()
    saved = state.manager.save(checkpoint_number=steps) if state.manager else None

    metrics = lambda images, labels: models.correct_and_loss_sum(state.model(images, False), labels)
    stale_sum, stale_max = int(state.stale_sum.numpy()), int(state.stale_max.numpy())
    summary = build_summary(
        "ps-tf2", args, dataset, world_size=num_workers, steps=steps,
        epochs=steps / (num_workers * per_epoch), train_loss=loss_sum / loss_count if loss_count else None,
        evaluation=Evaluation() if models.is_simulated(state.model) else evaluate(metrics, dataset),
        wall_seconds=wall_seconds, reports=[timer.report()],
        num_ps=num_ps, reporting_workers=[-1],
        hosts=[address.rpartition(":")[0] for address in cluster.worker], checkpoint=saved, api="tf2",
        placement=args.placement, throughput_measured_at="coordinator (all workers as one)",
        **summary_fields(args.straggler, [waited]),
        **reports.staleness_fields([reports.WorkerReport(-1, steps, {}, staleness=[stale_sum, steps, stale_max])]))
    console.finish(summary, args.summary_json)
    return 0


class TrainingState:
    """The model, optimizer and counters, created on the PS tasks, and their checkpoint."""

    def __init__(self, tf, strategy, args):
        with strategy.scope():
            self.model = models.build(args.model, args.seed, dropout=not args.no_dropout,
                                       simulate_gpu_ms=args.simulate_gpu)
            self.optimizer = keras_optimizer(args.optimizer, args.lr)
            self.optimizer.build(self.model.trainable_variables)
            # Keras 3's optimizer.iterations loses increments under async PS: count ourselves.
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
            self.stale_sum = tf.Variable(0, dtype=tf.int64, trainable=False, name="staleness_sum")
            self.stale_max = tf.Variable(0, dtype=tf.int64, trainable=False, name="staleness_max")
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                              global_step=self.global_step)
        self.manager = (tf.train.CheckpointManager(self.checkpoint, args.checkpoint_dir, max_to_keep=3)
                        if args.checkpoint_dir else None)

    def steps(self):
        return int(self.global_step.numpy())


def per_worker_iterators(tf, coordinator, make_dataset):
    """An iterator on each worker over its own dataset, make_dataset(worker).

    TF's own way, create_per_worker_dataset, traces one dataset function for
    every worker, and ParameterServerStrategy gives each the same
    InputContext (input_pipeline_id 0): the workers would all read the same
    shard. So each worker gets its own traced function here, through the
    coordinator's per-worker resources (private API, as of TF 2.21)."""
    from tensorflow.python.distribute import input_lib
    from tensorflow.python.distribute.coordinator import values

    iterators = []
    for worker in coordinator._cluster.workers:  # in task order
        make = tf.function(lambda i=worker.worker_index: make_dataset(i)).get_concrete_function()
        remote = worker.create_resource(tf.function(lambda make=make: iter(make())))
        remote._type_spec = input_lib.get_iterator_spec_from_dataset(coordinator.strategy, make.structured_outputs)
        iterators.append(remote)
    return values.PerWorkerDistributedIterator(tuple(iterators))


def per_worker_dataset(args, dataset, num_workers, per_epoch, total_steps):
    def make(rank):
        import tensorflow as tf
        # PS: each worker reads its own shard, epoch after epoch.
        epochs = [pipeline.train_batches(dataset, rank, num_workers, args.batch_size, args.seed, e)
                  for e in range(-(-total_steps // per_epoch))]
        combined = epochs[0]
        for more in epochs[1:]:
            combined = combined.concatenate(more)
        # --straggler: this worker's wait after each of its steps, in multiples of its compute
        spec = args.straggler
        if spec is not None and rank == spec.rank:
            extra = tf.data.Dataset.counter(1).map(
                lambda step: tf.where(step % spec.every == 0, spec.factor - 1.0, 0.0))
        else:
            extra = tf.data.Dataset.from_tensors(0.0).repeat()
        return tf.data.Dataset.zip((combined.repeat(), extra))
    return make


def make_worker_step(tf, strategy, state, num_workers):
    model, optimizer, global_step = state.model, state.optimizer, state.global_step

    @tf.function
    def worker_step(iterator):
        def step(batch, extra):
            images, labels, weights, global_count = batch
            read_step = global_step.read_value()
            started = tf.timestamp()
            with tf.control_dependencies([read_step, started]):  # weights are read after the step count
                with tf.GradientTape() as tape:
                    loss_sum = tf.reduce_sum(weights * models.per_example_loss(model(images, True), labels))
                    loss = loss_sum / (global_count / num_workers)
            grads = tape.gradient(loss, model.trainable_variables)
            grads, waited = wait_after(tf, grads, started, extra)  # --straggler, on the straggler only
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            stale = global_step.assign_add(1) - read_step - 1
            state.stale_sum.assign_add(stale)
            state.stale_max.assign(tf.maximum(state.stale_max, stale))
            return loss_sum, tf.reduce_sum(weights), waited
        # PS: runs on whichever worker the coordinator picks; variables live on the PS tasks.
        return strategy.run(step, args=next(iterator))

    return worker_step
