"""`report.html`: every bench run on one page, to open in a browser with no
server and no network: its tables, its plots (inline, as data), the
definitions of its columns, the machine it ran on and the command that made
it."""
import base64
import html
import os
import shlex
import subprocess
import sys
import time

from ringtrain.bench.launch import REPO

COLUMNS_DOC = os.path.join(REPO, "bench", "COLUMNS.md")
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1400px; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.85em; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.5em; text-align: right; vertical-align: top; }
th { background: #eef2f7; } tr:nth-child(even) td { background: #fafafa; }
td:first-child, th:first-child { text-align: left; }
.columns td, .columns th, .environment td, .environment th { text-align: left; }
figure { display: inline-block; margin: 0.5em 1em 0.5em 0; } figure img { max-width: 640px; border: 1px solid #ddd; }
figcaption { font-size: 0.85em; color: #555; } code { background: #f3f3f3; padding: 0 0.2em; }
.command { background: #f3f3f3; padding: 0.6em; font-family: monospace; white-space: pre-wrap; }
"""


def write(out_dir, title, markdown_text, plots, result, column_sections):
    """OUT/report.html from the run's Markdown report, its PNG plots
    ([(caption, path)]), its result (for the environment) and the headings of
    COLUMNS.md that define its columns. Returns the path."""
    import markdown
    body = markdown.markdown(markdown_text, extensions=["tables"])
    figures = "".join(f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,'
                      f'{base64.b64encode(open(path, "rb").read()).decode()}"><figcaption>'
                      f"{html.escape(caption)}</figcaption></figure>"
                      for caption, path in plots if os.path.exists(path))
    columns = markdown.markdown(column_definitions(column_sections), extensions=["tables"])
    columns = columns.replace("<table>", '<table class="columns">')
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{STYLE}</style></head>
<body>
<p>ringtrain-bench, {time.strftime("%Y-%m-%d %H:%M %Z")}</p>
{body}
<h2>Plots</h2>
{figures or "<p>(no plot)</p>"}
<h2>What every column means</h2>
{columns}
<h2>Where it ran</h2>
{environment_table(result)}
<h2>The command</h2>
<div class="command">{html.escape(command_line())}</div>
</body></html>
"""
    path = os.path.join(out_dir, "report.html")
    with open(path, "w") as f:
        f.write(page)
    return path


def column_definitions(sections):
    """The sections of COLUMNS.md whose headings start with any of `sections`."""
    with open(COLUMNS_DOC) as f:
        text = f.read()
    parts = text.split("\n## ")
    chosen = [part for part in parts[1:] if part.startswith(tuple(sections))]
    return "\n".join("### " + part for part in chosen)


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
    return f'<table class="environment">{rows}</table>'


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
