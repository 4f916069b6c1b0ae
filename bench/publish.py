"""What every bench command does after its runs: check the user's --expect
lines against the rows it measured, and put its reports, plots, column
definitions and the machine it ran on into one `report.html`."""
import glob
import json
import os

from ringtrain.bench import expectations, html_report

# command: (the reports it writes, their titles, the COLUMNS.md sections that define their columns)
REPORTS = {
    "allreduce": (("allreduce",), "Allreduce bandwidth", ("Allreduce bench",)),
    "scaling": (("scaling",), "Scaling: ring against PS",
                ("Scaling bench", "Simulated accelerator", "Across hosts")),
    "report": (("allreduce", "scaling"), "Allreduce bandwidth and scaling",
               ("Allreduce bench", "Scaling bench", "Simulated accelerator")),
    "straggler": (("straggler",), "One slow worker: sync against async", ("Straggler bench", "Simulated accelerator")),
    "convergence": (("convergence",), "Time to accuracy: sync against async", ("Convergence bench",)),
    "project": (("project",), "Projected scaling: ring against PS", ("Projection",)),
    "project-check": (("project-check",), "The projection's model against a measured run", ("Projection",)),
    "parity": (("parity",), "Against a plain Horovod script", ("Parity bench",)),
}


def results(out_dir, stem):
    """The run results in OUT/STEM.json: one, or one per link rate (--cluster)."""
    with open(os.path.join(out_dir, f"{stem}.json")) as f:
        data = json.load(f)
    return data.get("links") or [data]


def publish(command, out_dir, expected):
    """Checks `expected` (Expectation list) against every row this command
    measured, writes OUT/report.html, and returns the checks."""
    stems, title, sections = REPORTS[command]
    runs = [result for stem in stems for result in results(out_dir, stem)]
    checked = expectations.check(expected, [row for result in runs for row in result.get("rows", [])])
    text = "\n\n".join(open(os.path.join(out_dir, f"{stem}.md")).read() for stem in stems)
    text += expectations.markdown(checked)
    # --cluster runs keep each link rate's plots in a folder of its own
    plots = [(os.path.relpath(path, out_dir)[:-len(".png")].replace("_", " "), path) for stem in stems
             for path in sorted(glob.glob(os.path.join(out_dir, "**", f"{stem}_*.png"), recursive=True))]
    html_report.write(out_dir, title, text, plots, runs[-1], sections)
    return checked
