"""What every CPU benchmark records with its numbers in benchmarks/RESULTS.md:
the machine, the exact command, and the dated section itself, appended."""
import os
import platform
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO_ROOT, "benchmarks", "RESULTS.md")


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


def append(section):
    """Appends `section` to benchmarks/RESULTS.md (never rewrites it)."""
    with open(RESULTS, "a") as f:
        f.write(section)
    print(f"appended to {os.path.relpath(RESULTS, REPO_ROOT)}")


def publish(text, results, copy):
    """Prints a device benchmark's section, appends it to `results` (the
  device's RESULTS.md is lost with the machine) and writes it to `copy`, the
  file that comes back from the device call."""
    print(text, flush=True)
    with open(results, "a") as f:
        f.write(text)
    with open(copy, "w") as f:
        f.write(text)
