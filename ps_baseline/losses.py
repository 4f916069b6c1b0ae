"""What a lost PS worker means, decided once, for the three that ask: the
stall watchdog (does a silent worker end the job?), `ps-baseline launch`
(does a dead worker's exit end the job?) and the chief's end-of-run gather
(does it wait for a silent worker's report?)."""
import os

# Set by `launch` without --restart-workers: a dead worker will not come back, so the
# chief need not wait --report-timeout for its report (a person restarting it by hand might).
NO_RESTARTS_ENV = "PS_BASELINE_NO_RESTARTS"


def workers_needed(ps, workers):
    """The fewest live workers training goes on with: every worker where each
    step runs on all of them (in-graph towers; TF2's coordinator, whose
    launcher ends the job with a worker); in sync training, the K gradients of
    each update (every worker, unless some are backup workers); in async
    training, any one."""
    if ps.replication == "in-graph" or ps.api == "tf2":
        return workers
    if ps.sync:
        return ps.replicas_to_aggregate or workers
    return 1


def rejoins(ps):
    """A dead worker can be restarted and rejoin where it left off: a worker of
    between-graph replication, whose position is its own step count on the PS;
    not a tower of in-graph replication nor a TF2 worker, whose steps one
    client drives."""
    return ps.replication == "between-graph" and ps.api == "v1"


def waits_for_every_worker(ps, workers):
    """Training stops without any one worker."""
    return workers_needed(ps, workers) == workers


def goes_on_without(ps, workers, alive):
    """Training goes on with `alive` of its `workers` left."""
    return alive >= workers_needed(ps, workers)


def worker_may_come_back():
    """A worker gone silent may come back: restarted by a person, as in the
    classic tutorials' terminals; not under `launch` without --restart-workers."""
    return not os.environ.get(NO_RESTARTS_ENV)
