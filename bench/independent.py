"""N single-rank trainers at once, with no launcher and nothing exchanged:

    python -m bench.independent --np 2 --summary-json S.json -- ringtrain --model mnist_cnn ...

The machine's own ceiling for N worker processes: what any N-worker mode
could reach if communication cost nothing. The combined summary is measured
the same way as the launchers' (all timed images / the slowest worker's timed
seconds).
"""
import argparse
import json
import os
import subprocess
import sys

from workloads.summary import emit, measured_throughput


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.independent")
    p.add_argument("--np", type=int, required=True)
    p.add_argument("--summary-json", required=True)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the trainer and its flags")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    parts = [f"{args.summary_json}.worker{i}" for i in range(args.np)]
    procs = [subprocess.Popen(command + ["--summary-json", part]) for part in parts]
    # the caller (bench.launch.run) ends this whole process group on timeout
    codes = [proc.wait() for proc in procs]
    if any(codes):
        print(f"bench.independent: worker exit codes {codes}", file=sys.stderr)
        return 1
    summaries = []
    for part in parts:
        with open(part) as f:
            summaries.append(json.load(f))
        os.remove(part)
    reports = [{"samples": s["timed_samples"], "seconds": s["timed_seconds"],
                "windows": s["window_images_per_sec"][0], "step_time_sec": s["step_time_sec"][0]}
               for s in summaries]
    emit({"mode": "independent", "world_size": args.np, "steps": summaries[0]["steps"],
          "train_loss": None, "test_accuracy": None, **measured_throughput(reports)},
         args.summary_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
