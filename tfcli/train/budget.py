"""A time budget (`train.max_minutes`) as a step count: planned from the speed measured so far, so that a cosine
schedule ends on time, and planned again at validations when the speed changes."""

from __future__ import annotations

from typing import Callable

Mark = tuple[float, float, int]  # (time, validation seconds so far, step): where a speed measurement starts


class Budget:
    """The measurements behind a time budget's plan. `clock()`: the run's training seconds so far; `mean(values)`:
    each value's mean over the processes (so that every process plans the same step); `epoch_setup_s`: each epoch's
    start (its batch list), per step; `plan_at`: the step that plans (0: none)."""

    def __init__(self, minutes: float, valid_every: int, plan_at: int, epoch_setup_s: float,
                 clock: Callable[[], float], mean: Callable[[list[float]], list[float]]):
        self.minutes, self.valid_every, self.plan_at = minutes, valid_every, plan_at
        self.epoch_setup_s, self.clock, self.mean = epoch_setup_s, clock, mean
        self.valid_seconds: list[float] = []  # how long each validation + checkpoint took
        self.plan_mark: Mark | None = None  # halfway to plan_at
        self.replan_mark: Mark | None = None  # where the budget was last planned

    def mark(self, step: int) -> Mark:
        return self.clock(), sum(self.valid_seconds), step

    def start_measuring(self, step: int) -> None:
        """Seconds per step are taken from the second half of warmup: the first steps pay one-time costs (allocator,
        kernel selection for new shapes); counted in, they left 4.3 of a 43-minute budget unused."""
        self.plan_mark = self.mark(step)

    def plan(self, step: int, start_time: float, start_step: int) -> tuple[int, float, float]:
        """(the last step that fits, seconds per step, seconds per validation), measured since `start_measuring`
        (or since the run started: `start_time`, `start_step`)."""
        planned = self.steps_that_fit(self.plan_mark or (start_time, 0.0, start_step), step)
        self.replan_mark = self.mark(step)
        return planned

    def replan(self, step: int, max_steps: int) -> tuple[int, float, int] | None:
        """At a validation: (the steps that fit now, seconds per step, the step the speed was measured from), or
        None when the plan stands. A machine whose speed drifts (a shared host, the clock) would otherwise stop on
        time with its cosine cut short, or finish early with time unused. The plan moves only by more than 5% of the
        steps left (and 10 steps), and its window grows until it does, so that noise between validations (a few
        percent) leaves it alone."""
        mark = self.replan_mark
        if mark is None or mark[2] == step:
            self.replan_mark = self.mark(step)
            return None
        planned, step_s, _ = self.steps_that_fit(mark, step)
        if abs(planned - max_steps) < max(10, 0.05 * (max_steps - step)):
            return None
        self.replan_mark = self.mark(step)
        return planned, step_s, mark[2]

    def steps_that_fit(self, mark: Mark, step: int) -> tuple[int, float, float]:
        """(the last step that fits the budget, in tens of steps from `step`, seconds per step, seconds per
        validation), the seconds per step measured since `mark`."""
        t0, valid_s0, step0 = mark
        spent = self.clock() - t0
        valid_s = sum(self.valid_seconds) - valid_s0
        one_valid = sum(self.valid_seconds) / max(len(self.valid_seconds), 1)
        step_s, one_valid, now = self.mean([(spent - valid_s) / max(step - step0, 1), one_valid, self.clock()])
        step_s += self.epoch_setup_s  # warmup saw no epoch start; later epochs each pay one
        left = 60 * self.minutes - now - one_valid  # the last validation comes after the last step
        more = max(int(left / (step_s + one_valid / self.valid_every)), 0)
        return step + more // 10 * 10, step_s, one_valid
