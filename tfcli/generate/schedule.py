"""The one decoding schedule under every search: beam search, greedy decoding and sampling (search.py) and
language-model generation (lm.py) each supply only what is theirs, a `Search`; `Schedule.run` does the rest.

What the schedule owns:
- rows and input items: the decoder holds `n` rows at once, each decoding one item (a sentence, a prompt) of the
  `total`; `item` (on the device) and `held` (on the host) say which, -1 for a row that holds none;
- the read cadence: what a step decides stays on the device, and the host reads it every `every` steps (and at
  once when the search asks, or past `horizon` steps, when every item begun so far has ended);
- after a read, the rows whose item has ended either leave the batch (a shrinking decoder, the CPU's: no compute
  is spent on them) or, with a fixed-shape decoder (a GPU's), give their places to the next items in order
  (continuous batching);
- each row's output position: the step counted on the host, or with fixed shapes on the device, less the step at
  which its item began;
- the one CUDA-graph runner (`StepGraph`), under a search's whole step or a fixed-shape decoder's own.

A search's step runs between two reads without the host looking, so that the host's reads can be moved here
alone: with fixed shapes they are overlapped with the device's next steps (`Behind`).
"""

from __future__ import annotations

import collections
import warnings
from typing import Callable, Protocol

import torch

from tfcli.device import to_device


def read_every(check_every: int, device: torch.device) -> int:
    """Steps between the search's reads of the device: `check_every`, or by default every step on the CPU (reading
    costs nothing there, and finished items leave at once) and every 8 on a GPU (each read stalls the queue)."""
    return check_every or (1 if device.type == "cpu" else 8)


class Search(Protocol):
    """What a search supplies to `Schedule.run`."""

    def advance(self, at) -> None:
        """One step over every row; `at`: each row's output position, 1-based (an int, or with fixed shapes (n,)
        on the device). Between two reads nothing here may read the device."""

    def capturable(self) -> bool:
        """Whether this step reads and writes the same tensors as the last (so that it can be a CUDA graph)."""

    def must_read(self) -> bool:
        """Whether the host must read before the next step, whatever the cadence."""

    def read(self) -> list[bool]:
        """The host's read of the device: whether each row's item has ended. A search whose read is that alone
        may also give `ended_rows()`, the same flags on the device (a bool tensor), which the schedule then reads
        behind the next steps (`Behind`)."""

    def retire(self, rows: list[int]) -> None:
        """The items of `rows` have ended: keep their output (before their rows leave or are taken)."""

    def admit(self, rows: torch.Tensor, items: torch.Tensor, placed: list[tuple[int, int]]) -> None:
        """Fixed shapes: the items `items` take the places `rows` (both on the device; `placed`: the same pairs
        (row, item) on the host)."""

    def keep(self, rows: torch.Tensor) -> None:
        """A shrinking decoder: only the rows `rows` (on the device, in their new order) go on."""


class Decoder(Protocol):
    """What a search steps: a batch's decoder state (tfcli.generate.step: `IncrementalDecoder`, shrinking, and
    `StaticDecoder`, fixed shapes; an ensemble's holds one of each member's). n rows of k beams (at most K)."""

    n: int  # rows (a fixed-shape decoder: places, live or not)
    fixed: bool  # fixed shapes: rows never leave; `admit` gives a finished row's place to a new item
    max_steps: int  # the positions it holds (fixed shapes: a ring of them)

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """tok (n*k,): each beam's last token -> the next token's logits (n*k, V)."""

    def prefill(self, ids: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Whole prompts first (one beam), left-padded where `valid` is False -> the logits after each, (n, V)."""

    def select(self, keep: torch.Tensor | None, parent: torch.Tensor | None = None) -> None:
        """Keep the rows `keep` (None: all), then let beam j of each row go on from beam parent[row, j]."""

    def admit(self, places: torch.Tensor, memory: torch.Tensor, mem_mask: torch.Tensor) -> None:
        """Fixed shapes: new sentences (their encoder output) take the places `places`, from position 0."""

    def admit_prompts(self, places: torch.Tensor, ids: torch.Tensor, valid: torch.Tensor | None = None
                      ) -> torch.Tensor:
        """Fixed shapes: new prompts take the places `places`, prefilled -> the logits after each, (m, V)."""

    def release(self) -> None:
        """The batch is done: its memory goes back for the next."""


class Schedule:
    """Rows, items, reads and turnover for one batch of `total` items decoded `n` rows at a time (`fixed`: a
    fixed-shape decoder, whose rows are taken by the next items; otherwise rows leave and n must be `total`)."""

    def __init__(self, total: int, n: int, fixed: bool, every: int, horizon: int, device: torch.device):
        self.fixed, self.every, self.horizon = fixed, every, horizon
        self.held = list(range(n))  # each row's item; -1 (fixed shapes) once it has ended and no other took its place
        self.queue = collections.deque(range(n, total))  # items waiting for a row, in order
        self.item = torch.arange(n, device=device)  # the same, on the device
        self.step = 0
        # fixed shapes: the step, counted on the device, and the step at which each row's item began
        self.now = torch.zeros((), dtype=torch.long, device=device)
        self.began = torch.zeros(n, dtype=torch.long, device=device) if fixed else None

    def position(self):
        """Each row's output position at this step (1-based), at most horizon + 1 (a row whose item has ended runs
        on, unread, until the next read)."""
        if not self.fixed:
            return self.step
        self.now.add_(1)
        return (self.now - self.began).clamp_(max=self.horizon + 1)

    def run(self, search: Search, graph: "StepGraph | None" = None) -> None:
        """Step `search` until every item has ended; with `graph`, each capturable step through it."""
        last = self.horizon  # the step by which every item begun so far has ended
        since = 0  # steps since the last read
        # fixed shapes with items waiting: a read takes the ended flags copied at the read before (`Behind`), and
        # copies them again after the places are refilled, so that the device never waits for the host; an item
        # that ended is seen `every` steps later (its row runs on, unread). The last items are read at once.
        ahead, pending = self.fixed and hasattr(search, "ended_rows"), None

        def step():
            search.advance(self.position())

        while True:
            self.step += 1
            since += 1
            if graph is not None:
                graph(step, capture=search.capturable())
            else:
                step()
            if since < self.every and self.step < last and not search.must_read():
                continue
            since = 0
            if ahead and self.queue and self.step < last:  # the flags copied at the last read, behind the steps since
                ended = pending.read() if pending is not None else []
            else:
                ended = search.read()  # the one read of the device in `every` steps
            pending = None
            gone = [r for r, e in enumerate(ended) if e and self.held[r] >= 0]
            if gone:
                search.retire(gone)
            if self.fixed:
                rows, items = self._turnover(gone)
                if not any(i >= 0 for i in self.held):
                    return
                if rows:
                    last = self.step + self.horizon
                    device = self.item.device
                    r, s = to_device(rows, device), to_device(items, device)
                    self.item[r], self.began[r] = s, self.step
                    search.admit(r, s, list(zip(rows, items)))
                if ahead and self.queue and self.step < last:
                    pending = Behind(search.ended_rows())
                continue
            if len(gone) == len(ended):
                return
            if gone:
                keep = keep_order(len(ended), gone)
                self.held = [self.held[r] for r in keep]
                keep_t = to_device(keep, self.item.device)
                self.item = self.item[keep_t]
                search.keep(keep_t)

    def _turnover(self, gone: list[int]) -> tuple[list[int], list[int]]:
        """The rows whose item has ended take the next items of the queue; returns (rows, items) taken."""
        rows, items = [], []
        for r in gone:
            s = self.queue.popleft() if self.queue else -1
            self.held[r] = s
            if s >= 0:
                rows.append(r)
                items.append(s)
        return rows, items


class Behind:
    """A device tensor's copy on the host, made behind the work queued so far and read later: on CUDA into pinned
    memory, the host going on queueing steps meanwhile (the read then waits only for the copy, not for the steps
    queued after it); elsewhere a copy made now."""

    def __init__(self, x: torch.Tensor):
        self.event = None
        if x.device.type == "cuda":
            self.host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
            self.host.copy_(x, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = x.clone()

    def read(self) -> list:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


class StepGraph:
    """A step function run as one CUDA graph: the first call that may be captured runs eagerly on a side stream
    (the warm-up a capture needs: a real step), the next is captured and replayed, each later one replayed. Between
    calls the caller changes the step's tensors in place only, and the step keeps its counts on the device (a
    replay runs no host code). Off (`on` False), or once a capture has failed (with a warning), every call runs
    eagerly. A call made while another runs (a decoder's step inside a search's) runs plainly in it: one graph."""

    def __init__(self, on: bool):
        self.on = on
        self.graph, self.warm, self.running = None, False, False

    def __call__(self, step: Callable[[], None], capture: bool = True) -> None:
        if self.running or not (self.on and capture):
            self._run(step)
        elif self.graph is not None:
            self.graph.replay()
        elif not self.warm:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._run(step)
            torch.cuda.current_stream().wait_stream(stream)
            self.warm = True
        else:
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    self._run(step)
            except RuntimeError as e:
                warnings.warn(f"decoding without a CUDA graph (capturing the step failed: {e})", RuntimeWarning, 3)
                self.on = False
                self._run(step)
                return
            self.graph = graph
            graph.replay()

    def _run(self, step: Callable[[], None]) -> None:
        outer, self.running = self.running, True
        try:
            step()
        finally:
            self.running = outer


def search_graph(decoder: Decoder) -> StepGraph:
    """The runner of a search's whole step over `decoder`: the decoder's own (a StaticDecoder's: on CUDA the
    search's step, the decoder's and the search's own small kernels, becomes its one graph), else one that runs
    every step eagerly."""
    own = getattr(decoder, "graph", None)
    return own if isinstance(own, StepGraph) else StepGraph(False)


def keep_order(n: int, gone) -> list[int]:
    """The rows to keep when the rows `gone` leave a batch of n, in the order that moves fewest (for
    `IncrementalDecoder.select`): a kept row below the new count stays where it is, and the kept rows past it fill
    the places of those that left."""
    gone = set(gone)
    n_new = n - len(gone)
    tail = [s for s in range(n_new, n) if s not in gone]
    return [tail.pop() if s in gone else s for s in range(n_new)]
