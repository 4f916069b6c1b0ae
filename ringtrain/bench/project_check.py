"""`ringtrain-bench project --check RUN/scaling.json --fit-up-to K`: the
projection's model, fitted on a run's rows of at most K ranks only, against
the same run's measured rows of more: how far it can be trusted past what
was measured.

The links are fitted again from the run's own allreduce timings
(link-fit/allreduce.json) at N <= K, and every row is predicted with the
scaling bench's α-β step (bench/scaling_rows.py), each mode with its own
all-reduce's fit, as the projection does.

On a simulated cluster every host's traffic costs the same few cores of one
machine (the kernel forwards each byte between namespaces, and every rank
copies it), which no host of a real cluster shares with another. There the
check also fits that cost: the ring rows' step time that α-β leaves
unexplained at N <= K, per byte the hosts send per step (kappa, through the
origin), and adds kappa times each row's bytes on the wire. Both errors are
reported, without and with it; `project` itself never uses kappa.
"""
import glob
import json
import os

from ringtrain.bench import stats, tables
from ringtrain.bench.scaling import LINK_FIT_IMPLS, link_folder
from ringtrain.bench.scaling_report import link_text
from ringtrain.bench import bench_modes
from ringtrain.bench.scaling_rows import build, error_pct
from ringtrain.common.errors import UsageError
from ringtrain.workloads.numbers import median, percent

COLUMNS = [("link", "link"), ("mode", "mode"), ("n", "N (PS)"), ("measured", "measured step ms"),
           ("alpha_beta", "α-β step ms"), ("error", "α-β error"), ("with_cpu", "with shared cores ms"),
           ("error_cpu", "error with shared cores")]
CSV_KEYS = ["link_rate", "time_dilation", "mode", "workers", "num_ps", "step_time_ms", "predicted_step_time_ms",
            "error_pct", "shared_cores_ms", "predicted_with_shared_cores_ms", "error_with_shared_cores_pct"]


def check(path, fit_up_to):
    """{"rows": [...], "links": [per link: its fits and kappa]} for every link of the run at `path`."""
    out = {"source": path, "fit_up_to": fit_up_to, "rows": [], "links": []}
    for result, folder in per_link(path):
        out.update(model=result["config"].get("model"), site=result.get("site"))  # for the report's title
        rows, facts = check_link(result, folder, fit_up_to)
        out["rows"] += rows
        out["links"].append(facts)
    if not out["rows"]:
        raise UsageError(f"--check {path}: no row with more than {fit_up_to} workers to check: give a run with "
                         f"a larger --np, or a smaller --fit-up-to")
    return out


def per_link(path):
    """[(one link's scaling result, its folder)] of a scaling.json: one link's, or
    the report of several (`--cluster ... --link-rate R1,R2`)."""
    result = tables.read_result(path, "--check", "the scaling.json of a run across hosts")
    if "links" in result:
        top = os.path.dirname(os.path.abspath(path))
        return [(r, os.path.join(top, link_folder(r["site"]["link_rate"], r["site"].get("dilation") or 1)))
                for r in result["links"]]
    if not (result.get("site") or {}).get("across_hosts"):
        raise UsageError(f"--check {path}: that run was on one machine: give the scaling.json of a run across "
                         "hosts (--hostfile or --cluster)")
    return [(result, os.path.dirname(os.path.abspath(path)))]


def fits_up_to(folder, k):
    """{"ring", "gloo", "tf": α-β fit} from the run's own allreduce timings at 2..k
    ranks (None where the link fit has none: Gloo's before 2026-11-28)."""
    try:
        with open(os.path.join(folder, "link-fit", "allreduce.json")) as f:
            timings = json.load(f)["rows"]
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"--check: {folder} has no link fit to refit ({e}): give a run across hosts that "
                         "ringtrain-bench scaling wrote") from None
    fits = {}
    for family, impl in LINK_FIT_IMPLS.items():
        points = [(r["bytes"], r["world_size"], median(r["trial_seconds"])) for r in timings
                  if r["impl"] == impl and r["world_size"] <= k]
        fits[family] = stats.fit_lines(points)
    if not fits["ring"]:
        raise UsageError(f"--check: {folder}'s link fit has no ring timings at 2..{k} ranks: use a larger "
                         "--fit-up-to")
    return fits


def summaries_of(result, folder):
    """{(mode, N, P): [each round's summary]} of the run, from its runs/ folder."""
    out = {}
    for r in result["rows"]:
        tag = f"{r['mode']}-n{r['workers']}" + (f"-p{r['num_ps']}" if r["num_ps"] else "")
        paths = sorted(glob.glob(os.path.join(folder, "runs", f"{tag}-r*.json")))
        runs = []
        for p in paths:
            with open(p) as f:
                runs.append(dict(json.load(f), _summary_json=p))
        if runs:
            out[(r["mode"], r["workers"], r["num_ps"])] = runs
    return out


def check_link(result, folder, k):
    fits = fits_up_to(folder, k)
    cfg = dict(result["config"], cores=result["environment"].get("cores"))
    rows = build(summaries_of(result, folder), cfg, fits["ring"], result.get("alpha_beta_ps"), site=result["site"],
                 environment=result["environment"], tf_fit=fits["tf"], gloo_fit=fits["gloo"])["rows"]
    kappa = shared_cores_cost(rows, k) if result["site"].get("hosts_share_cores") else None
    checked = []
    for r in rows:
        if r["workers"] <= k or r["predicted_step_time_ms"] is None:
            continue
        cpu = kappa * r["wire_bytes_theory"] / 1e6 if kappa is not None and r["wire_bytes_theory"] else None
        with_cpu = r["predicted_step_time_ms"] + cpu if cpu is not None else None
        checked.append({"link_rate": r["link_rate"], "time_dilation": r["time_dilation"], "mode": r["mode"],
                        "workers": r["workers"], "num_ps": r["num_ps"], "step_time_ms": r["step_time_ms"],
                        "predicted_step_time_ms": r["predicted_step_time_ms"],
                        "error_pct": error_pct(r["predicted_step_time_ms"], r["step_time_ms"]), "shared_cores_ms": cpu,
                        "predicted_with_shared_cores_ms": with_cpu,
                        "error_with_shared_cores_pct": error_pct(with_cpu, r["step_time_ms"])})
    facts = {"link_rate": result["site"].get("link_rate"), "time_dilation": result["site"].get("dilation"),
             "ring_fit": fits["ring"], "gloo_fit": fits["gloo"], "tf_fit": fits["tf"],
             "ps_fit": result.get("alpha_beta_ps"),
             "hosts_share_cores": bool(result["site"].get("hosts_share_cores")),
             "kappa_ms_per_mb": kappa}
    return checked, facts


def shared_cores_cost(rows, k):
    """kappa, ms per MB the hosts send per step: least squares through the
    origin of the allreduce rows' unexplained step time (measured − α-β) on
    their bytes on the wire, at 2..k workers: the allreduce rows, whose
    exchange α-β prices on its own links, so what it leaves is what the
    shared cores cost."""
    points = [(r["wire_bytes_theory"] / 1e6, r["step_time_ms"] - r["predicted_step_time_ms"]) for r in rows
              if bench_modes.all_reduces(r["mode"]) and 2 <= r["workers"] <= k and r["wire_bytes_theory"]
              and r["predicted_step_time_ms"] is not None]
    if not points:
        return None
    return max(0.0, sum(x * y for x, y in points) / sum(x * x for x, _ in points))


MAIN_COLUMNS = ["mode", "n", "link", "measured", "alpha_beta", "error", "with_cpu", "error_cpu"]


def title(result):
    modes = tables.join(list(dict.fromkeys(r["mode"] for r in result["rows"])))
    links = tables.join([link_text(link) for link in result["links"]])
    return (f"The projection's model against a measured run: {modes}, {result.get('model') or 'its model'}, "
            f"{links} links, fitted on N ≤ {result['fit_up_to']}")


METHOD = "How it was checked"


def method(result):
    k = result["fit_up_to"]
    text = (f"Run: {result['source']}. The links are fitted again on the run's own allreduce timings at 2..{k} "
            f"ranks; every row's α-β step is the scaling bench's, with that fit (bench/COLUMNS.md, "
            f"section Projection).\n\n")
    for link in result["links"]:
        ring, gloo, tf = link["ring_fit"], link.get("gloo_fit"), link["tf_fit"]
        text += (f"- {link_text(link)}: ring α = {ring['alpha_sec'] * 1e6:.1f} us, "
                 f"1/β = {(ring['bandwidth_gb_per_sec'] or 0) * 1e3:.1f} MB/s"
                 + (f"; Horovod over Gloo α = {gloo['alpha_sec'] * 1e6:.1f} us, "
                    f"1/β = {(gloo['bandwidth_gb_per_sec'] or 0) * 1e3:.1f} MB/s" if gloo else "")
                 + (f"; TF's ring 1/β = {(tf['bandwidth_gb_per_sec'] or 0) * 1e3:.1f} MB/s" if tf else "")
                 + (f"; the shared cores cost {link['kappa_ms_per_mb']:.3f} ms per MB the hosts send per step"
                    if link["kappa_ms_per_mb"] is not None else "; hosts with cores of their own") + "\n")
    return text


def table_rows(result):
    return [{"link": link_text(r), "mode": r["mode"],
             "n": f"{r['workers']} ({r['num_ps']})" if r["num_ps"] else str(r["workers"]),
             "measured": tables.fmt(r["step_time_ms"], 1), "alpha_beta": tables.fmt(r["predicted_step_time_ms"], 1),
             "error": percent(r["error_pct"], signed=True),
             "with_cpu": tables.fmt(r["predicted_with_shared_cores_ms"], 1),
             "error_cpu": percent(r["error_with_shared_cores_pct"], signed=True)} for r in result["rows"]]


def notes(result):
    return ""


def markdown(result):
    return tables.report(title(result), finding_sentences(result), COLUMNS, table_rows(result), "", method(result),
                         METHOD)


def finding_sentences(result):
    """How far the model, fitted on N <= K, was from each measured row past K."""
    out = []
    for r in result["rows"]:
        if r["error_pct"] is None:
            continue
        text = (f"Fitted on N ≤ {result['fit_up_to']}, the model put {r['mode']}"
                + (f" with {r['num_ps']} PS" if r["num_ps"] else "") + f" at N = {r['workers']} on "
                f"{link_text(r)} at {r['predicted_step_time_ms']:,.1f} ms a step, {r['error_pct']:+.0f} % off the "
                f"measured {r['step_time_ms']:,.1f} ms")
        if r["error_with_shared_cores_pct"] is not None:
            text += f" ({r['error_with_shared_cores_pct']:+.0f} % with the shared cores' cost)"
        out.append(text + ".")
    return out


def write(result, out_dir):
    from ringtrain.bench import plots
    plots.write_index(out_dir, "project-check", [])  # no plot of its own
    return tables.write_report(out_dir, "project-check", markdown(result), CSV_KEYS, result)
