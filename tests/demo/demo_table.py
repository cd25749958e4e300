"""Reading the demo's side-by-side table back, for the demo's tests."""


def table(out):
    """The demo's table as a list of {column: cell}, the columns cut where the dashes under the
    header end (cells such as "fp16 O1 (emulated)" hold spaces)."""
    lines = out[out.index("framework  "):].splitlines()
    spans, at = [], 0
    for dashes in lines[1].split("  "):
        spans.append((at, at + len(dashes)))
        at += len(dashes) + 2
    cells = lambda line: [line[a:b].strip() for a, b in spans]  # noqa: E731
    rows = []
    for line in lines[2:]:
        if not line.strip() or line.startswith(("peak memory:", "bf16:")):
            break
        rows.append(dict(zip(cells(lines[0]), cells(line))))
    return rows


def demo_rows(out):
    """{mode: row} from the demo's table."""
    return {row["mode"]: row for row in table(out)}
