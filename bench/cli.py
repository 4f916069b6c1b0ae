"""`ringtrain-bench`: measured ring-versus-PS scaling and allreduce bandwidth."""
import argparse
import os
import sys
import time

from workloads.catalog import MODEL_SPECS
from workloads.errors import UsageError, run_cli
from workloads.flags import OneLineParser, positive_int
from workloads.horovod_env import knob_env

EXAMPLES = """examples:
  ringtrain-bench allreduce --np 2 --sizes 4K..256M --out bench/results
  ringtrain-bench scaling --modes ring,ps-sync,ps-async --np 1,2 --model mnist_cnn --data synthetic --out bench/results
  ringtrain-bench report --out bench/results       # both, as `make bench` runs them (~8 min on 2 cores)

Every column is defined in bench/COLUMNS.md.
"""


def int_list(text):
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers like 1,2,4, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"worker counts must be >= 1, got {text!r}")
    return sorted(set(values))


def mode_list(text):
    from bench.scaling import MODES
    modes = [t.strip() for t in text.split(",") if t.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"unknown mode(s) {', '.join(bad) or text!r}: choose from {','.join(MODES)}")
    return modes


def add_allreduce_flags(p, np_default="2"):
    g = p.add_argument_group("allreduce bench")
    g.add_argument("--sizes", default="4K..256M", metavar="RANGE",
                   help="LO..HI (x4 steps) or a comma list, bytes with K/M/G (default %(default)s); "
                        "the model's gradient size is always added")
    g.add_argument("--trials", type=positive_int, default=5, help="timed trials per size; the median is reported (default 5)")
    g.add_argument("--no-gloo", action="store_true", help="skip the horovodrun --gloo rows")
    g.add_argument("--compare-cycle-time-ms", type=float, metavar="MS",
                   help="also run the Horovod-over-MPI rows with HOROVOD_CYCLE_TIME=MS")


def add_horovod_flags(p):
    g = p.add_argument_group("Horovod knobs (for the Horovod allreduce rows and the ring runs)")
    g.add_argument("--cycle-time-ms", type=float, metavar="MS",
                   help="HOROVOD_CYCLE_TIME / ringtrain --cycle-time-ms (default: Horovod's own, 1 ms)")
    g.add_argument("--fusion-threshold-mb", type=float, metavar="MB",
                   help="HOROVOD_FUSION_THRESHOLD / ringtrain --fusion-threshold-mb (default: 128 MB)")


def add_scaling_flags(p, modes_default, np_default):
    g = p.add_argument_group("scaling bench")
    g.add_argument("--modes", type=mode_list, default=mode_list(modes_default),
                   help=f"comma list of ring (horovodrun, MPI), ring-gloo (horovodrun --gloo), ps-sync, "
                        f"ps-async, independent (N single-rank trainers at once, nothing exchanged: "
                        f"the machine's ceiling) (default {modes_default})")
    g.add_argument("--data", choices=("synthetic", "mnist", "cifar10"), default="synthetic",
                   help="dataset (default %(default)s)")
    g.add_argument("--data-dir", metavar="DIR", help="passed to the trainers")
    g.add_argument("--batch-size", type=positive_int, default=64, metavar="B",
                   help="per-worker batch for weak scaling (default %(default)s)")
    g.add_argument("--scaling", choices=("weak", "strong"), default="weak",
                   help="weak: B per worker, global batch N*B; strong: --global-batch split over N")
    g.add_argument("--global-batch", type=positive_int, metavar="G", help="for --scaling strong")
    g.add_argument("--steps", type=positive_int, default=200, metavar="K",
                   help="steps per run; the first 3 are warm-up and not timed (default %(default)s)")
    g.add_argument("--repeats", type=positive_int, default=1, metavar="R",
                   help="run every configuration R times, in interleaved rounds; the table shows the "
                        "median and the range (default %(default)s)")
    g.add_argument("--num-ps", type=positive_int, default=1, metavar="P", help="PS tasks (default 1)")
    g.add_argument("--threads", type=positive_int, default=1, metavar="T",
                   help="TF threads per worker (default 1)")
    g.add_argument("--alpha-beta", metavar="FILE",
                   help="allreduce.json to fit the α-β model from (default: OUT/allreduce.json if present)")


def add_run_flags(p, np_type, np_default, np_help, timeout, model_help="default %(default)s"):
    """The flags every subcommand has: rank counts, model, output folder, time limit."""
    p.add_argument("--np", type=np_type, default=np_default, help=np_help)
    p.add_argument("--model", default="mnist_cnn", choices=sorted(MODEL_SPECS), help=model_help)
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--timeout", type=float, default=timeout,
                   help=f"seconds per launch (default {timeout:g})")


def parser():
    p = OneLineParser(prog="ringtrain-bench", epilog=EXAMPLES,
                      formatter_class=argparse.RawDescriptionHelpFormatter,
                      description="Measured ring-allreduce versus parameter-server scaling, and "
                                  "allreduce bandwidth as nccl-tests defines it.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    common = dict(formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES)
    a = sub.add_parser("allreduce", help="algbw/busbw of Horovod (MPI, Gloo), MPI_Allreduce, the reference ring",
                       **common)
    add_run_flags(a, positive_int, 2, "ranks (default 2)", timeout=900,
                  model_help="whose gradient size to add (default %(default)s)")
    add_allreduce_flags(a)
    add_horovod_flags(a)
    s = sub.add_parser("scaling", help="ring vs PS throughput, efficiency and step-time split", **common)
    add_run_flags(s, int_list, [1, 2], "worker counts, e.g. 1,2,4 (default 1,2)", timeout=600)
    add_scaling_flags(s, "ring,ps-sync,ps-async", "1,2")
    add_horovod_flags(s)
    r = sub.add_parser("report", help="allreduce bench, then scaling bench (what `make bench` runs)", **common)
    add_run_flags(r, int_list, [1, 2], "scaling worker counts (default 1,2)", timeout=900)
    add_allreduce_flags(r)
    add_scaling_flags(r, "ring,ps-sync,ps-async,independent", "1,2")
    add_horovod_flags(r)
    r.set_defaults(compare_cycle_time_ms=0.1, repeats=2)
    return p


def horovod_env(args):
    return knob_env(args.cycle_time_ms, args.fusion_threshold_mb)


def scaling_config(args):
    from workloads.catalog import model_spec
    model_spec(args.model)
    if args.scaling == "strong" and not args.global_batch:
        raise UsageError("--scaling strong needs --global-batch G (split over N workers)")
    return {"modes": args.modes, "np": args.np, "model": args.model, "data": args.data,
            "data_dir": args.data_dir, "batch_size": args.batch_size, "scaling": args.scaling,
            "global_batch": args.global_batch, "steps": args.steps, "num_ps": args.num_ps,
            "repeats": args.repeats,
            "threads": args.threads, "timeout": args.timeout,
            "cycle_time_ms": args.cycle_time_ms, "fusion_threshold_mb": args.fusion_threshold_mb,
            "alpha_beta_json": args.alpha_beta or os.path.join(args.out, "allreduce.json")}


def run_allreduce(args, np_):
    from bench import allreduce, tables
    from workloads.catalog import model_spec
    model_spec(args.model)
    sizes = tables.parse_sizes(args.sizes)
    result = allreduce.run(np_, sizes, args.out, model=args.model, trials=args.trials,
                           gloo=not args.no_gloo, horovod_env=horovod_env(args), timeout=args.timeout,
                           compare_cycle_ms=args.compare_cycle_time_ms,
                           log=lambda m: print(m, file=sys.stderr, flush=True))
    print(allreduce.markdown(result), flush=True)
    return result


def run_scaling(args):
    from bench import scaling
    result = scaling.run(scaling_config(args), args.out, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(scaling.markdown(result), flush=True)
    return result


def _main(argv):
    args = parser().parse_args(argv)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UsageError(f"--out {args.out} is a file: give a directory")
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    try:
        if args.command == "allreduce":
            run_allreduce(args, args.np)
        elif args.command == "scaling":
            run_scaling(args)
        else:
            run_allreduce(args, 2 if max(args.np) < 2 else max(args.np))
            run_scaling(args)
    except RuntimeError as e:
        print(f"ringtrain-bench: {e}", file=sys.stderr)
        return 1
    print(f"ringtrain-bench: {args.command} done in {time.time() - start:.0f} s; results in {args.out}",
          file=sys.stderr)
    return 0


def main(argv=None):
    return run_cli("ringtrain-bench", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
