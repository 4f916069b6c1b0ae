"""`report.html`: every bench run on one page, to open in a browser with no
server and no network. It opens with what ran (the command, in one line)
and what the run found, one sentence a finding; then the table, narrowed to
the columns that hold a value, most telling first (the full table is one
click away); the plots (inline, as data) that have something to show; the
notes, the definitions of the columns and the machine it ran on."""
import base64
import html
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field

from ringtrain.bench.launch import REPO

COLUMNS_DOC = os.path.join(REPO, "bench", "COLUMNS.md")
STYLE = """
body { font-family: system-ui, sans-serif; margin: 0; color: #222; line-height: 1.45; background: #fff; }
main { max-width: 1240px; margin: 0 auto; padding: 1.2em 2.5em 3em; }
p, li, dd, .note, .not-drawn { max-width: 78ch; }
h1 { font-size: 1.45em; line-height: 1.25; margin: 0.3em 0 0.5em; }
h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.05em; margin-top: 1.4em; }
.ran { font-family: ui-monospace, monospace; font-size: 0.9em; background: #f3f3f3; padding: 0.5em 0.7em;
       white-space: pre-wrap; overflow-wrap: anywhere; max-width: none; }
.meta, .note, .not-drawn, figcaption { color: #555; font-size: 0.9em; } .meta { max-width: none; }
#findings ul { padding-left: 1.3em; } #findings li { margin: 0.3em 0; }
.table-box { overflow-x: auto; max-width: 100%; margin: 0.6em 0; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.5em; text-align: right; vertical-align: top; }
th { background: #eef2f7; } th[title] { text-decoration: underline dotted #888; cursor: help; }
tr:nth-child(even) td { background: #fafafa; }
td:first-child, th:first-child { text-align: left; }
.columns td, .columns th, .environment td, .environment th { text-align: left; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(440px, 1fr)); gap: 1em; }
figure { margin: 0; } figure img { width: 100%; height: auto; border: 1px solid #ddd; }
details { margin: 0.6em 0; } summary { cursor: pointer; color: #1a4f9c; }
code { background: #f3f3f3; padding: 0 0.2em; }
"""


@dataclass
class Table:
    """One result table: COLUMNS (key, header), the page's columns (keys, most telling first) and its rows."""
    caption: str
    columns: list
    main: list
    rows: list


@dataclass
class Page:
    title: str
    command: str
    findings: list                      # sentences
    tables: list                        # [Table]
    plots: list                         # plot records (bench/plots.py) with "path" and "caption"
    notes: str                          # Markdown: what follows the tables
    column_sections: tuple              # COLUMNS.md headings that define the columns
    result: dict                        # for the machine it ran on
    site: str = "this machine"
    expectations: list = field(default_factory=list)


def write(out_dir, page):
    """OUT/report.html of a Page. Returns the path."""
    import markdown
    definitions = column_definitions(page.column_sections)
    columns = boxed(markdown.markdown(definitions, extensions=["tables"])).replace("<table>", '<table class="columns">')
    body = "\n".join([
        f"<h1>{html.escape(page.title)}</h1>",
        f'<p class="ran" title="the command that made this report">{html.escape(page.command)}</p>',
        f'<p class="meta">{time.strftime("%Y-%m-%d %H:%M %Z")} · {html.escape(page.site)} · commit '
        f"{html.escape(commit())}</p>",
        findings_section(page.findings),
        expectations_section(page.expectations),
        "<h2>Results</h2>", *[table_section(t, header_definitions(definitions)) for t in page.tables],
        plots_section(page.plots),
        "<h2>Notes</h2>", boxed(markdown.markdown(page.notes, extensions=["tables"])),
        f"<h2>What every column means</h2><details><summary>The definitions, from bench/COLUMNS.md</summary>"
        f"{columns}</details>",
        "<h2>Where it ran</h2>", environment_table(page.result)])
    text = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(page.title)}</title><style>{STYLE}</style></head>
<body><main>
{body}
</main></body></html>
"""
    path = os.path.join(out_dir, "report.html")
    with open(path, "w") as f:
        f.write(text)
    return path


def findings_section(findings):
    items = "".join(f"<li>{html.escape(sentence)}</li>" for sentence in findings) or \
        "<li>No finding: the run has no row to compare.</li>"
    return f'<section id="findings"><h2>Findings</h2><ul>{items}</ul></section>'


def expectations_section(checked):
    if not checked:
        return ""
    columns = [("expectation", "your expectation"), ("measured", "measured"), ("holds", "holds")]
    rows = [dict(c, holds="yes" if c["holds"] else "no") for c in checked]
    return "<h2>Your expectations (--expect)</h2>" + boxed(table_html(columns, rows))


def is_na(cell):
    """A cell that holds no value: blank, or n/a and its separators only (`n/a ± n/a`, `n/a/n/a`)."""
    return re.sub(r"[\s/±()–\-%]", "", str(cell if cell is not None else "").replace("n/a", "")) == ""


def page_columns(table):
    """(shown, constant, left out) of a table's columns: the page's columns that
    hold a value and differ between rows, most telling first; the columns
    that hold one value in every row (said once, above the table); and the
    columns that are n/a in every row."""
    headers = dict(table.columns)
    empty = [key for key, _ in table.columns if all(is_na(r.get(key)) for r in table.rows)]
    constant = [key for key, _ in table.columns if key not in empty and key != table.main[0] and len(table.rows) > 1
                and len({str(r.get(key)) for r in table.rows}) == 1]
    shown = [key for key in table.main if key in headers and key not in empty and key not in constant]
    return shown, constant, empty


def table_section(table, definitions):
    shown, constant, empty = page_columns(table)
    headers = dict(table.columns)
    out = [f"<h3>{html.escape(table.caption)}</h3>" if table.caption else ""]
    if constant:
        out.append('<p class="note">In every row: ' + "; ".join(
            f"{html.escape(headers[k])} <b>{html.escape(str(table.rows[0].get(k)))}</b>" for k in constant) + ".</p>")
    out.append(boxed(table_html([(k, headers[k]) for k in shown], table.rows, definitions), "main"))
    if empty:
        out.append('<p class="note">Not shown, n/a in every row (they stay in the CSV and JSON): '
                   + html.escape(", ".join(headers[k] for k in empty)) + ".</p>")
    if len(shown) < len(table.columns):
        out.append(f"<details><summary>The full table: all {len(table.columns)} columns</summary>"
                   f"{boxed(table_html(table.columns, table.rows, definitions), 'full')}</details>")
    return "\n".join(out)


def table_html(columns, rows, definitions=None):
    definitions = definitions or {}
    head = "".join(f'<th title="{html.escape(definitions[h])}">{html.escape(h)}</th>' if h in definitions else
                   f"<th>{html.escape(h)}</th>" for _, h in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r.get(k, '')))}</td>" for k, _ in columns) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def boxed(text, kind=""):
    """Every table in a box of its own that scrolls sideways, when it must, instead of the page."""
    box = f"table-box {kind}".strip()
    return text.replace("<table", f'<div class="{box}"><table').replace("</table>", "</table></div>")


def plots_section(plots):
    if not plots:
        return ""
    figures = "".join(f'<figure><img alt="{html.escape(p["caption"])}" src="data:image/png;base64,'
                      f'{base64.b64encode(open(p["path"], "rb").read()).decode()}"><figcaption>'
                      f'{html.escape(p["caption"])}</figcaption></figure>' for p in plots if p["drawn"])
    skipped = "".join(f'<p class="not-drawn">Not drawn: {html.escape(p["caption"])}: '
                      f'{html.escape(p["why_not_drawn"])}.</p>' for p in plots if not p["drawn"])
    return "<h2>Plots</h2>" + skipped + (f'<div class="plots">{figures}</div>' if figures else "")


def column_definitions(sections):
    """The sections of COLUMNS.md whose headings start with any of `sections`."""
    with open(COLUMNS_DOC) as f:
        text = f.read()
    parts = text.split("\n## ")
    chosen = [part for part in parts[1:] if part.startswith(tuple(sections))]
    return "\n".join("### " + part for part in chosen)


def header_definitions(markdown_text):
    """{column header: its definition's first sentence} from COLUMNS.md's tables, for the headers' tooltips."""
    out = {}
    for header, definition in re.findall(r"^\| ([^|]+?) \| (.+) \|$", markdown_text, re.M):
        plain = re.sub(r"[`*]", "", definition)
        out.setdefault(header, re.split(r"(?<=[a-z)])\. ", plain, maxsplit=1)[0][:300])
    return out


def environment_table(result):
    env, site, cfg = result.get("environment") or {}, result.get("site") or {}, result.get("config") or {}
    load = lambda key: ", ".join(f"{x:.2f}" for x in env.get(key) or []) or "n/a"
    facts = [("commit", commit()), ("python", env.get("python")), ("platform", env.get("platform")),
             ("cpu", env.get("cpu_model")), ("cores usable", env.get("cores")), ("GPUs", env.get("gpus")),
             ("tensorflow", env.get("tensorflow")), ("horovod", env.get("horovod")), ("mpirun", env.get("mpirun")),
             ("mpi4py", env.get("mpi4py")), ("numpy", env.get("numpy")),
             ("threads per worker", env.get("threads_per_worker")),
             ("hosts", site.get("label") or env.get("hostfile")),
             ("link rate", site.get("link_rate") or cfg.get("link_rate") or "n/a (one machine)"),
             ("time dilation", site.get("dilation") or cfg.get("time_dilation") or 1),
             ("load average at start (1, 5, 15 min)", load("load_average_at_start")),
             ("load average at end (1, 5, 15 min)", load("load_average_at_end")),
             ("Horovod and OpenMPI knobs", ", ".join(f"{k}={v}" for k, v in sorted((env.get("knobs") or {}).items()))
              or "none")]
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                   for k, v in facts if v is not None)
    return f'<div class="table-box"><table class="environment">{rows}</table></div>'


def commit():
    """The checkout's commit (with local changes, if any), or why not known."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no git)"
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    return head.stdout.strip() + (" with local changes" if dirty.stdout.strip() else "")


def command_line():
    return shlex.join(["ringtrain-bench", *sys.argv[1:]])
