"""`--expect 'SELECTOR: FIELD OP NUMBER'`: a line the user draws through a
bench's results, for example

    --expect 'mode=ring,workers=4: efficiency >= 0.9'

SELECTOR picks the rows (fields of the bench's JSON rows, `name=value`,
comma-separated); FIELD is a numeric field of those rows; OP is one of
>=, <=, >, <, ==. The report lists each expectation as the user's, with what
was measured, and the command exits 1 when one does not hold."""
import argparse
import operator
import re
from dataclasses import dataclass

OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq}
PATTERN = re.compile(r"^\s*(?P<selector>[^:]*):\s*(?P<field>[A-Za-z_][\w]*)\s*(?P<op>>=|<=|==|>|<)\s*"
                     r"(?P<value>[-+0-9.eE]+)\s*$")


@dataclass(frozen=True)
class Expectation:
    text: str
    selector: tuple  # ((field, value as text), ...)
    field: str
    op: str
    value: float

    def rows(self, rows):
        return [r for r in rows if all(str(r.get(k)) == v for k, v in self.selector)]


def parse(text):
    """argparse type for --expect."""
    match = PATTERN.match(text)
    try:
        if not match:
            raise ValueError
        selector = tuple(tuple(part.strip().split("=", 1)) for part in match["selector"].split(",") if part.strip())
        if any(len(pair) != 2 or not pair[0] for pair in selector):
            raise ValueError
        return Expectation(text.strip(), selector, match["field"], match["op"], float(match["value"]))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write 'SELECTOR: FIELD OP NUMBER', for example "
                                         "'mode=ring,workers=4: efficiency >= 0.9'") from None


def check(expectations, rows):
    """[{"expectation", "measured", "holds"}] for each expectation: every
    selected row must hold it (none selected: it does not hold)."""
    out = []
    for e in expectations:
        chosen = e.rows(rows)
        values = [r.get(e.field) for r in chosen]
        holds = bool(chosen) and all(isinstance(v, (int, float)) and OPS[e.op](v, e.value) for v in values)
        measured = ", ".join("n/a" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)
                             for v in values) or "no row matches"
        out.append({"expectation": e.text, "measured": measured, "holds": holds})
    return out


def markdown(checked):
    if not checked:
        return ""
    from ringtrain.bench import tables
    return ("\nYour expectations (--expect), as measured in this run:\n\n" + tables.markdown(
        [("expectation", "your expectation"), ("measured", "measured"), ("holds", "holds")],
        [dict(c, holds="yes" if c["holds"] else "no") for c in checked]))


def failed(checked):
    """One line for the expectations that do not hold, or None."""
    broken = [c for c in checked if not c["holds"]]
    if not broken:
        return None
    return "; ".join(f"{c['expectation']} does not hold (measured {c['measured']})" for c in broken)
