"""What TF1's two graph-mode replications share, as the classic
distributed-TensorFlow tutorials run them: between-graph (worker_v1.py,
every worker builds its own replica) and in-graph (worker_ingraph.py, one
client builds a tower on every worker). Both feed placeholders from numpy,
run inside a MonitoredSession that the chief's restored checkpoint opens,
and keep where training stands in the graph's own step counters."""
import functools
from dataclasses import dataclass

from ringtrain.common.errors import UsageError
from ringtrain.multihost.net import wait_for
from ringtrain.workloads.checkpoints import Progress
from ringtrain.workloads.data import as_float
from ringtrain.workloads.mode import Mode
from ringtrain.workloads.sharding import epoch_shard


def graph_mode(tf):
    """TF1's graph mode, for the whole process, with TF1's control flow: a
    skipped update's branch spans variables on every PS task, which the
    functional ops of TF2's control flow do not place across tasks."""
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.disable_control_flow_v2()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)


@dataclass
class Feeds:
    """The placeholders one step or one test batch is fed through."""
    images: object
    labels: object
    weights: object
    global_count: object

    @classmethod
    def make(cls, tf, image_shape, global_count=None):
        return cls(tf.compat.v1.placeholder(tf.float32, [None, *image_shape], "images"),
                   tf.compat.v1.placeholder(tf.int32, [None], "labels"),
                   tf.compat.v1.placeholder(tf.float32, [None], "weights"),
                   global_count if global_count is not None else
                   tf.compat.v1.placeholder(tf.float32, [], "global_count"))

    def train_batch(self, dataset, shard, batch, batch_size):
        rows = slice(batch * batch_size, (batch + 1) * batch_size)
        idx = shard.indices[rows]
        return {self.images: as_float(dataset.train_images[idx]), self.labels: dataset.train_labels[idx],
                self.weights: shard.weights[rows], self.global_count: shard.global_counts[batch]}


class Sessions:
    """The ways a graph-mode process runs a piece of its graph: through the
    monitored training session (once it exists), or a plain session of its own."""

    def __init__(self, tf, server, config):
        self.tf, self.server, self.config, self.monitored = tf, server, config, None

    def run(self, fetches, feed=None):
        if self.monitored is None:
            return self.plain(fetches, feed)
        return self.monitored.run_step_fn(lambda step_context: step_context.session.run(fetches, feed))

    def in_session(self, call):
        """call(a tf.Session): the checkpoint saver's way in."""
        return self.monitored.run_step_fn(lambda step_context: call(step_context.session))

    def plain(self, fetches, feed=None):
        with self.tf.compat.v1.Session(self.server.target, config=self.config) as sess:
            return sess.run(fetches, feed)

    def wait_for_chief(self, uninitialized, timeout, chief_address):
        """Poll every half second until the chief has initialised the variables
        (MonitoredSession's own wait re-checks only every 30 s)."""
        if not wait_for(lambda: self.plain(uninitialized) == 0, timeout, poll=0.5):
            raise UsageError(f"the chief (worker 0 at {chief_address}) did not initialise the "
                             f"variables within {timeout:g}s (--startup-timeout): start it")


class GraphMode(Mode):
    """A graph-mode process as the shared loop runs it. A subclass builds its
    graph and sets, besides the Mode's own attributes: `tf`, `sessions`,
    `feeds` ([(worker, Feeds)] of the workers this process feeds), `test_feeds`
    (a Feeds), `test_metrics`, `model_variables`, `is_chief`, and the
    MonitoredSession's `hooks` and `stop_grace`; and implements position()."""
    hooks = ()
    stop_grace = 3.0

    def session(self):
        """The MonitoredSession training runs in: the chief's restores what the
        chief chose (the store remembers it), or initialises the variables."""
        tf, store, sessions = self.tf, self.store, self.sessions
        monitored = tf.compat.v1.train.MonitoredSession(
            session_creator=store.session_creator(self.is_chief, sessions.server.target, sessions.config,
                                                  self.ps.startup_timeout),
            hooks=list(self.hooks), stop_grace_period_secs=self.stop_grace)
        sessions.monitored = monitored
        return monitored

    def start(self, restored):
        """Where this process's data stands: its step counter in the graph."""
        step = int(self.position())
        epoch, batch = divmod(step, self.steps_per_epoch)
        return Progress.at(step, epoch, batch, self.steps_per_epoch, self.identity.workers,
                           self.config.data.batch_size)

    def batches(self, start):
        # PS: each worker's batches come from its own shard of every epoch, fed from numpy.
        c, num_workers, dataset = self.config.data, self.identity.workers, self.dataset
        shard = functools.lru_cache(maxsize=2 * len(self.feeds))(
            lambda epoch, worker: epoch_shard(len(dataset.train_labels), worker, num_workers, c.batch_size, c.seed,
                                              epoch))
        step = start.step
        while not self.sessions.monitored.should_stop():
            epoch, batch = divmod(step, self.steps_per_epoch)
            feed = {}
            for worker, feeds in self.feeds:
                feed.update(feeds.train_batch(dataset, shard(epoch, worker), batch, c.batch_size))
            yield epoch, batch + 1, feed
            step += 1

    def weights(self):
        from ringtrain.workloads.models import variable_name
        return list(zip([variable_name(v) for v in self.model_variables], self.sessions.run(self.model_variables)))

    def evaluate_batch(self, images, labels):
        feeds = self.test_feeds
        return self.sessions.run(self.test_metrics, {feeds.images: images, feeds.labels: labels})
