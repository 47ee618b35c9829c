"""The training loop's schedules (benchmarks/criteo/training.train_and_evaluate).

A stand-in style records what the loop asks of it (which implementation
trains on which batch, which are evaluated when), so the loop's bookkeeping
is checked without TensorFlow: the reference is the schedule written out.
"""
import time

import numpy as np
import pytest

from benchmarks.criteo import training


class Impl:

    def __init__(self, name):
        self.name = name


class RecordingStyle:
    """Batches 1..n; each train call logs (name, batch) and sleeps `step_s`;
  each batch fetch sleeps `input_s`."""

    def __init__(self, names, batches, step_s=0.0, input_s=0.0):
        self.implementations = [Impl(n) for n in names]
        self.batches, self.step_s, self.input_s = batches, step_s, input_s
        self.trained, self.evaluated, self.passes = [], [], 0

    def train_batches(self):
        self.passes += 1
        for b in range(1, self.batches + 1):
            time.sleep(self.input_s)
            yield b, 0

    def train(self, name, batch):
        time.sleep(self.step_s)
        self.trained.append((name, batch))
        return 1.0 / batch

    def evaluate(self, names):
        self.evaluated.append((list(names), len(self.trained)))
        labels = np.array([0, 1, 0, 1])
        return labels, {n: np.array([0.1, 0.9, 0.2, 0.8]) for n in names}


def metrics(labels, probabilities):
    return 0.75, 0.5


def test_interleaved_stops_the_baseline_early_and_evaluates_both_at_its_last_step():
    style = RecordingStyle(["sok_ev", "baseline"], 6)
    result = training.train_and_evaluate(style,
                                         10, [3],
                                         metrics,
                                         progress=False,
                                         max_steps={"baseline": 2})
    # Batch b: both in turn (the order alternates) while the baseline runs.
    assert style.trained == [("sok_ev", 1), ("baseline", 1), ("baseline", 2), ("sok_ev", 2),
                             ("sok_ev", 3), ("sok_ev", 4), ("sok_ev", 5), ("sok_ev", 6)]
    assert style.passes == 1 and result["steps"] == 6
    curves = result["curves"]
    assert curves["baseline"].eval_samples == [20]
    assert curves["sok_ev"].eval_samples == [30, 60]
    assert len(curves["baseline"].loss) == 2 and len(curves["sok_ev"].loss) == 6


def test_eval_at_the_baseline_limit_gives_both_an_evaluation_at_equal_steps():
    style = RecordingStyle(["sok_ev", "baseline"], 4)
    result = training.train_and_evaluate(style,
                                         1, [2],
                                         metrics,
                                         progress=False,
                                         max_steps={"baseline": 2})
    # One evaluation call covers both after step 2, then sok_ev alone at the end.
    assert [names for names, _ in style.evaluated] == [["sok_ev", "baseline"], ["sok_ev"]]
    assert result["curves"]["sok_ev"].eval_samples == [2, 4]


def test_sequential_gives_each_its_own_pass_and_its_own_input_waits():
    style = RecordingStyle(["sok_ev", "baseline"], 4, step_s=0.01, input_s=0.02)
    result = training.train_and_evaluate(style,
                                         1, [],
                                         metrics,
                                         progress=False,
                                         max_steps={"baseline": 3},
                                         schedule="sequential")
    assert style.trained == [("sok_ev", b) for b in range(1, 5)
                            ] + [("baseline", b) for b in range(1, 4)]
    assert style.passes == 2
    curves = result["curves"]
    # Its own 4 and 3 fetches of >= 20 ms each (sleeps only overrun).
    assert 0.08 <= curves["sok_ev"].input_seconds < 0.08 + 0.5
    assert 0.06 <= curves["baseline"].input_seconds < 0.06 + 0.5
    for c in curves.values():
        assert all(loop >= step + 0.02 for loop, step in zip(c.loop_seconds, c.seconds))


class SlowBaselineStyle(RecordingStyle):

    def train(self, name, batch):
        time.sleep(0.2 if name == "baseline" else 0.0)
        return super().train(name, batch)


def test_interleaved_loop_time_leaves_out_the_other_implementations_steps():
    style = SlowBaselineStyle(["sok_ev", "baseline"], 3)
    result = training.train_and_evaluate(style, 1, [], metrics, progress=False)
    # Counting the baseline's 200 ms steps would put sok_ev's at >= 0.2 s.
    assert all(loop < 0.2 for loop in result["curves"]["sok_ev"].loop_seconds)
    assert all(loop >= 0.2 for loop in result["curves"]["baseline"].loop_seconds)


def test_unknown_schedule_is_refused_by_name():
    with pytest.raises(ValueError, match="schedule must be one of .* got 'parallel'"):
        training.train_and_evaluate(RecordingStyle(["sok_ev"], 1),
                                    1, [],
                                    metrics,
                                    progress=False,
                                    schedule="parallel")
