"""`ringtrain-bench`: measured ring-versus-PS scaling and allreduce bandwidth,
on this machine, on the hosts of a hostfile, or on simulated clusters."""
import argparse
import contextlib
import os
import sys
import time

from ringtrain.bench import expectations
from ringtrain.bench.publish import publish
from ringtrain.common.errors import UsageError, run_cli
from ringtrain.common.parsing import add_version, finite_float, non_negative_float, non_negative_int, positive_float, positive_int
from ringtrain.workloads.flags import DEFAULT_MODEL, OneLineParser, image_shape, model_name, simulated_accelerator
from ringtrain.workloads.gradients import DEFAULT_BUCKET_MB, DEFAULT_RING_BUCKET_MB
from ringtrain.workloads.horovod_env import MPI_ALLREDUCE_ALGORITHMS, knob_env
from ringtrain.workloads.outputs import check_outputs

EXAMPLES = """examples:
  ringtrain-bench allreduce --np 2 --sizes 4K..256M --out bench/results
  ringtrain-bench scaling --modes ring,ps-sync,ps-async --np 1,2 --model mnist_cnn --data synthetic --out bench/results
  ringtrain-bench report --out bench/results       # both, as `make bench` runs them (~15 min on 2 cores)

  sync against async (ring, tf-collective, ps-sync, ps-sync-backup, ps-async), here or across hosts:
  ringtrain-bench straggler --np 2 --factors 1,1.5,3 --out bench/results      # one slow worker
  ringtrain-bench convergence --np 2 --target 0.97 --repeats 3 --out bench/results   # time to accuracy
  ringtrain-bench straggler --cluster 3 --link-rate 1gbit --np 2 --out r     # W + 1 hosts for the backup worker

  across hosts (--hostfile: yours; --cluster H: a simulated cluster of H hosts the bench builds as root;
  inside a SLURM allocation, with neither: its nodes, as mpi_hostfiles/slurm/bench.sbatch runs it):
  ringtrain-bench scaling --hostfile hosts --np 1,2,4 --modes ring,ring-gloo,ps-sync,ps-async --num-ps 1,N --out r
  ringtrain-bench scaling --cluster 4 --link-rate 1gbit,10gbit --time-dilation 1,10 --model resnet50 --np 1,2,4 --out r
  ringtrain-bench allreduce --cluster 4 --link-rate 1gbit --np 2,4 --mpi-algorithms ring,rabenseifner,recursive_doubling --out r

  your own model: what it sends per step, and a profile file that the simulated accelerator trains on:
  ringtrain-bench profile --model keras:ResNet50 --image-shape 224x224x3 --num-classes 1000 --step-ms 292 --out r50.json
  ringtrain-bench scaling --cluster 4 --simulate-gpu r50.json --np 1,2,4 --out r
  ringtrain-bench parity --model keras:ResNet50 --np 2 --rounds 3 --out r   # against a plain Horovod script
  ringtrain-bench parity --recipe keras-fit --model keras:ResNet50 --rounds 3 --out r   # Keras fit against the tape
  ringtrain-bench parity --recipe tf-collective --model keras:ResNet50 --rounds 3 --out r   # against plain MWMS

  the input pipeline alone (img/s per core), and training from TFRecords against memory, side by side:
  ringtrain-bench pipeline --data synthetic --data tfrecords:synthetic --train 1,2 --out r
  ringtrain-bench pipeline --data '/data/imagenet/train-*' --model keras:ResNet50 --batch-size 32 --out r

  past this machine: the α-β model at 8..512 GPUs, 4 a host, ring against PS (nothing runs):
  ringtrain-bench project --model resnet101 --gpus-per-host 4 --link-rate 25gbit --out r
  ringtrain-bench project --model r50.json --alpha-beta r/1gbit/scaling.json --out r
  ringtrain-bench project --check r/1gbit/scaling.json --fit-up-to 4 --out r   # the model against a measured run

  your own line through the results; exit 1 when it does not hold:
  ringtrain-bench scaling --np 1,2 --expect 'mode=ring,workers=2: efficiency >= 0.7' --out r

Every run writes DIR/report.html: the command and what the run found, first; then the
table, the plots, the column definitions and the machine. Every column is defined in
bench/COLUMNS.md.
"""


TRADEOFFS = ("straggler", "convergence")  # the sync-against-async benches (bench/sync_modes.py)


def int_list(text):
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers like 1,2,4, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"worker counts must be >= 1, got {text!r}")
    return sorted(set(values))


def choice_list(choices, what):
    def parse(text):
        values = [t.strip() for t in text.split(",") if t.strip()]
        bad = [v for v in values if v not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(bad) or text!r}: choose from "
                                             f"{','.join(choices)}")
        return values
    return parse


def mode_list(text):
    from ringtrain.bench.scaling import MODES
    return choice_list(MODES, "mode(s)")(text)


def ps_list(text):
    """--num-ps: integers, or N for one PS task per worker host."""
    values = [t.strip() for t in text.split(",") if t.strip()]
    if not values or any(not (v == "N" or (v.isdigit() and int(v) > 0)) for v in values):
        raise argparse.ArgumentTypeError(f"expected PS counts like 1 or 1,N (N: one per worker host), got {text!r}")
    return values


def rate_list(text):
    from ringtrain.multihost.simcluster import RATE
    values = [t.strip() for t in text.split(",") if t.strip()]
    bad = [v for v in values if not RATE.match(v)]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"{', '.join(bad) or text!r}: write tc rates such as 1gbit,10gbit")
    return values


def float_list(text):
    try:
        values = [finite_float(t) for t in text.split(",") if t.strip()]
    except (ValueError, argparse.ArgumentTypeError):
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected factors >= 1 like 1,10, got {text!r}")
    return values


def add_site_flags(p):
    g = p.add_argument_group("where (default: this machine, or inside a SLURM allocation its nodes)")
    where = g.add_mutually_exclusive_group()
    where.add_argument("--hostfile", metavar="FILE",
                       help="run across the hosts of this OpenMPI hostfile (N fills their slots in order); "
                            "the bench runs on the first host")
    where.add_argument("--cluster", type=positive_int, metavar="H",
                       help="bring up a simulated cluster of H hosts (ringtrain-cluster; needs root) for each "
                            "--link-rate, and tear it down after")
    g.add_argument("--link-rate", type=rate_list, default=["1gbit"], metavar="R[,R...]",
                   help="with --cluster: the link rates to run at (default 1gbit)")
    g.add_argument("--time-dilation", type=float_list, default=[1.0], metavar="K[,K...]",
                   help="with --cluster, per link rate: shape links at rate/K and make each simulated "
                        "accelerator step K times longer, for links faster than this machine can drive; "
                        "times are divided by K in the tables (default 1)")


def add_allreduce_flags(p):
    g = p.add_argument_group("allreduce bench")
    g.add_argument("--sizes", default="4K..256M", metavar="RANGE",
                   help="LO..HI (x4 steps) or a comma list, bytes with K/M/G (default %(default)s); "
                        "the model's gradient size is always added")
    g.add_argument("--trials", type=positive_int, default=5, help="timed trials per size; the median is reported (default 5)")
    g.add_argument("--warmup-ops", type=positive_int, default=3, metavar="K",
                   help="operations per size and implementation before the timed trials (default 3)")
    g.add_argument("--no-gloo", action="store_true", help="skip the horovodrun --gloo rows")
    g.add_argument("--no-horovod", action="store_true", help="skip the Horovod rows")
    g.add_argument("--no-tf", action="store_true",
                   help="skip the rows of TF's own collective all-reduce (MultiWorkerMirroredStrategy, RING)")
    g.add_argument("--mpi-algorithms", type=choice_list(sorted(MPI_ALLREDUCE_ALGORITHMS) + ["default"], "algorithm(s)"),
                   default=[], metavar="A[,A...]",
                   help="one raw MPI_Allreduce row set per OpenMPI algorithm, e.g. ring,rabenseifner,"
                        "recursive_doubling,default (default: OpenMPI's own choice only)")
    g.add_argument("--compare-cycle-time-ms", type=positive_float, metavar="MS",
                   help="also run the Horovod-over-MPI rows with HOROVOD_CYCLE_TIME=MS")
    g.add_argument("--compare-upstream-loop", action="store_true",
                   help="also run the Horovod-over-MPI rows with Horovod's upstream background loop")


def add_horovod_flags(p):
    g = p.add_argument_group("Horovod knobs (for the Horovod allreduce rows and the ring runs)")
    g.add_argument("--cycle-time-ms", type=positive_float, metavar="MS",
                   help="HOROVOD_CYCLE_TIME / ringtrain --cycle-time-ms (default: Horovod's own, 1 ms)")
    g.add_argument("--fusion-threshold-mb", type=non_negative_float, metavar="MB",
                   help="HOROVOD_FUSION_THRESHOLD / ringtrain --fusion-threshold-mb (default: 128 MB)")


def add_scaling_flags(p, modes_default):
    g = p.add_argument_group("scaling bench")
    g.add_argument("--modes", type=mode_list, default=mode_list(modes_default),
                   help=f"comma list of ring (mpirun; across hosts Gloo carries the gradients and coordinates), "
                        f"ring-mpi (the same with OpenMPI doing both across hosts too), ring-upstream (the same as ring with "
                        f"Horovod's upstream background loop), ring-gloo (horovodrun --gloo), tf-collective (TF's own ring: "
                        f"MultiWorkerMirroredStrategy under mpirun), ps-sync, ps-ingraph (in-graph "
                        f"replication), towers (one process, a tower per device; one machine only), "
                        f"ps-async, independent (N single-rank trainers at once, nothing exchanged: "
                        f"the machine's ceiling; on one machine only) (default {modes_default})")
    g.add_argument("--bucket-mb", type=non_negative_float, metavar="MB",
                   help=f"ring and TF collective rows: ringtrain --bucket-mb (default: each backend's own, "
                        f"{DEFAULT_RING_BUCKET_MB:g} MB for Horovod's ring, {DEFAULT_BUCKET_MB:g} MB for TF's)")
    g.add_argument("--data", default="synthetic", metavar="SOURCE",
                   help="the trainers' --data: a glob of TFRecords, a folder, package.module:function, mnist, "
                        "cifar10 or synthetic (default %(default)s)")
    g.add_argument("--data-dir", metavar="DIR", help="passed to the trainers")
    g.add_argument("--batch-size", type=positive_int, default=64, metavar="B",
                   help="per-worker batch for weak scaling (default %(default)s)")
    g.add_argument("--scaling", choices=("weak", "strong"), default="weak",
                   help="weak: B per worker, global batch N*B; strong: --global-batch split over N")
    g.add_argument("--global-batch", type=positive_int, metavar="G", help="for --scaling strong")
    g.add_argument("--steps", type=positive_int, default=200, metavar="K",
                   help="steps per run, warm-up included (default %(default)s)")
    g.add_argument("--warmup-steps", type=positive_int, default=3, metavar="K",
                   help="steps not timed at the start of each run (default %(default)s)")
    g.add_argument("--repeats", type=positive_int, default=1, metavar="R",
                   help="run every configuration R times, in interleaved rounds; the table shows the "
                        "median and the range (default %(default)s)")
    g.add_argument("--num-ps", type=ps_list, default=["1"], metavar="P[,P...]",
                   help="PS tasks: counts, or N for one per worker host, colocated as the classic tutorials deploy "
                        "them (default 1)")
    g.add_argument("--placement", choices=("round_robin", "greedy", "partitioned"), default="greedy",
                   help="PS variable placement (ps-baseline --placement; default %(default)s: round_robin "
                        "deals variables in turn, so with 4 PS tasks and 4 variables per layer one task "
                        "gets every kernel)")
    g.add_argument("--threads", type=positive_int, default=1, metavar="T",
                   help="TF threads per worker (default 1)")
    g.add_argument("--optimizer", choices=("sgd", "momentum", "adam"), default="adam",
                   help="the trainers' optimizer (default %(default)s)")
    g.add_argument("--simulate-gpu", type=simulated_accelerator(), metavar="MS|FILE.json",
                   help="workers run a simulated accelerator of MS per step (resnet50, resnet101 and vgg16 always "
                        "do, by default with a published P100 step time: bench/COLUMNS.md), or of a profile "
                        "FILE.json from `profile`: its model's tensors at its step time")
    g.add_argument("--alpha-beta", metavar="FILE",
                   help="on this machine: allreduce.json to fit the α-β model from (default: "
                        "OUT/allreduce.json if present); across hosts the bench fits its links itself")


def add_tradeoff_flags(p, steps, data, simulate):
    """The flags `straggler` and `convergence` share: the modes of bench/sync_modes.py."""
    from ringtrain.bench.sync_modes import MODES
    g = p.add_argument_group("sync against async")
    g.add_argument("--modes", type=choice_list(MODES, "mode(s)"), default=list(MODES), metavar="M[,M...]",
                   help="of ring (Horovod), tf-collective (TF's own all-reduce), ps-sync (K = W), ps-sync-backup "
                        "(W + 1 workers, K = W), ps-async (default: all of them)")
    g.add_argument("--data", default=data, metavar="SOURCE",
                   help="the trainers' --data: a glob of TFRecords, a folder, package.module:function, mnist, "
                        "cifar10 or synthetic (default %(default)s)")
    g.add_argument("--data-dir", metavar="DIR", help="passed to the trainers")
    g.add_argument("--batch-size", type=positive_int, default=32, metavar="B",
                   help="per-worker batch (default %(default)s)")
    g.add_argument("--steps", type=positive_int, default=steps, metavar="S",
                   help="updates per run (async: steps per worker) (default %(default)s)")
    g.add_argument("--warmup-steps", type=positive_int, default=5, metavar="K",
                   help="steps not timed at the start of each run (default %(default)s)")
    g.add_argument("--threads", type=positive_int, default=1, metavar="T",
                   help="TF threads per worker (default 1)")
    g.add_argument("--optimizer", choices=("sgd", "momentum", "adam"), default="adam",
                   help="default %(default)s")
    g.add_argument("--repeats", type=positive_int, default=1, metavar="R",
                   help="run everything R times, in interleaved rounds; tables show medians (default 1)")
    g.add_argument("--simulate-gpu", type=simulated_accelerator(non_negative_float), default=simulate,
                   metavar="MS|FILE.json",
                   help="workers run a simulated accelerator of MS per step, waits that use no CPU, so that "
                        "W + 1 workers on few cores do not slow each other, or of a profile FILE.json from "
                        f"`profile`; 0: real compute (default {simulate:g})")


def add_run_flags(p, np_type, np_default, np_help, timeout, model_help=f"default {DEFAULT_MODEL}"):
    """The flags every subcommand has: rank counts, model, output folder, time limit."""
    p.add_argument("--np", type=np_type, default=np_default, help=np_help)
    p.add_argument("--model", type=model_name, metavar="NAME",
                   help=model_help + "; as the trainers' --model: a catalog name, keras:NAME, "
                                     "package.module:function or a profile FILE.json")
    p.add_argument("--timeout", type=positive_float, default=timeout,
                   help=f"seconds per launch (default {timeout:g})")
    add_output_flags(p)


def check_timed_steps(args):
    """--steps must leave a step to time after the warm-up."""
    if args.steps <= args.warmup_steps:
        raise UsageError(f"--steps {args.steps} leaves no step to time after {args.warmup_steps} warm-up "
                         "steps: give more --steps or fewer --warmup-steps")


def keras_application(text):
    """parity's --model: the plain scripts build keras.applications networks, and mnist_cnn."""
    from ringtrain.workloads.user_models import KERAS_PREFIX
    if text != "mnist_cnn" and (not text.startswith(KERAS_PREFIX) or not text[len(KERAS_PREFIX):].isidentifier()):
        raise argparse.ArgumentTypeError(f"{text!r}: the plain scripts build keras.applications networks and "
                                         "mnist_cnn: give keras:NAME, e.g. keras:ResNet50, or mnist_cnn")
    return text


def add_output_flags(p):
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--expect", type=expectations.parse, action="append", default=[],
                   metavar="'SELECTOR: FIELD OP NUMBER'",
                   help="your own line through the results, e.g. 'mode=ring,workers=2: efficiency >= 0.8' "
                        "(fields: the JSON rows'); the report lists it with what was measured, and the "
                        "command exits 1 when it does not hold. Repeatable")


def parser():
    p = OneLineParser(prog="ringtrain-bench", epilog=EXAMPLES,
                      formatter_class=argparse.RawDescriptionHelpFormatter,
                      description="Measured ring-allreduce versus parameter-server scaling, and "
                                  "allreduce bandwidth as nccl-tests defines it.")
    add_version(p)
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    common = dict(formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES)
    allreduce_command(sub, common)
    scaling_command(sub, common)
    report_command(sub, common)
    straggler_command(sub, common)
    convergence_command(sub, common)
    project_command(sub, common)
    parity_command(sub, common)
    pipeline_command(sub, common)
    profile_command(sub, common)
    return p


def allreduce_command(sub, common):
    a = sub.add_parser("allreduce", help="algbw/busbw of Horovod (MPI, Gloo), TF's collective all-reduce, "
                       "MPI_Allreduce, the reference ring",
                       **common)
    add_run_flags(a, int_list, [2], "ranks, e.g. 2 or 2,4 (default 2)", timeout=900,
                  model_help=f"whose gradient size to add (default {DEFAULT_MODEL})")
    add_allreduce_flags(a)
    add_horovod_flags(a)
    add_site_flags(a)


def scaling_command(sub, common):
    s = sub.add_parser("scaling", help="ring vs PS throughput, efficiency, step-time split, bytes on the wire",
                       **common)
    add_run_flags(s, int_list, [1, 2], "worker counts, e.g. 1,2,4 (default 1,2)", timeout=600)
    add_scaling_flags(s, "ring,ps-sync,ps-async")
    add_horovod_flags(s)
    add_site_flags(s)


def report_command(sub, common):
    r = sub.add_parser("report", help="allreduce bench, then scaling bench (what `make bench` runs)", **common)
    add_run_flags(r, int_list, [1, 2], "scaling worker counts (default 1,2)", timeout=900)
    add_allreduce_flags(r)
    add_scaling_flags(r, "ring,ring-upstream,ps-sync,ps-async,ps-ingraph,towers,independent")
    add_horovod_flags(r)
    r.set_defaults(compare_upstream_loop=True, repeats=3)


def straggler_command(sub, common):
    st = sub.add_parser("straggler", help="one slow worker: what it costs ring, sync PS, sync PS with a "
                        "backup worker, and async PS", **common)
    add_run_flags(st, positive_int, 2, "W, the workers that sync modes wait for (default 2)", timeout=300)
    add_tradeoff_flags(st, steps=60, data="synthetic", simulate=30.0)
    st.add_argument("--factors", type=float_list, default=[1.0, 1.5, 3.0], metavar="F[,F...]",
                    help="straggler factors; 1 (no straggler, every ratio's reference) is always run "
                         "(default 1,1.5,3)")
    st.add_argument("--straggler-rank", type=int, default=1, metavar="R",
                    help="which worker is slow (default 1: not the chief, whose work includes more)")
    st.add_argument("--every", type=positive_int, default=1, metavar="E",
                    help="only every E-th step of the straggler is slow (default 1: all)")
    add_site_flags(st)


def convergence_command(sub, common):
    cv = sub.add_parser("convergence", help="test accuracy against time and samples; time to a target accuracy",
                        **common)
    add_run_flags(cv, positive_int, 2, "W workers (default 2)", timeout=600)
    add_tradeoff_flags(cv, steps=400, data="mnist", simulate=0.0)
    cv.add_argument("--target", type=positive_float, default=0.97, metavar="ACC",
                    help="test accuracy to reach, as a fraction (default %(default)s)")
    cv.add_argument("--lr", type=positive_float, default=1e-3, help="every mode's lr (default %(default)s)")
    cv.add_argument("--snapshot-every", type=positive_int, default=10, metavar="K",
                    help="evaluate the weights of every K-th step (default %(default)s)")
    cv.add_argument("--straggler", metavar="RANK:FACTOR[:EVERY]", help="run every mode with this straggler")
    add_site_flags(cv)


def project_command(sub, common):
    pj = sub.add_parser("project", help="the α-β model taken to N GPUs on hosts of G GPUs: ring against PS "
                        "(P = 1, N/4, N), step time, throughput, efficiency; nothing is run", **common)
    pj.add_argument("--model", default="resnet101", type=model_name, metavar="NAME",
                    help="whose gradients are exchanged (default %(default)s): a catalog name, keras:NAME, "
                         "package.module:function or a profile FILE.json")
    pj.add_argument("--step-ms", type=positive_float, metavar="MS",
                    help="one GPU's step (default: the profile's own, e.g. the catalog's published P100 figures)")
    pj.add_argument("--batch-size", type=positive_int, default=64, metavar="B",
                    help="per GPU, for images/s (default %(default)s)")
    pj.add_argument("--np", type=int_list, default=[8, 16, 32, 64, 128, 256, 512], metavar="N[,N...]",
                    help="GPU counts (default 8,16,...,512)")
    pj.add_argument("--gpus-per-host", type=positive_int, default=1, metavar="G", help="default %(default)s")
    links = pj.add_mutually_exclusive_group(required=True)
    links.add_argument("--alpha-beta", metavar="FILE.json",
                       help="the links' α and β as a bench run fitted them across hosts (its scaling.json)")
    links.add_argument("--link-rate", type=rate_list, metavar="RATE[,RATE...]",
                       help="links between hosts, e.g. 25gbit,100gbit, with --latency-us as α")
    links.add_argument("--check", metavar="RUN/scaling.json",
                       help="check the model against a run across hosts instead: fitted on its rows of at most "
                            "--fit-up-to workers, against its measured rows of more")
    pj.add_argument("--fit-up-to", type=positive_int, default=4, metavar="K",
                    help="with --check: fit on the rows of at most K workers (default %(default)s)")
    pj.add_argument("--placement", choices=["greedy", "round_robin", "partitioned"], default="greedy",
                    help="how PS tasks hold the variables, as in ps-baseline (default %(default)s)")
    pj.add_argument("--hierarchical", action="store_true",
                    help="the ring reduces inside each host first, then across hosts, as "
                         "HOROVOD_HIERARCHICAL_ALLREDUCE=1 (default: Horovod's default, NCCL's ring through all GPUs)")
    pj.add_argument("--bucket-mb", type=non_negative_float, default=DEFAULT_BUCKET_MB, metavar="MB",
                    help="TF's ring's gradient buckets, as ringtrain --backend tf-collective --bucket-mb (default "
                         "%(default)s; 0: one all-reduce after backprop)")
    pj.add_argument("--step-spread", type=non_negative_float, default=0.0, metavar="PCT",
                    help="how much one GPU's step varies, as a standard deviation in %% of the step (default 0: "
                         "every GPU steps in time); every step then waits for the slowest of N GPUs")
    pj.add_argument("--fit-at", type=positive_int, metavar="N",
                    help="with --alpha-beta: the ring's α and β as fitted at N ranks (default: over every N)")
    pj.add_argument("--latency-us", type=positive_float, default=10.0, metavar="US",
                    help="with --link-rate: α, the cost of one message (default %(default)s)")
    pj.add_argument("--intra-host-rate", type=rate_list, default=["80gbit"], metavar="RATE",
                    help="the link between GPUs of one host (default 80gbit, PCIe 3.0 x16)")
    pj.add_argument("--grpc-rate", type=rate_list, metavar="RATE",
                    help="the most TF's gRPC moves per host and direction, e.g. as measured by "
                         "ringtrain-bench allreduce on one machine (default: no limit but the link)")
    add_output_flags(pj)


def parity_command(sub, common):
    pa = sub.add_parser("parity", help="ringtrain against a plain Horovod script (examples/plain_horovod.py) "
                        "on the same Keras Applications network, batch and threads (the script with ringtrain's "
                        "OpenMPI settings and with OpenMPI's defaults), in rotating rounds", **common)
    pa.add_argument("--recipe", choices=("ringtrain", "keras-fit", "tf-collective"), default="ringtrain",
                    help="ringtrain (default) or Horovod's Keras recipe, model.fit with hvd.DistributedOptimizer "
                         "(keras-fit), against the plain Horovod GradientTape script; or ringtrain --backend "
                         "tf-collective against a plain MultiWorkerMirroredStrategy script, examples/plain_mwms.py "
                         "(tf-collective)")
    pa.add_argument("--model", default="keras:ResNet50", type=keras_application, metavar="keras:NAME",
                    help="a keras.applications network (default %(default)s)")
    pa.add_argument("--np", type=positive_int, default=2, metavar="N", help="ranks, under mpirun (default 2)")
    pa.add_argument("--image-shape", type=image_shape, metavar="HxWxC",
                    help="random images of this shape (default 32x32x3; mnist_cnn's 28x28x1)")
    pa.add_argument("--batch-size", type=positive_int, default=16, metavar="B", help="per rank (default 16)")
    pa.add_argument("--steps", type=positive_int, default=30, help="per run, the warm-up included (default 30)")
    pa.add_argument("--warmup-steps", type=non_negative_int, default=5, metavar="K",
                    help="not timed (default 5)")
    pa.add_argument("--lr", type=positive_float, default=0.01, help="SGD's, in both (default 0.01)")
    pa.add_argument("--rounds", type=positive_int, default=3, help="alternating rounds (default 3)")
    pa.add_argument("--threads", type=positive_int, default=1, metavar="T",
                    help="TF threads per rank (default 1)")
    pa.add_argument("--plain-input", choices=("constant", "tf.data"), default="constant",
                    help="how the plain scripts feed their steps: one random batch again and again, as Horovod's "
                         "synthetic benchmarks do (default), or random images read through tf.data as TF's guide "
                         "reads data, as ringtrain reads its --data synthetic")
    pa.add_argument("--timeout", type=positive_float, default=600, metavar="SEC", help="per run (default 600)")
    add_output_flags(pa)


def pipeline_command(sub, common):
    pl = sub.add_parser("pipeline", help="the input pipeline alone, in img/s and per core, for each --data; with "
                        "--train N[,N], the model also trained from each, side by side in rotating rounds", **common)
    pl.add_argument("--data", action="append", required=True, metavar="SOURCE",
                    help="a source as the trainers take it (a glob of TFRecords, a folder, package.module:function, "
                         "mnist, cifar10, synthetic), or tfrecords:NAME: NAME's images written as TFRecord files "
                         "first; repeat it to compare sources (ratios are to the first)")
    pl.add_argument("--data-dir", metavar="DIR", help="passed to the trainers")
    pl.add_argument("--model", type=model_name, default="cifar_resnet", metavar="NAME",
                    help="whose input the images are read at, and trained (default %(default)s)")
    pl.add_argument("--batch-size", type=positive_int, default=64, metavar="B", help="per worker (default 64)")
    pl.add_argument("--threads", type=positive_int, default=1, metavar="T",
                    help="TF threads per worker, tf.data's pool included (default 1)")
    pl.add_argument("--seconds", type=positive_float, default=10.0, metavar="S",
                    help="how long the pipeline alone is timed, per source and round (default 10)")
    pl.add_argument("--train", type=int_list, default=[], metavar="N[,N...]",
                    help="also train under mpirun with N ranks from each source (default: the pipeline alone)")
    pl.add_argument("--steps", type=positive_int, default=100, help="per training run, warm-up included (default 100)")
    pl.add_argument("--warmup-steps", type=non_negative_int, default=10, metavar="K", help="not timed (default 10)")
    pl.add_argument("--rounds", type=positive_int, default=3, help="rounds, the order rotating (default 3)")
    pl.add_argument("--files", type=positive_int, default=8, help="TFRecord files tfrecords:NAME writes (default 8)")
    pl.add_argument("--timeout", type=positive_float, default=600, metavar="SEC", help="per run (default 600)")
    add_output_flags(pl)


def run_pipeline(args, log):
    from ringtrain.bench import pipeline
    check_timed_steps(args)
    cfg = {key: getattr(args, key) for key in ("data", "data_dir", "model", "batch_size", "threads", "seconds",
                                               "train", "steps", "warmup_steps", "rounds", "files", "timeout")}
    result = pipeline.run(cfg, args.out, log=log)
    print(pipeline.markdown(result), end="", flush=True)
    return result


def profile_command(sub, common):
    pr = sub.add_parser("profile", help="a model's parameters, gradient bytes and tensors, one step timed here, "
                        "and a gradient profile FILE.json for --simulate-gpu (or --model)", **common)
    pr.add_argument("--model", required=True, type=model_name, metavar="NAME",
                    help="a catalog name, keras:NAME or package.module:function")
    pr.add_argument("--image-shape", type=image_shape, metavar="HxWxC",
                    help="the input (default: the model's own; 32x32x3 for keras:NAME and factories)")
    pr.add_argument("--num-classes", type=positive_int, metavar="K",
                    help="classes, for keras:NAME and factories (default 10, the datasets')")
    pr.add_argument("--batch-size", type=positive_int, default=32, metavar="B", help="default %(default)s")
    pr.add_argument("--measure-steps", type=int, default=3, metavar="K",
                    help="time K steps here after one untimed (0: none; default %(default)s)")
    pr.add_argument("--threads", type=int, default=0, metavar="T", help="TF threads (0: TF's default)")
    pr.add_argument("--step-ms", type=positive_float, metavar="MS",
                    help="the step time to write into the profile, e.g. a published GPU figure "
                         "(default: the one measured here)")
    pr.add_argument("--out", metavar="FILE.json", help="write the profile here, for --simulate-gpu FILE.json")


def run_profile(args):
    from ringtrain.bench import profile
    if args.out and not args.out.endswith(".json"):
        raise UsageError(f"--out {args.out}: a profile is a .json file (--model takes it by that ending)")
    from ringtrain.workloads.catalog import check_model
    check_model(args.model)
    result = profile.run(args.model, args.image_shape, args.num_classes, args.batch_size, args.measure_steps,
                         args.step_ms, args.threads)
    print(profile.markdown(result), end="", flush=True)
    if args.out:
        if not result["step_ms"]:
            raise UsageError("the profile needs a step time: give --step-ms MS, or --measure-steps K")
        profile.write(result, args.out)
        print(f"ringtrain-bench: profile written to {args.out}: train on it with --simulate-gpu {args.out}",
              file=sys.stderr)
    return 0


def horovod_env(args):
    return knob_env(args.cycle_time_ms, args.fusion_threshold_mb)


def slots_needed(args):
    """The most worker processes one launch of the command starts."""
    if args.command in TRADEOFFS:
        from ringtrain.bench.sync_modes import processes
        return max(processes(mode, args.np) for mode in args.modes)
    if args.command == "pipeline":
        return max(args.train or [1])
    return max(args.np) if isinstance(args.np, list) else args.np


def check_site(args):
    """One line for a bad combination, before anything starts."""
    if args.command == "project":
        return  # (nothing runs: its --link-rate is the links it projects to)
    from ringtrain.multihost.hostfile import fill, read_hostfile
    slots = slots_needed(args)
    if getattr(args, "hostfile", None):
        fill(read_hostfile(args.hostfile), slots, f"hostfile {args.hostfile}")
    elif on_slurm_nodes(args):
        from ringtrain.bench.sites import from_slurm
        site = from_slurm()
        fill(site.hosts, slots, site.label)
    if args.command in TRADEOFFS and getattr(args, "time_dilation", [1.0]) != [1.0]:
        raise UsageError(f"--time-dilation is the scaling bench's: {args.command} compares modes at the links' own "
                         "rate; drop it")
    if getattr(args, "cluster", None):
        if slots > args.cluster:
            needs = f"--np {args.np} with ps-sync-backup's W + 1 workers" if args.command in TRADEOFFS and \
                slots > args.np else f"--np {slots}"
            raise UsageError(f"{needs} needs at least that many hosts: --cluster {slots}")
        if len(args.time_dilation) not in (1, len(args.link_rate)):
            raise UsageError("--time-dilation takes one factor, or one per --link-rate")
        from ringtrain.multihost.simcluster import check_can_build
        check_can_build()
    elif getattr(args, "link_rate", ["1gbit"]) != ["1gbit"] or getattr(args, "time_dilation", [1.0]) != [1.0]:
        raise UsageError("--link-rate and --time-dilation shape a simulated cluster: add --cluster H")


def links(args):
    dilations = args.time_dilation * len(args.link_rate) if len(args.time_dilation) == 1 else args.time_dilation
    return list(zip(args.link_rate, dilations))


def on_slurm_nodes(args):
    """Inside a SLURM allocation (sbatch, salloc), with no other site named, the
    commands that run across hosts run on its nodes."""
    from ringtrain.multihost.slurm_step import in_allocation
    return args.command in ("scaling", "allreduce") + TRADEOFFS and in_allocation() and \
        not getattr(args, "hostfile", None) and not getattr(args, "cluster", None)


@contextlib.contextmanager
def single_site(args, log):
    """This machine, a hostfile's hosts, or one simulated cluster at the first link rate."""
    from ringtrain.bench import sites
    if getattr(args, "cluster", None):
        rate, dilation = links(args)[0]
        with sites.simulated(args.cluster, rate, dilation, log=log) as site:
            yield site
    elif getattr(args, "hostfile", None):
        yield sites.from_hostfile(args.hostfile)
    elif on_slurm_nodes(args):
        site = sites.from_slurm()
        log(f"ringtrain-bench: on the nodes of {site.label}, one slot per SLURM task (--hostfile overrides)")
        yield site
    else:
        yield sites.this_machine()


def scaling_config(args):
    from ringtrain.workloads.catalog import model_spec
    model_spec(args.model)
    if args.scaling == "strong" and not args.global_batch:
        raise UsageError("--scaling strong needs --global-batch G (split over N workers)")
    from ringtrain.workloads.catalog import simulated_step_ms
    if any(k != 1 for k in getattr(args, "time_dilation", [1.0])) and \
            not simulated_step_ms(args.model, args.simulate_gpu):
        raise UsageError("--time-dilation slows the simulated accelerator with the links: add --simulate-gpu MS "
                         "(or use resnet50, resnet101 or vgg16)")
    check_timed_steps(args)
    return {"modes": args.modes, "np": args.np, "model": args.model, "data": args.data,
            "data_dir": args.data_dir, "batch_size": args.batch_size, "scaling": args.scaling,
            "global_batch": args.global_batch, "steps": args.steps, "warmup_steps": args.warmup_steps,
            "num_ps": args.num_ps, "placement": args.placement, "repeats": args.repeats,
            "threads": args.threads, "timeout": args.timeout,
            "optimizer": args.optimizer, "simulate_gpu_ms": args.simulate_gpu,
            "cycle_time_ms": args.cycle_time_ms, "fusion_threshold_mb": args.fusion_threshold_mb,
            "bucket_mb": args.bucket_mb, "alpha_beta_json": args.alpha_beta or os.path.join(args.out, "allreduce.json")}


def tradeoff_config(args):
    """The trainers' settings for `straggler` and `convergence`, checked."""
    from ringtrain.workloads.catalog import model_spec
    model_spec(args.model)
    check_timed_steps(args)
    cfg = {"modes": args.modes, "np": args.np, "model": args.model, "data": args.data, "data_dir": args.data_dir,
           "batch_size": args.batch_size, "steps": args.steps, "warmup_steps": args.warmup_steps,
           "threads": args.threads, "optimizer": args.optimizer, "repeats": args.repeats,
           "simulate_gpu_ms": args.simulate_gpu or None, "timeout": args.timeout, "placement": "greedy"}
    if args.command == "straggler":
        if not 0 <= args.straggler_rank < args.np:
            raise UsageError(f"--straggler-rank {args.straggler_rank}: use 0..{args.np - 1} (one of the --np workers)")
        cfg.update(factors=sorted(set([1.0] + args.factors)), rank=args.straggler_rank, every=args.every)
    else:
        from ringtrain.workloads.catalog import simulated_step_ms
        from ringtrain.workloads.straggler import check, parse
        if simulated_step_ms(args.model, cfg["simulate_gpu_ms"]):
            raise UsageError("convergence needs a model that learns: drop --simulate-gpu (resnet50, resnet101 and vgg16 "
                             "are simulated only)")
        if args.straggler:
            try:
                check(parse(args.straggler), args.np)
            except argparse.ArgumentTypeError as e:
                raise UsageError(f"--straggler: {e}") from None
        if not 0 < args.target <= 1:
            raise UsageError(f"--target {args.target:g} is a fraction: give e.g. 0.97")
        cfg.update(target=args.target, lr=args.lr, snapshot_every=args.snapshot_every, straggler=args.straggler)
    return cfg


def run_tradeoff(args, log):
    from ringtrain.bench import convergence, straggler
    module = straggler if args.command == "straggler" else convergence
    cfg = tradeoff_config(args)
    with single_site(args, log) as site:
        result = module.run(cfg, args.out, log=log, site=site)
    print(module.markdown(result), flush=True)
    return result


def run_allreduce(args, np_list, log):
    from ringtrain.bench import allreduce, tables
    from ringtrain.workloads.catalog import model_spec
    model_spec(args.model)
    sizes = tables.parse_sizes(args.sizes)
    with single_site(args, log) as site:
        result = allreduce.run(np_list, sizes, args.out, model=args.model, trials=args.trials, warmup=args.warmup_ops,
                               gloo=not args.no_gloo, horovod=not args.no_horovod, tf=not args.no_tf,
                               horovod_env=horovod_env(args),
                               timeout=args.timeout, compare_cycle_ms=args.compare_cycle_time_ms, log=log,
                               site=site, mpi_algorithms=args.mpi_algorithms,
                               compare_upstream_loop=args.compare_upstream_loop)
    print(allreduce.markdown(result), flush=True)
    return result


def run_parity(args, log):
    from ringtrain.bench import parity
    check_timed_steps(args)
    shape = args.image_shape or ((28, 28, 1) if args.model == "mnist_cnn" else (32, 32, 3))
    cfg = {"model": args.model, "np": args.np, "image_shape": list(shape), "batch_size": args.batch_size,
           "steps": args.steps, "warmup_steps": args.warmup_steps, "lr": args.lr, "rounds": args.rounds,
           "threads": args.threads, "timeout": args.timeout, "recipe": args.recipe, "plain_input": args.plain_input}
    result = parity.run(cfg, args.out, log=log)
    print(parity.markdown(result), end="", flush=True)
    return result


def run_project(args, log):
    from ringtrain.bench import allreduce, project
    if args.check:
        from ringtrain.bench import project_check
        result = project_check.check(args.check, args.fit_up_to)
        print(project_check.write(result, args.out), flush=True)
        return result
    from ringtrain.multihost.simcluster import rate_bits_per_sec
    from ringtrain.workloads.catalog import check_model
    spec = check_model(args.model)
    step_ms = args.step_ms or spec.simulated_step_ms
    if not step_ms:
        raise UsageError(f"{args.model} has no published step time: give --step-ms MS (one GPU's step)")
    if args.alpha_beta:
        ring, ps = project.fits_from(args.alpha_beta, args.fit_at)
        at = f" at {args.fit_at} ranks" if args.fit_at else ""
        links = [{"label": "fitted", "source": f"fitted{at} in {args.alpha_beta}", "ring": ring, "ps": ps}]
    else:
        fits = {rate: project.link_fit(rate_bits_per_sec(rate), args.latency_us / 1e6) for rate in args.link_rate}
        links = [{"label": rate, "source": f"given, α = {args.latency_us:g} us", "ring": fit, "ps": fit}
                 for rate, fit in fits.items()]
    layers = allreduce.gradient_layer_bytes(args.model)
    cfg = {"model": args.model, "tensor_bytes": [b for layer in layers for b in layer],
           "layer_bytes": [sum(layer) for layer in layers], "step_ms": step_ms, "placement": args.placement,
           "hierarchical": args.hierarchical, "bucket_mb": args.bucket_mb, "step_spread_pct": args.step_spread,
           "step_source": "given (--step-ms)" if args.step_ms else "the catalog's published P100 step",
           "batch_size": args.batch_size, "np": args.np, "gpus_per_host": args.gpus_per_host, "links": links,
           "intra": project.link_fit(rate_bits_per_sec(args.intra_host_rate[0]), 1e-6),
           "grpc_rate_bits": rate_bits_per_sec(args.grpc_rate[0]) if args.grpc_rate else None}
    result = project.project(cfg)
    print(project.write(result, args.out), flush=True)
    return result


def run_scaling(args, log):
    from ringtrain.bench import scaling, scaling_report
    cfg = scaling_config(args)
    if getattr(args, "cluster", None):
        rates, dilations = zip(*links(args))
        text = scaling.run_links(cfg, args.out, args.cluster, rates, dilations, log=log)
        print(text, flush=True)
        return text
    with single_site(args, log) as site:
        result = scaling.run(cfg, args.out, log=log, site=site)
    print(scaling_report.markdown(result), flush=True)
    return result


def _main(argv):
    args = parser().parse_args(argv)
    if args.command == "profile":
        return run_profile(args)
    check_outputs(args)
    check_site(args)
    args.out = os.path.abspath(args.out)  # the launches run in the checkout, not here: they get whole paths
    os.makedirs(args.out, exist_ok=True)
    log = lambda m: print(m, file=sys.stderr, flush=True)
    start = time.time()
    try:
        if args.command == "allreduce":
            run_allreduce(args, args.np, log)
        elif args.command == "scaling":
            run_scaling(args, log)
        elif args.command in TRADEOFFS:
            run_tradeoff(args, log)
        elif args.command == "project":
            run_project(args, log)
        elif args.command == "parity":
            run_parity(args, log)
        elif args.command == "pipeline":
            run_pipeline(args, log)
        else:
            run_allreduce(args, [2 if max(args.np) < 2 else max(args.np)], log)
            run_scaling(args, log)
    except RuntimeError as e:
        print(f"ringtrain-bench: {e}", file=sys.stderr)
        return 1
    checked = publish("project-check" if getattr(args, "check", None) else args.command, args.out, args.expect)
    print(expectations.markdown(checked), end="", flush=True)
    print(f"ringtrain-bench: {args.command} done in {time.time() - start:.0f} s; results in {args.out} "
          f"(open {os.path.join(args.out, 'report.html')} in a browser)", file=sys.stderr)
    broken = expectations.failed(checked)
    if broken:
        print(f"ringtrain-bench: {broken}", file=sys.stderr)
        return 1
    return 0


def main(argv=None):
    return run_cli("ringtrain-bench", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
