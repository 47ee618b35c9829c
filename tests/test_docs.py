"""The tracked tree speaks of results by date, commit, machine and command.

Numbered work sessions, or "this" one, mean nothing to a reader of the
repository (the examples below spell the word through W so that this file
passes its own check); TensorFlow's `tf.compat.v1.Session`,
`MonitoredTrainingSession` and session hooks are API words and are allowed.
The scan covers every file `git ls-files` lists (names included).
"""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Work-session phrases. Each is matched case-insensitively on one line.
SESSION_PHRASES = re.compile(
    r"\bsessions?[ _-]?\d+"  # W 23, Ws 20-24, W-6, W12
    r"|\b(?:this|that|same|previous|next|earlier|later|second|third|fourth)"
    r" (?:work )?session\b"  # this W, the same W
    r"|\bend of (?:the )?session\b"
    r"|\bthe session's (?:last|first|change|device|prediction|work|tree|scratch)\b"
    r"|\bsession's (?:device time|artifact)\b",
    re.IGNORECASE)

# A file may hold TensorFlow code whose words look like one of the phrases;
# none does today. Data recorded by benchmarks (their commands as typed) is
# checked too: a path such as out_session32 does not match (no word start).
SKIP_SUFFIXES = (".png", ".so", ".whl", ".gz", ".bin", ".npy", ".parquet")


def tracked_files():
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False)
    # The tests run from a clone (README, .ci/run): a failing git is a failure.
    assert out.returncode == 0, f"git ls-files failed: {out.stderr.decode()[-2000:]}"
    return [p for p in out.stdout.decode().split("\0") if p]


def session_mentions(paths, root=ROOT):
    """[(path, line number, line)] for every work-session phrase in `paths`
  (line number 0: the path itself)."""
    found = []
    for path in paths:
        if SESSION_PHRASES.search(path):
            found.append((path, 0, path))
        if path.endswith(SKIP_SUFFIXES):
            continue
        full = os.path.join(root, path)
        if not os.path.isfile(full):
            continue
        with open(full, "rb") as f:
            data = f.read()
        if b"\0" in data[:8192]:
            continue
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if SESSION_PHRASES.search(line):
                found.append((path, number, line.strip()[:160]))
    return found


def test_no_work_session_mentions_in_tracked_files():
    found = session_mentions(tracked_files())
    assert not found, "work-session mentions (name the date and commit instead):\n" + "\n".join(
        f"{p}:{n}: {line}" for p, n, line in found)


@pytest.mark.parametrize("text", [
    "the run of {W} 23", "{Wc}s 18–20's cuts", "({W}-6 numbers)", "probe-{W}12.md",
    "no x2 was lent this {W}", "later the same {W}", "the {W}'s device time ran out",
    "## {Wc} 28: one launch", "(2026-11-24, end of {W} 17)"
])
def test_the_check_catches(tmp_path, text):
    text = text.format(W="sess" + "ion", Wc="Sess" + "ion")
    (tmp_path / "notes.md").write_text(f"intro\n{text}\n")
    assert session_mentions(["notes.md"], root=str(tmp_path)) == [("notes.md", 2, text)]


@pytest.mark.parametrize("text", [
    "with tf.compat.v1.Session() as sess:", "MonitoredTrainingSession(checkpoint_dir=...)",
    "class BroadcastHook(tf.compat.v1.train.SessionRunHook):", "a Session step fetches the update",
    "--out-dir /tmp/out_session32", "in any new session",
    "the session restores the latest full checkpoint", "ran in the session"
])
def test_tensorflow_sessions_are_not_flagged(tmp_path, text):
    (tmp_path / "code.py").write_text(text + "\n")
    assert session_mentions(["code.py"], root=str(tmp_path)) == []


def _read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def test_readme_commands_are_what_ci_runs():
    readme = _read("README.md")
    ci = [l for l in _read(".ci/run").splitlines() if l.startswith("bash request.sh")]
    assert ci == ["bash request.sh && .venv/bin/python -m pytest -q tests"]
    assert ci[0] in readme.splitlines()
    assert "bash request.sh && .venv/bin/python benchmarks/criteo/run.py" in readme.splitlines()
    assert len(readme.splitlines()) < 350


def test_readme_and_docs_links_resolve():
    for page in ["README.md"] + ["docs/" + p for p in os.listdir(os.path.join(ROOT, "docs"))]:
        if not page.endswith(".md"):
            continue
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", _read(page)):
            if "://" in target:
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(page), target))
            assert os.path.exists(os.path.join(ROOT, path)), f"{page} links to missing {target}"


def test_readme_results_are_results_md_rows():
    """Each row of the README's results table is a row of RESULTS.md's current
  table (its markers left out), so every figure has its date, commit and run."""
    results = _read("benchmarks/RESULTS.md")
    current = results[results.index("## Current results"):results.index("# History")]
    rows = {re.sub(r" <!-- row:[a-z0-9-]+ -->", "", l) for l in current.splitlines() if "row:" in l}
    readme = _read("README.md")
    table = readme[readme.index("## Current results"):readme.index("## Not there yet")]
    readme_rows = [
        l for l in table.splitlines() if l.startswith("| ") and not l.startswith("| target")
    ]
    assert readme_rows, "no results table in the README"
    for line in readme_rows:
        assert line in rows, f"README row not in benchmarks/RESULTS.md's current table:\n{line}"
