"""The same training through TF's current PS API (`--api tf2`, async only):
tf.distribute.ParameterServerStrategy + ClusterCoordinator.

Here PS and worker tasks only run servers; a separate coordinator task (job
"chief") owns the program: it creates the variables on the PS tasks and
schedules step functions onto whichever worker is free. Lines that
distribution adds are marked `# PS:`.
"""
import threading
import time

from ps_baseline import reports, servers
from ps_baseline.cluster import wait_until_listening
from workloads import models, pipeline
from workloads.optimizers import keras_optimizer
from workloads.sharding import steps_per_epoch
from workloads.summary import StepTimer, emit
from workloads.tfenv import import_tensorflow_quietly

EVAL_BATCH = 1000


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
    log = lambda msg: print(f"coordinator: {msg}", flush=True)
    for job in ("ps", "worker"):
        for i, address in enumerate(getattr(cluster, job)):
            wait_until_listening(address, f"{job} task {i}", args.startup_timeout)

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
    with strategy.scope():
        model = models.build(args.model, args.seed, dropout=not args.no_dropout)
        optimizer = keras_optimizer(args.optimizer, args.lr)
        optimizer.build(model.trainable_variables)
        # Keras 3's optimizer.iterations loses increments under async PS: count ourselves.
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        stale_sum = tf.Variable(0, dtype=tf.int64, trainable=False, name="staleness_sum")
        stale_max = tf.Variable(0, dtype=tf.int64, trainable=False, name="staleness_max")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, global_step=global_step)
    manager = (tf.train.CheckpointManager(checkpoint, args.checkpoint_dir, max_to_keep=3)
               if args.checkpoint_dir else None)
    if manager and manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint)
        log(f"restored {manager.latest_checkpoint} at global step {int(global_step.numpy())}")

    def per_worker_dataset(context):
        # PS: each worker reads its own shard, epoch after epoch.
        rank = context.input_pipeline_id if context else 0
        epochs = range(-(-total_steps // per_epoch))
        batches = [pipeline.train_batches(dataset, rank, num_workers, args.batch_size, args.seed, e)
                   for e in epochs]
        combined = batches[0]
        for more in batches[1:]:
            combined = combined.concatenate(more)
        return combined.repeat()

    iterator = iter(coordinator.create_per_worker_dataset(
        strategy.distribute_datasets_from_function(per_worker_dataset)))

    @tf.function
    def worker_step(iterator):
        def step(images, labels, weights, global_count):
            read_step = global_step.read_value()
            with tf.control_dependencies([read_step]):  # weights are read after the step count
                with tf.GradientTape() as tape:
                    loss_sum = tf.reduce_sum(weights * models.per_example_loss(model(images, True), labels))
                    loss = loss_sum / (global_count / num_workers)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            stale = global_step.assign_add(1) - read_step - 1
            stale_sum.assign_add(stale)
            stale_max.assign(tf.maximum(stale_max, stale))
            return loss_sum, tf.reduce_sum(weights)
        return strategy.run(step, args=next(iterator))

    done = int(global_step.numpy())
    log(f"{num_workers} worker(s), {num_ps} ps, {per_epoch} steps/epoch, "
        f"{total_updates} updates in all, starting at {done}")
    # The coordinator sees only whole windows, so it times the cluster as one:
    # the first window (tracing) is warm-up, every later one is measured.
    timer, wall_start = StepTimer(warmup_steps=1, window_steps=1), time.perf_counter()
    loss_sum = loss_count = 0.0
    while done < total_updates:
        window = min(args.log_every * num_workers, total_updates - done)
        results = [coordinator.schedule(worker_step, args=(iterator,)) for _ in range(window)]
        coordinator.join()
        values = [r.fetch() for r in results]
        loss_sum, loss_count = sum(float(v[0]) for v in values), sum(float(v[1]) for v in values)
        timer.step_done(loss_count)
        done += window
        log(f"global step {int(global_step.numpy())}/{total_updates} loss {loss_sum / max(loss_count, 1):.4f}")
        if manager and args.checkpoint_every and (done // num_workers) % args.checkpoint_every < args.log_every:
            manager.save(checkpoint_number=done)
    wall_seconds = time.perf_counter() - wall_start
    saved = manager.save(checkpoint_number=int(global_step.numpy())) if manager else None

    correct = test_loss_sum = 0.0
    for start in range(0, len(dataset.test_labels), EVAL_BATCH):
        images = pipeline.as_float(dataset.test_images[start:start + EVAL_BATCH])
        labels = dataset.test_labels[start:start + EVAL_BATCH]
        logits = model(images, False)
        correct += float(tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, tf.int32), labels), tf.float32)))
        test_loss_sum += float(tf.reduce_sum(models.per_example_loss(logits, labels)))
    steps = int(global_step.numpy())
    coordinator_report = reports.WorkerReport(
        -1, steps, timer.report(), loss_sum, loss_count,
        [int(stale_sum.numpy()), steps, int(stale_max.numpy())])
    result = reports.summary(
        "ps-tf2", args, dataset, num_workers, num_ps, [coordinator_report], steps,
        steps / (num_workers * per_epoch), (correct, test_loss_sum, len(dataset.test_labels)),
        wall_seconds, {"checkpoint": saved, "api": "tf2", "placement": args.placement,
                       "throughput_measured_at": "coordinator (all workers as one)"})
    emit(result, args.summary_json)
    return 0
