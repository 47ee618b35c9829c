"""The test tree collects as one suite.

pytest's default import mode imports each test module by its basename, so two
test files of one name in different folders (tests/ and tests/multiworker/)
stop the collection of the whole suite with "import file mismatch".
"""
import collections
import os

TESTS = os.path.dirname(os.path.abspath(__file__))


def modules_by_basename(root=TESTS):
    """{basename: [relative paths]} of every test_*.py under `root`."""
    found = collections.defaultdict(list)
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.startswith("test_") and name.endswith(".py"):
                found[name].append(os.path.relpath(os.path.join(folder, name), root))
    return found


def test_test_module_basenames_are_unique():
    twins = {name: paths for name, paths in modules_by_basename().items() if len(paths) > 1}
    assert not twins, f"test files sharing a basename (rename one): {twins}"


def test_the_check_catches_a_twin(tmp_path):
    for folder in ("", "multiworker"):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / "test_same.py").write_text("")
    assert sorted(modules_by_basename(
        str(tmp_path))["test_same.py"]) == ["multiworker/test_same.py", "test_same.py"]
