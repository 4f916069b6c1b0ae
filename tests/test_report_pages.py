"""Every bench command's report.html reads well at first look: what ran (the
command, in one line) and what it found open the page, on the first screen;
the page is no wider than a 1366-px screen and neither is its main table,
which leaves out the columns that are n/a in every row (the CSV and JSON
keep them); every plot it draws holds data, and a plot with none is not
drawn, with one line that says why.

The pages are built from results that real runs recorded
(tests/data/bench-results, small runs on a 2-core VM), by the same
functions the commands call after their runs: no training here."""
import csv
import json
import os

import pytest

from helpers import REPO
from pages import assert_plots_match_their_json, assert_reads_at_first_look, measure
from ringtrain.bench import publish

RECORDED = os.path.join(REPO, "tests", "data", "bench-results")
# page: (command, {report stem: recorded result}, the command line that recorded it)
PAGES = {
    "allreduce": ("allreduce", {"allreduce": "allreduce.json"}),
    "scaling": ("scaling", {"scaling": "scaling.json"}),
    "scaling-across-hosts": ("scaling", {"scaling": "scaling-10gbit-dilated10.json"}),
    "report": ("report", {"allreduce": "report-allreduce.json", "scaling": "report-scaling.json"}),
    "straggler": ("straggler", {"straggler": "straggler.json"}),
    "convergence": ("convergence", {"convergence": "convergence.json"}),
    "project": ("project", {"project": "project.json"}),
    "project-check": ("project-check", {"project-check": "project-check.json"}),
    "parity": ("parity", {"parity": "parity.json"}),
}


def recorded(name):
    with open(os.path.join(RECORDED, name)) as f:
        return json.load(f)


def build(page, folder):
    """The page's report, as its command writes it after its runs."""
    command, stems = PAGES[page]
    folder.mkdir()
    for stem, name in stems.items():
        result = recorded(name)
        if stem == "scaling" and result["site"].get("link_rate"):  # a --cluster run: one folder per link rate, one report over them
            from ringtrain.bench import scaling, scaling_report
            link = folder / scaling.link_folder(result["site"]["link_rate"], result["site"]["dilation"])
            link.mkdir()
            scaling_report.write(result, str(link))
            scaling_report.write_links(str(folder))
        else:
            publish.writer(stem).write(result, str(folder))
    publish.publish(command, str(folder), [], command_line=recorded("commands.json")[page])
    return folder / "report.html"


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """{page: (its folder, what Chromium measured)} of every page, built and laid out once."""
    root = tmp_path_factory.mktemp("pages")
    built = {page: build(page, root / page) for page in PAGES}
    found = measure(list(built.values()), root)
    return {page: (path.parent, found[path]) for page, path in built.items()}


@pytest.mark.slow
@pytest.mark.parametrize("page", list(PAGES))
def test_the_page_opens_with_the_command_and_its_findings_and_fits_a_laptop_screen(measured, page):
    folder, m = measured[page]
    assert_reads_at_first_look(m)
    assert m["ran"] == recorded("commands.json")[page]


@pytest.mark.slow
@pytest.mark.parametrize("page", list(PAGES))
def test_every_drawn_plot_holds_a_data_series_and_an_empty_one_says_why(measured, page):
    folder, m = measured[page]
    assert_plots_match_their_json(m, folder)


@pytest.mark.slow
def test_a_run_without_n_1_draws_no_efficiency_plot_and_shows_no_column_that_is_n_a_in_every_row(measured):
    folder, m = measured["scaling-across-hosts"]
    plots = {p["title"]: p for p in json.loads((folder / "plots.json").read_text())["plots"]}
    assert not plots["Scaling efficiency against N"]["drawn"]
    assert "add 1 to --np" in plots["Scaling efficiency against N"]["why_not_drawn"]
    assert plots["Total throughput against N"]["drawn"]
    [table] = m["mainTables"]
    assert "total img/s" in table["headers"] and "efficiency" not in table["headers"]
    # the CSV and the JSON keep every column, n/a or not
    with open(next(folder.glob("*/scaling.csv"))) as f:
        assert "efficiency" in next(csv.reader(f))
    assert "Horovod's ring (ring) trained" in " ".join(m["findings"])


@pytest.mark.slow
def test_the_title_says_what_ran(measured):
    titles = {page: m["title"] for page, (_, m) in measured.items()}
    assert titles["scaling-across-hosts"] == ("Scaling of ring and tf-collective: resnet50 on 2 simulated hosts, "
                                              "10gbit (÷10) links")
    assert "PS" not in titles["scaling-across-hosts"]
    assert titles["scaling"].startswith("Scaling of ring, tf-collective and ps-sync: mnist_cnn on this machine")


def test_a_plot_with_no_data_series_is_not_drawn_and_an_older_one_is_removed(tmp_path):
    from ringtrain.bench import plots
    old = tmp_path / "scaling_efficiency.png"
    old.write_bytes(b"an older run's plot")
    rows = [{"mode": "ring", "workers": 2, "num_ps": 0, "total_images_per_sec": 100.0, "efficiency": None,
             "predicted_efficiency": None}]
    throughput, efficiency = plots.scaling_plots(rows, str(tmp_path / "scaling_throughput.png"), str(old))
    assert throughput["drawn"] and throughput["series"] == [{"label": "ring measured", "points": 1}]
    assert not efficiency["drawn"] and not old.exists()
    assert efficiency["why_not_drawn"] == "efficiency needs an N = 1 row of the same mode: add 1 to --np"


def test_the_pages_table_leaves_out_columns_n_a_in_every_row_and_says_constant_ones_once():
    from ringtrain.bench.html_report import Table, page_columns
    columns = [("mode", "mode"), ("n", "N"), ("eff", "efficiency"), ("ci", "per-worker"), ("link", "link")]
    rows = [{"mode": "ring", "n": "2", "eff": "n/a", "ci": "n/a ± n/a", "link": "1gbit"},
            {"mode": "ring", "n": "4", "eff": "n/a", "ci": "120 ± n/a", "link": "1gbit"}]
    shown, constant, empty = page_columns(Table("", columns, ["mode", "n", "eff", "ci", "link"], rows))
    assert shown == ["mode", "n", "ci"] and constant == ["link"] and empty == ["eff"]


@pytest.mark.slow
def test_no_page_names_an_issue_or_a_verdict_of_ours(measured):
    import re
    for page, (folder, _) in measured.items():
        text = (folder / "report.html").read_text()
        assert not re.search(r"\bissues? #?\d+|\bseeds?\b", text, re.I), page
        assert not re.search(r"\b(PASS|FAIL)(ED)?\b", text), page
