"""Fixed-column Markdown tables and CSV, the nccl-tests way: one row per
measurement, the same columns every time, each defined in bench/COLUMNS.md."""
import csv
import io
import json
import os


def markdown(columns, rows):
    """columns: list of (key, header); rows: dicts of already-formatted text.
    Cells are padded so that the raw text lines up too."""
    cells = [[str(r.get(key, "")) for key, _ in columns] for r in rows]
    headers = [h for _, h in columns]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(headers)]
    line = lambda vals: "| " + " | ".join(v.rjust(w) for v, w in zip(vals, widths)) + " |"
    rule = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(headers), rule] + [line(c) for c in cells]) + "\n"


def csv_text(keys, rows):
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=keys, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: r.get(k) for k in keys})
    return out.getvalue()


def fmt(value, digits=2):
    if value is None:
        return "n/a"
    if isinstance(value, float) and value != value:
        return "n/a"
    return f"{value:,.{digits}f}"


def human_bytes(n):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f}M"
    return str(n)


def parse_size(text):
    """'4K' -> 4096, '256M' -> 268435456, '4800000' -> 4800000."""
    from ringtrain.common.errors import UsageError
    t = text.strip().upper().rstrip("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        value = int(float(t[:-1] if scale > 1 else t) * scale)
    except ValueError:
        raise UsageError(f"size {text!r} is not a byte count: write e.g. 4K, 1M, 4800000")
    if value < 4:
        raise UsageError(f"size {text!r} is under one float32: give at least 4 bytes")
    return value - value % 4


def parse_sizes(text, factor=4):
    """'4K..256M' -> 4K, 16K, ... 256M (x factor); '1M,4M' -> a list."""
    from ringtrain.common.errors import UsageError
    if ".." in text:
        lo, hi = (parse_size(t) for t in text.split("..", 1))
        if hi < lo:
            raise UsageError(f"--sizes {text}: the range runs low..high, e.g. 4K..256M")
        sizes, s = [], lo
        while s <= hi:
            sizes.append(s)
            s *= factor
        return sizes
    return [parse_size(t) for t in text.split(",") if t.strip()]


def read_result(path, flag, hint):
    """A bench's JSON result that a flag names, or a one-line error that names
    the flag, the file and what to give instead."""
    from ringtrain.common.errors import UsageError
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"{flag} {path}: cannot read it ({e}): give {hint}") from None


def write_report(out_dir, stem, text, csv_keys, result):
    """OUT/STEM.md (text), .csv (result's rows, csv_keys) and .json (all of result)."""
    from ringtrain.workloads.summary import dumps
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out_dir, f"{stem}.csv"), "w") as f:
        f.write(csv_text(csv_keys, result["rows"]))
    with open(os.path.join(out_dir, f"{stem}.json"), "w") as f:
        f.write(dumps(result, indent=1, sort_keys=True))
    return text


def report(title, findings, columns, rows, notes, method, method_heading="How it was measured"):
    """A bench report's Markdown, in the order a reader wants it: the title, the
    findings (one sentence each), the table, notes, and how it was measured."""
    return (f"# {title}\n\n" + findings_markdown(findings) + markdown(columns, rows) + notes
            + f"\n{method_heading}: " + method)


def findings_markdown(sentences):
    """A report's findings, one sentence each, as a Markdown list under its title."""
    return "".join(f"- {sentence}\n" for sentence in sentences) + "\n" if sentences else ""


def join(words):
    """`a`, `a and b`, `a, b and c`."""
    words = list(words)
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)


def share(fraction):
    """A fraction as a percentage in a sentence: `76 %`, `5.3 %`, `0.3 %`."""
    value = 100 * fraction
    return f"{value:.0f} %" if value >= 10 else f"{value:.1f} %"
