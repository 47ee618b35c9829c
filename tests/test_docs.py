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
    if out.returncode != 0:
        pytest.skip("not a git checkout")
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
