"""`ringtrain --elastic`: ring training that goes on when ranks go away or
come, under horovodrun's elastic mode:

    horovodrun --gloo -np 3 --min-np 2 --max-np 4 --host-discovery-script S ringtrain --elastic ...

Horovod's elastic API (hvd.elastic.run) re-enters the training function
after every change of the world: on a lost rank, from the last commit
(`--commit-every K` steps); on a host added or removed by the discovery
script, from the present step. Each entry is ring mode (RingMode, in
ringtrain/train.py), with everything that depends on the rank count built anew: the shared loop (and its stall watchdog), the lr scaling, each rank's
data shard, and the traced train step (the rank count is a constant in it).
A rank that joins gets the weights, optimizer state and position from rank 0.
"""
from ringtrain.train import RingMode, horovod_config, in_horovod, start_horovod
from ringtrain.workloads import loop
from ringtrain.workloads.checkpoints import Progress


def main(config, args, dataset):
    """`ringtrain --elastic`, from the checked flags and data."""
    from ringtrain.workloads.tfenv import import_tensorflow_quietly
    import_tensorflow_quietly()
    return in_horovod(lambda: train(config, horovod_config(args), dataset))


def train(config, horovod, dataset):
    hvd, model, optimizer, device = start_horovod(config, horovod)
    # No collective before the elastic loop: a rank that joins later would meet the
    # others' state sync with it. Rank 0's --resume position and weights reach the
    # others in that sync instead.
    first = RingMode(hvd, config, horovod, dataset, model, optimizer, device)
    start = loop.Training(config, dataset, first).restore() or Progress()
    state = ring_state(hvd, list(model.variables) + list(optimizer.variables), step=start.step,
                       epoch=start.epoch, samples_in_epoch=start.samples_in_epoch, world_sizes=[hvd.size()])
    state.register_reset_callbacks([lambda: state.world_sizes.append(hvd.size())])
    said = []

    def on_this_world(state):
        # Horovod: everything that depends on the rank count is rebuilt for this world.
        mode = ElasticRing(state, hvd, config, horovod, dataset, model, optimizer, device)
        run = loop.Training(config, dataset, mode, restore=False)
        warn_if_one_host(hvd, run.console, said)  # (every rank, every entry: it is a collective)
        run.console.line(f"elastic: {hvd.size()} rank(s) from step {state.step} (epoch {state.epoch + 1}); "
                         f"committing every {horovod.commit_every} steps")
        return run.run()

    elastic_run(hvd, on_this_world)(state)
    return 0


class ElasticRing(RingMode):
    """Ring mode in one world of ranks: it starts from the elastic state, and
    commits it every --commit-every steps."""

    def __init__(self, state, *args):
        super().__init__(*args)
        self.state = state

    def start(self, restored):
        # (the state's sync has given every rank rank 0's weights and position)
        return Progress(self.state.step, self.state.epoch, self.state.samples_in_epoch)

    def after_step(self, number, progress):
        state = self.state
        state.step, state.epoch, state.samples_in_epoch = progress.step, progress.epoch, progress.samples_in_epoch
        if number % self.horovod.commit_every == 0:
            self.state.commit()  # Horovod: a restore point; raises here if hosts were added or removed

    def summary_fields(self, reports):
        return dict(super().summary_fields(reports),
                    elastic={"world_sizes": list(self.state.world_sizes), "commit_every": self.horovod.commit_every},
                    throughput_measured_at=f"the last {self.hvd.size()} rank(s), since the last change of the world")


def warn_if_one_host(hvd, console, said):
    """Horovod blacklists the host of a rank that dies; where every rank runs on
    one host, that is every slot of the job: say so, once."""
    import os
    hosts = set(hvd.allgather_object(os.environ.get("HOROVOD_HOSTNAME", "")))
    if len(hosts) == 1 and not said:
        said.append(True)
        console.line(f"elastic: warning: every rank runs on one host ({hosts.pop() or 'this machine'}); Horovod "
                     "blacklists the host of a rank that dies, so here a lost rank ends the job: run on several "
                     "hosts for ranks to be lost and the job to go on")


def ring_state(hvd, variables, **progress):
    """Horovod's elastic state: the variables (weights and optimizer slots)
    and the progress, saved at each commit, restored after a lost rank, and
    sent from rank 0 at every (re)start. (hvd.elastic.TensorFlowState
    broadcasts as it is built, a collective a joining rank must not make, and
    in eager mode not on sync, when a joining rank needs it.)"""
    from horovod.common.elastic import ObjectState

    class State(ObjectState):
        def __init__(self):
            self.variables, self._values = variables, [v.numpy() for v in variables]
            super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **progress)

        def save(self):
            self._values = [v.numpy() for v in self.variables]
            super().save()

        def restore(self):
            for variable, value in zip(self.variables, self._values):
                variable.assign(value)
            super().restore()

        def sync(self):
            hvd.broadcast_variables(self.variables, root_rank=0)
            self._values = [v.numpy() for v in self.variables]
            super().sync()

    return State()


def elastic_run(hvd, func):
    """hvd.elastic.run, also for the failures of grouped allreduces (the
    gradients'), whose op names its own check does not know."""
    import tensorflow as tf
    from horovod.common.elastic import run_fn
    from horovod.common.exceptions import HorovodInternalError

    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as e:
            if "Horovod" in (e.message or ""):
                raise HorovodInternalError(e) from None
            raise

    def reset():
        hvd.shutdown()
        hvd.init()

    return run_fn(wrapper, reset)
