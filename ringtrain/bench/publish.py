"""What every bench command does after its runs: check the user's --expect
lines against the rows it measured, and put its findings, tables, plots,
column definitions and the machine it ran on into one `report.html`, with
`plots.json` beside it: every plot of the page, and the data series each
holds (a plot with none is not drawn, and the page says why)."""
import importlib
import json
import os

from ringtrain.bench import expectations, html_report

# command: (the reports it writes, the COLUMNS.md sections that define their columns)
REPORTS = {
    "allreduce": (("allreduce",), ("Allreduce bench",)),
    "scaling": (("scaling",), ("Scaling bench", "Simulated accelerator", "Across hosts")),
    "report": (("allreduce", "scaling"), ("Allreduce bench", "Scaling bench", "Simulated accelerator")),
    "straggler": (("straggler",), ("Straggler bench", "Simulated accelerator")),
    "convergence": (("convergence",), ("Convergence bench",)),
    "project": (("project",), ("Projection",)),
    "project-check": (("project-check",), ("Projection",)),
    "parity": (("parity",), ("Parity bench",)),
    "pipeline": (("pipeline",), ("Pipeline bench",)),
}
# report: the module that writes it (its title, findings, table and notes)
WRITERS = {"allreduce": "allreduce", "scaling": "scaling_report", "straggler": "straggler",
           "convergence": "convergence", "project": "project", "project-check": "project_check", "parity": "parity",
           "pipeline": "pipeline"}
TOGETHER = ("scaling",)  # reports whose title and findings read every link rate's result at once


def writer(stem):
    return importlib.import_module(f"ringtrain.bench.{WRITERS[stem]}")


def results(out_dir, stem):
    """[(result, its folder)] of OUT/STEM.json: one, or one per link rate (--cluster)."""
    with open(os.path.join(out_dir, f"{stem}.json")) as f:
        data = json.load(f)
    if stem not in TOGETHER or not data.get("links"):  # (project-check's "links" are its fits, not results)
        return [(data, out_dir)]
    from ringtrain.bench.scaling import link_folder
    return [(r, os.path.join(out_dir, link_folder(r["site"]["link_rate"], r["site"].get("dilation") or 1)))
            for r in data["links"]]


def publish(command, out_dir, expected, command_line=None):
    """Checks `expected` (Expectation list) against every row this command
    measured, writes OUT/report.html and OUT/plots.json, and returns the checks."""
    stems, sections = REPORTS[command]
    parts = [(stem, results(out_dir, stem)) for stem in stems]
    runs = [result for _, found in parts for result, _ in found]
    checked = expectations.check(expected, [row for result in runs for row in result.get("rows", [])])
    plots = plot_records(out_dir, parts)
    page = html_report.Page(
        title=page_title(command, parts), command=command_line or html_report.command_line(),
        findings=[sentence for stem, found in parts for sentence in findings(stem, [r for r, _ in found])],
        tables=tables_of(parts), plots=plots, notes=notes(parts), column_sections=sections, result=runs[-1],
        site=site_of(runs[-1]), expectations=checked)
    html_report.write(out_dir, page)
    with open(os.path.join(out_dir, "plots.json"), "w") as f:
        json.dump({"plots": [{k: v for k, v in p.items() if k != "path"} for p in plots]}, f, indent=1)
        f.write("\n")
    return checked


def page_title(command, parts):
    if command == "report":
        return writer("scaling").title([r for r, _ in dict(parts)["scaling"]], lead="Allreduce bandwidth, and scaling of")
    stem, found = parts[0]
    return writer(stem).title([r for r, _ in found] if stem in TOGETHER else found[-1][0])


def findings(stem, found):
    module = writer(stem)
    if stem in TOGETHER:
        return module.finding_sentences(found)
    return [sentence for result in found for sentence in module.finding_sentences(result)]


def tables_of(parts):
    """One table per report: the rows of every link rate together (a column says which)."""
    out = []
    for stem, found in parts:
        module = writer(stem)
        caption = {"allreduce": "Allreduce", "scaling": "Scaling"}.get(stem, "") if len(parts) > 1 else ""
        # (a report whose columns depend on how it ran, as parity's --recipe, says which)
        columns, main = (module.columns_of(found[0][0]) if hasattr(module, "columns_of")
                         else (module.COLUMNS, module.MAIN_COLUMNS))
        out.append(html_report.Table(caption, columns, main,
                                     [row for result, _ in found for row in module.table_rows(result)]))
    return out


def notes(parts):
    """What follows each report's table, and how it was measured, link by link."""
    text = ""
    for stem, found in parts:
        module = writer(stem)
        for result, _ in found:
            heading = section_heading(stem, result, len(parts) > 1 or len(found) > 1)
            method = getattr(module, "METHOD", "How it was measured")
            text += f"{heading}{module.notes(result)}\n**{method}.** {module.method(result)}\n"
    return text


def section_heading(stem, result, several):
    if not several:
        return ""
    link = (result.get("site") or {}).get("link_rate")
    return f"\n### {stem.capitalize()}" + (f", {link_label(result)}" if link else "") + "\n"


def link_label(result):
    site = result.get("site") or {}
    dilation = site.get("dilation") or 1
    return site["link_rate"] + (f" (÷{dilation:g})" if dilation != 1 else "")


def site_of(result):
    site = result.get("site")
    if isinstance(site, dict):
        return site.get("label") or "this machine"
    return (result.get("config") or {}).get("site") or site or "this machine"


def plot_records(out_dir, parts):
    """Every plot record of the runs shown (STEM_plots.json beside their plots), with its path and caption."""
    out = []
    for stem, found in parts:
        for result, folder in found:
            index = os.path.join(folder, f"{stem}_plots.json")
            if not os.path.exists(index):
                continue
            with open(index) as f:
                for record in json.load(f)["plots"]:
                    path = os.path.join(folder, record["file"])
                    caption = record["title"] + (f", {link_label(result)}" if len(found) > 1 else "")
                    out.append(dict(record, path=path, file=os.path.relpath(path, out_dir), caption=caption))
    return out
