"""What the README and the docs tell a user to type works: every command in
their shell blocks exists, and ringtrain's own commands' flags parse with the
commands' real parsers (nothing is run). The README stays under 10 KB, and
the docs build as a site offline."""
import json
import os
import re
import shlex
import shutil
import subprocess

import pytest

from helpers import BIN, REPO

OURS = ("ringtrain", "ps-baseline", "ringtrain-bench", "ringtrain-cluster")
LAUNCHERS = ("horovodrun", "mpirun", "srun", "sbatch", "env", "timeout")
SHELL = {"source", "export", "printf", "cat", "cd", "echo", "sudo", "#!/bin/bash"}


def documents():
    docs = os.path.join(REPO, "docs")
    pages = [os.path.join(docs, name) for name in sorted(os.listdir(docs)) if name.endswith(".md")]
    return [os.path.join(REPO, "README.md")] + pages


def commands(path):
    """(line number, command line) of every line of the ```sh blocks, continuations joined."""
    out, block, pending = [], False, ""
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            if line.startswith("```"):
                block = line.strip() in ("```sh", "```bash")
                continue
            if not block or not line.strip() or line.lstrip().startswith("#"):
                continue
            pending += line.rstrip("\n")
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            out.append((number, pending.strip()))
            pending = ""
    return out


CASES = [(os.path.relpath(path, REPO), number, line) for path in documents() for number, line in commands(path)]


def test_the_readme_is_short():
    assert os.path.getsize(os.path.join(REPO, "README.md")) <= 10 * 1024


def profiles_written(page):
    """The profile files that a page's `ringtrain-bench profile ... --out FILE.json` lines write."""
    out = set()
    for _, line in commands(os.path.join(REPO, page)):
        words = shlex.split(line, comments=True)
        if words[:2] == ["ringtrain-bench", "profile"] and "--out" in words:
            out.add(words[words.index("--out") + 1])
    return out


@pytest.mark.parametrize("page,number,line", CASES, ids=[f"{p}:{n}" for p, n, _ in CASES])
def test_every_command_in_the_docs_exists_and_its_flags_parse(page, number, line, tmp_path, monkeypatch):
    words = shlex.split(line, comments=True)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # NAME=VALUE before the command
        words = words[1:]
    if not words or words[0] in SHELL or words[0].startswith("~/"):
        return
    # a profile that a line before it wrote: a small one stands in for it (flags are read, nothing runs)
    monkeypatch.chdir(tmp_path)
    for name in profiles_written(page):
        with open(name, "w") as f:
            json.dump({"model": "keras:ResNet50", "step_ms": 292, "layers": [["dense", [["kernel", [4, 2]]]]]}, f)
    check(words, f"{page}:{number}: {line}")


def check(words, where):
    program = words[0]
    if program == "make":
        targets = re.findall(r"^([\w-]+):", open(os.path.join(REPO, "Makefile")).read(), re.M)
        assert all(target in targets for target in words[1:]), f"{where}: no such make target"
        return
    if program.startswith(("mpi_hostfiles/", "./")):
        assert os.access(os.path.join(REPO, program), os.X_OK), f"{where}: {program} is not an executable here"
        return
    assert shutil.which(program, path=BIN + os.pathsep + os.environ.get("PATH", "")), f"{where}: no {program}"
    if program == "sbatch" and any(word.endswith(".sbatch") for word in words):
        # one of the repo's batch scripts: its flags go to the command on its `exec` line
        at = next(i for i, word in enumerate(words) if word.endswith(".sbatch"))
        path = os.path.join(REPO, words[at])
        assert os.path.isfile(path), f"{where}: no {words[at]} in the repo"
        runs = shlex.split([line for line in open(path) if line.startswith("exec ")][-1])[1:]
        check([word for word in runs if word != "$@"] + words[at + 1:], where)
        return
    if program in LAUNCHERS:
        inner = next((i for i, word in enumerate(words) if word in OURS or word.endswith(tuple(f"/{o}" for o in OURS))),
                     None)
        if inner is not None:
            check([os.path.basename(words[inner]), *words[inner + 1:]], where)
        return
    if program in OURS:
        parse(program, words[1:], where)


def parse(program, args, where):
    from ringtrain.bench import cli as bench_cli
    from ringtrain import cluster_cli
    from ps_baseline import cli as ps_cli, launcher, towers
    from ringtrain import cli as ring_cli
    if program == "ringtrain" and args[:1] == ["doctor"]:
        from ringtrain import doctor
        parser, args = doctor.parser(), args[1:]
    elif program == "ringtrain":
        parser = ring_cli.parser()
    elif program == "ps-baseline" and args[:1] == ["launch"]:
        parser, args = launcher.launch_parser(), args[1:]
    elif program == "ps-baseline" and args[:1] == ["towers"]:
        parser, args = towers.parser(), args[1:]
    elif program == "ps-baseline":
        parser = ps_cli.task_parser()
    elif program == "ringtrain-bench":
        parser = bench_cli.parser()
    else:
        parser = cluster_cli.parser()
        if "exec" in args and "--" in args:  # the command run on the host is checked too
            check(args[args.index("--") + 1:], where)
            args = args[:args.index("--") + 1]
    try:
        parser.parse_args(args)
    except SystemExit as e:
        pytest.fail(f"{where}: its flags do not parse (exit {e.code})")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_docs_build_offline(tmp_path):
    done = subprocess.run([os.path.join(BIN, "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=100, env=dict(os.environ, NO_PROXY="*"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").exists() and (tmp_path / "site" / "features" / "index.html").exists()
    # ... and they need no network when read: nothing a page loads comes from another site
    # (the theme's highlight.js would, from a CDN: the site highlights with Pygments instead).
    remote = re.compile(r"""<(?:script|link|img|iframe|source)\b[^>]*\b(?:src|href)=["']((?:https?:)?//[^"']+)["']"""
                        r"""|url\(\s*["']?((?:https?:)?//[^)"']+)""", re.I)
    loaded = {}
    for page in (tmp_path / "site").rglob("*"):
        if page.suffix in (".html", ".css"):
            for match in remote.finditer(page.read_text(errors="replace")):
                loaded.setdefault(match.group(1) or match.group(2), page.relative_to(tmp_path / "site").as_posix())
    assert loaded == {}, loaded
    assert 'class="codehilite"' in (tmp_path / "site" / "ring" / "index.html").read_text()


@pytest.mark.parametrize("words", [["ringtrain"], ["ringtrain", "doctor"], ["ps-baseline"], ["ps-baseline", "launch"],
                                   ["ps-baseline", "towers"], ["ringtrain-bench"], ["ringtrain-cluster"]])
def test_every_command_answers_version(words):
    from ringtrain import __version__
    done = subprocess.run([os.path.join(BIN, words[0]), *words[1:], "--version"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"{words[0]} {__version__}", done.stdout + done.stderr


@pytest.mark.parametrize("command,subcommands", [("ringtrain", ["doctor"]), ("ps-baseline", ["launch", "towers"])])
def test_help_names_every_subcommand(command, subcommands):
    done = subprocess.run([os.path.join(BIN, command), "--help"], capture_output=True, text=True, timeout=60)
    head = done.stdout[:done.stdout.index("options:")]  # (before the flags: not only in the examples at the end)
    assert done.returncode == 0 and all(f"{command} {sub}" in head for sub in subcommands), head
