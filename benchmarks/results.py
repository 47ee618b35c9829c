"""What every benchmark records with its numbers in benchmarks/RESULTS.md.

RESULTS.md opens with the current table, one row per target, and then the
history, one `## ` section per benchmark, each marked `<!-- history:<id> -->`.
A run's entry goes at the end of its benchmark's section (`append`, or
`publish` for device scripts, whose RESULTS.md is lost with the machine): its
headings move one level down, so a `## ` entry becomes a `### ` one. A row of
the current table is marked `<!-- row:<id> -->` in its target cell;
`update_row` rewrites its other cells (a run that is the row's configuration
does so; by hand: `python benchmarks/results.py row <id> figure=... ...`).
A file without the benchmark's section (a dry run's scratch copy) gets the
entry at its end, as it is. Nothing is ever deleted.
"""
import os
import platform
import re
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO_ROOT, "benchmarks", "RESULTS.md")

# The history sections, by id (RESULTS.md's `<!-- history:<id> -->` markers).
BENCHMARKS = ("criteo", "cpu-sparse-step", "cpu-weak-scaling", "cpu-table-memory", "cpu-tf-nn",
              "tf-sparse-step", "tf-weak-scaling", "tf-tiered-step", "tf-tiered-capacity", "peers",
              "gpu-core", "device-suite", "ci", "gpu-rounds", "summaries")
# The current table's columns after the target, in order.
COLUMNS = ("figure", "baseline", "ratio", "met", "machine", "date", "commit", "command")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine():
    """Architecture, cores, CPU, TensorFlow and Python versions, and the load
  average now (the machine may be shared)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return (f"{platform.machine()}, {os.cpu_count()} cores ({cpu_model()}), "
            f"TensorFlow {tf.__version__}, Python {platform.python_version()}; "
            f"load average at end {os.getloadavg()[0]:.1f}")


def command(argv=None):
    """The command that ran the calling script, relative to the repository."""
    return "python " + " ".join([os.path.relpath(os.path.abspath(sys.argv[0]), REPO_ROOT)] +
                                (sys.argv[1:] if argv is None else list(argv)))


def commit():
    """The checkout's short commit, with '+' when tracked files differ from it;
  'unknown' outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                              cwd=REPO_ROOT,
                              capture_output=True,
                              text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"],
                               cwd=REPO_ROOT,
                               capture_output=True,
                               check=False).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


def _demote(section):
    """Every heading of `section` one level down (## -> ###), fenced code left alone."""
    out, fence = [], False
    for line in section.split("\n"):
        if line.startswith("```"):
            fence = not fence
        if not fence and re.match(r"#{1,5} ", line):
            line = "#" + line
        out.append(line)
    return "\n".join(out)


def add_entry(text, section, benchmark):
    """`text` (RESULTS.md's content) with `section` appended at the end of
  `benchmark`'s history section; at the end of `text` when it has none."""
    if benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; one of {', '.join(BENCHMARKS)}")
    marker = f"<!-- history:{benchmark} -->"
    start = text.find(marker)
    if start < 0:
        return text + section
    # The section ends where the next level-1 or level-2 heading starts
    # (outside fenced code), or at the end of the file.
    end, fence = len(text), False
    offset = text.index("\n", start) + 1 if "\n" in text[start:] else len(text)
    for line in text[offset:].splitlines(keepends=True):
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#{1,2} ", line):
            end = offset
            break
        offset += len(line)
    head = text[:end].rstrip("\n")
    entry = _demote(section.strip("\n"))
    tail = text[end:]
    return head + "\n\n" + entry + "\n" + ("\n" + tail if tail else "")


def set_row(text, row, **cells):
    """`text` with the cells named in `cells` (of COLUMNS) of the current
  table's row `row` replaced; a cell's `|` is escaped."""
    unknown = set(cells) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown columns {sorted(unknown)}; the columns are {COLUMNS}")
    marker = f"<!-- row:{row} -->"
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("|") and marker in line:
            parts = [p.strip() for p in re.split(r"(?<!\\)\|", line)[1:-1]]
            if len(parts) != 1 + len(COLUMNS):
                raise ValueError(f"row {row} has {len(parts)} cells, not {1 + len(COLUMNS)}")
            for name, value in cells.items():
                parts[1 + COLUMNS.index(name)] = str(value).replace("|", "\\|").replace("\n", " ")
            lines[i] = "| " + " | ".join(parts) + " |"
            return "\n".join(lines)
    raise ValueError(f"no row {row!r} in the current table")


def append(section, benchmark, results=RESULTS):
    """Appends `section` to `benchmark`'s history in `results` (never rewrites
  what is there)."""
    with open(results) as f:
        text = add_entry(f.read(), section, benchmark)
    # Written only once the new text exists: an error leaves the file whole.
    with open(results, "w") as f:
        f.write(text)
    print(f"appended to {os.path.relpath(results, REPO_ROOT)} ({benchmark})")


def update_row(row, results=RESULTS, **cells):
    """Rewrites cells of the current table's row `row` in `results`."""
    with open(results) as f:
        text = set_row(f.read(), row, **cells)
    with open(results, "w") as f:
        f.write(text)
    print(f"updated row {row} of {os.path.relpath(results, REPO_ROOT)}")


def publish(text, results, copy, benchmark):
    """Prints a device benchmark's section, appends it to `benchmark`'s history
  in `results` (the device's RESULTS.md is lost with the machine) and writes it
  to `copy`, the file that comes back from the device call."""
    print(text, flush=True)
    if os.path.exists(results):
        append(text, benchmark, results)
    else:
        with open(results, "a") as f:
            f.write(text)
    with open(copy, "w") as f:
        f.write(text)


def main(argv):
    """python benchmarks/results.py row <row> column=value ... : sets cells of a
  row by hand (columns: figure, baseline, ratio, met, machine, date, commit,
  command)."""
    if len(argv) < 3 or argv[0] != "row" or any("=" not in a for a in argv[2:]):
        print(main.__doc__)
        return 2
    update_row(argv[1], **dict(a.split("=", 1) for a in argv[2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
