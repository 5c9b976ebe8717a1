"""Two sets of `agreement.py` reports side by side: what a change to the
prediction did, study by study.

    python benchmarks/prediction/compare.py BEFORE AFTER OUT.md

BEFORE and AFTER are folders of `agreement.py` reports made from the same
suite folders by two versions of the code (the same file name in each).
OUT.md lists every entry whose ratios or verdicts changed, and the totals
over all of them: judged, over the limit, agreed, false cuts, missed, at
stage 1's own margin and at every fixed margin the reports hold.
"""

from __future__ import annotations

import sys
from pathlib import Path


def rows(path: Path) -> tuple[list[str], dict[str, list[str]]]:
    """A report's column titles and its entries' cells, by entry."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("| ")]
    titles = [c.strip() for c in lines[0].strip("|").split("|")]
    return titles, {cells[0]: cells for cells in
                    ([c.strip() for c in line.strip("|").split("|")] for line in lines[1:])}


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    before, after, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    changed, totals, verdicts = [], {}, []
    for path in sorted(before.glob("*.md")):
        titles, old = rows(path)
        _, new = rows(after / path.name)
        verdicts = titles[4:]
        for entry, cells in old.items():
            for version, row in (("before", cells), ("after", new[entry])):
                for title, cell in zip(verdicts, row[4:], strict=True):
                    counts = [int(x) for x in cell.split(",")]
                    key = (version, title)
                    totals[key] = [a + b for a, b in zip(totals.get(key, [0] * 5), counts,
                                                         strict=True)]
            if cells[3:] != new[entry][3:]:
                changed.append(f"| {path.stem} | {entry} | {cells[3]} | {new[entry][3]} | "
                               + " | ".join(f"{a} → {b}" for a, b in
                                            zip(cells[4:], new[entry][4:], strict=True)) + " |")
    lines = [f"Command: `python {' '.join(sys.argv)}`", "",
             "Totals over every entry (judged, over, agree, false cuts, missed):", ""]
    for title in verdicts:
        was, now = (", ".join(map(str, totals[(v, title)])) for v in ("before", "after"))
        lines.append(f"- {title.split(':')[0]}: before {was}; after {now}")
    lines += ["", "Entries that changed:", "",
              "| report | entry | XLA / predicted before | after | "
              + " | ".join(t.split(":")[0] for t in verdicts) + " |",
              "|---|---|---|---|" + "---|" * len(verdicts), *changed]
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:4 + len(verdicts)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
