"""N single-rank trainers at once, with no launcher and nothing exchanged:

    python -m ringtrain.bench.independent --np 2 --summary-json S.json -- ringtrain --model mnist_cnn ...

The machine's own ceiling for N worker processes: what any N-worker mode
could reach if communication cost nothing. The trainers start their timed
steps at different moments, so the combined rate counts only the timed windows
during which all of them were running.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

from ringtrain.multihost import procs
from ringtrain.workloads.summary import emit, measured_throughput


def combine(summaries):
    """One throughput summary from single-rank trainers' summaries. Unlike a
    launcher's ranks, these trainers do not start in step: the rate counts only
    the timed windows that fall where all of them were running at once."""
    spans = [s["window_spans_unix"][0] for s in summaries]  # [[start, end, samples], ...] each
    reports = [{"samples": s["timed_samples"], "seconds": s["timed_seconds"],
                "windows": s["window_images_per_sec"][0], "step_time_sec": s["step_time_sec"][0],
                "window_spans_unix": w,
                **{key: (s.get(key) or [None])[0] for key in ("cpu_pct_of_core", "step_time_p50_sec",
                                                             "step_time_p99_sec", "step_time_quantiles_sec")}}
               for s, w in zip(summaries, spans)]
    result = measured_throughput(reports)
    lo, hi = max(w[0][0] for w in spans), min(w[-1][1] for w in spans)
    whole = max(w[-1][1] for w in spans) - min(w[0][0] for w in spans)
    inside = [[(end - start, samples) for start, end, samples in w if start >= lo and end <= hi]
              for w in spans]
    if all(inside):
        # each trainer's rate while all ran, summed
        result["images_per_sec"] = sum(sum(n for _, n in ws) / sum(t for t, _ in ws) for ws in inside)
    else:  # they hardly overlapped: all timed images over the joint wall-clock span
        result["images_per_sec"] = result["timed_samples"] / whole
    result["overlap_fraction"] = max(hi - lo, 0.0) / whole if whole > 0 else 0.0
    return result


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ringtrain.bench.independent")
    p.add_argument("--np", type=int, required=True)
    p.add_argument("--summary-json", required=True)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the trainer and its flags")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    parts = [f"{args.summary_json}.worker{i}" for i in range(args.np)]
    # Each trainer is a singleton MPI job whose daemon makes its session folder under
    # orte_tmpdir_base. Started together, or as the launcher's job before them cleans up its
    # own, they raced for the shared ompi.HOST.UID folder ("mkdir ... File exists", the
    # trainer's exit 1): each gets a base of its own.
    sessions = tempfile.mkdtemp(prefix="ringtrain-independent-",
                                dir=os.environ.get("OMPI_MCA_orte_tmpdir_base") or None)
    trainers = []
    try:
        for i, part in enumerate(parts):
            base = os.path.join(sessions, str(i))
            os.mkdir(base)
            trainers.append(procs.Process(command + ["--summary-json", part], env={"OMPI_MCA_orte_tmpdir_base": base}))
        codes = [trainer.wait() for trainer in trainers]
    finally:
        procs.stop_all(trainers)
        shutil.rmtree(sessions, ignore_errors=True)
    if any(codes):
        print(f"bench.independent: worker exit codes {codes}", file=sys.stderr)
        return 1
    summaries = []
    for part in parts:
        with open(part) as f:
            summaries.append(json.load(f))
        os.remove(part)
    emit({"mode": "independent", "world_size": args.np, "steps": summaries[0]["steps"],
          "train_loss": None, "test_accuracy": None, **combine(summaries)}, args.summary_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
