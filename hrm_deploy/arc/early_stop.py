"""Exact early stop of ARC's augmentation vote (``arc-eval --early-stop``).

A test input's answer is a vote over its ~1,000 augmented copies: candidates rank by (votes,
mean sigmoid(q_halt)) (:func:`hrm_deploy.arc.score.rank`). What is scored of that ranking is small:
for each requested k, whether the label is among the top k; for the submission, the first two
candidates in order. Once no completion of the copies still to run can change those, the copies
are skipped, and the scores and ``submission.json`` are exactly the full run's.

With R copies left, a candidate can gain at most R votes and a new candidate can appear with at most
R. So the top j (as a set) is fixed when the j-th candidate leads the (j+1)-th (or nobody: 0 votes)
by more than R: then nobody outside can reach it, not even to a tie (a tie would go to the mean
q_halt, which later copies move, so ties are never assumed settled). "Label in the top k" is then
fixed by any fixed top j: holding the label with j <= k (it stays in), or without it with j >= k
(it stays out); or when every candidate that can still exist (the present ones plus R new) fits in
the top k and the label is already among them. The submission needs the first and the second place
fixed in order: both margins above R. A test input without a label never passes; only its
submission decides.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hrm_deploy.arc.score import SUBMISSION_K, Votes, rank, vote_key
from hrm_deploy.data.arc_grids import crop_batch


def _votes_at(ranked: list[tuple[str, int, float]], position: int) -> int:
    """Votes of the candidate at 1-based ``position`` (0 where there is none)."""
    return ranked[position - 1][1] if position <= len(ranked) else 0


def _top_fixed(ranked: list[tuple[str, int, float]], j: int, remaining: int) -> bool:
    """The top ``j`` (as a set) cannot change whatever ``remaining`` more votes are cast."""
    return len(ranked) >= j and _votes_at(ranked, j) > _votes_at(ranked, j + 1) + remaining


def pass_fixed(ranked: list[tuple[str, int, float]], k: int, remaining: int, label_hash: str | None) -> bool:
    """Whether "the label is in the top ``k``" is decided with ``remaining`` votes still to come:
    a fixed top j (j <= k) holding the label keeps it in the top k; a fixed top j (j >= k) without
    it keeps it out; or every candidate that can still exist fits in the top k and the label is one."""
    if remaining == 0 or label_hash is None:
        return True
    position = next((i + 1 for i, (h, _, _) in enumerate(ranked) if h == label_hash), None)
    for j in range(1, len(ranked) + 1):
        if not _top_fixed(ranked, j, remaining):
            continue
        if (position is not None and position <= j <= k) or (j >= k and (position is None or position > j)):
            return True
    return position is not None and len(ranked) + remaining <= k


def submission_fixed(ranked: list[tuple[str, int, float]], remaining: int) -> bool:
    """Whether the submission's attempts (first and second place, in order) are decided."""
    if remaining == 0:
        return True
    return all(_top_fixed(ranked, j, remaining) for j in range(1, SUBMISSION_K + 1))


def settled(
    candidates: list[tuple[str, float]], remaining: int, ks: Sequence[int], label_hashes: Sequence[str | None]
) -> bool:
    """A test input's scored outcome is final: for every k its label's (or labels', where several
    test inputs of a task share this input) presence in the top k, and its submission."""
    ranked = rank(candidates)
    if not submission_fixed(ranked, remaining):
        return False
    return all(pass_fixed(ranked, k, remaining, label) for k in ks for label in label_hashes)


# ----------------------------------------------------------------------------- the scheduler
# A test input's outcome is checked after each chunk of its copies, about DECISIONS times in all:
# chunks of 32 copies on upstream's ~1,000 copies, of one copy on a small --num-aug (9 copies), where a
# chunk of 32 would run every copy before the first check.
DECISIONS = 32


def chunk_rows(copies: int) -> int:
    """Copies of one test input per batch, for a test input of ``copies`` rows."""
    return max(1, -(-copies // DECISIONS))


def row_groups(identifiers: Sequence[str], ids: np.ndarray, inputs: np.ndarray) -> list[tuple[str, str] | None]:
    """Each row's test input as :class:`~hrm_deploy.arc.score.Votes` groups it: (task, hash of the
    un-augmented input); None for rows of the blank identifier (padding, never scored)."""
    keys: list[tuple[str, str] | None] = []
    step = 4096
    for start in range(0, len(ids), step):
        chunk_ids = np.asarray(ids[start : start + step]).astype(np.int64)
        grids = crop_batch(np.asarray(inputs[start : start + step]))
        for ident, grid in zip(chunk_ids, grids):
            if ident == 0:
                keys.append(None)
                continue
            name = identifiers[int(ident)]
            keys.append(vote_key(name, grid))
    return keys


class EarlyStop:
    """Which rows still run: each test input's copies in dataset order, chunk by chunk, until its
    outcome is settled (:func:`settled`) or its copies are done; the running vote it decides on.

    ``keys`` (:func:`row_groups`) is each row's test input, ``labels`` each test input's label
    hashes, ``ks`` the requested pass@k, ``identifiers`` the dataset's identifier names."""

    def __init__(
        self,
        keys: list[tuple[str, str] | None],
        labels: dict[tuple[str, str], list[str | None]],
        ks: Sequence[int],
        identifiers: Sequence[str],
    ):
        self.keys, self.labels, self.ks, self.identifiers = keys, labels, tuple(ks), identifiers
        self.votes = Votes()
        self.pending: dict[tuple[str, str], list[int]] = {}
        self.skipped: dict[str, int] = {}  # task -> rows not run
        for row, key in enumerate(keys):
            if key is not None:
                self.pending.setdefault(key, []).append(row)
        self.chunks = {key: chunk_rows(len(rows)) for key, rows in self.pending.items()}

    def pending_rows(self) -> int:
        return sum(len(rows) for rows in self.pending.values())

    def resume(self, saved: np.ndarray | None, ids: np.ndarray, inputs: np.ndarray) -> None:
        """Rows already predicted (a resumed run) count in the vote and are not run again."""
        if saved is None or not len(saved):
            return
        seen = set(int(r) for r in saved["row"])
        self.pending = {k: [r for r in rows if r not in seen] for k, rows in self.pending.items()}
        self.add(saved, ids, inputs, touched=set(self.pending))

    def next_batch(self, size: int, busy: frozenset[tuple[str, str]] | set[tuple[str, str]] = frozenset()) -> list[int]:
        """Up to ``size`` rows: the next chunk of each unsettled test input, in dataset order, whole chunks
        only (a chunk is ``min(its chunk size, size)`` rows), so each test input's chunks are the same rows
        whatever runs beside them; ``busy``: test inputs with a chunk still running (``arc-eval --ray``),
        left out until it is added."""
        rows: list[int] = []
        for key, waiting in self.pending.items():
            if len(rows) >= size:
                break
            chunk = waiting[: min(self.chunks[key], size)]
            if key in busy or len(rows) + len(chunk) > size:  # a whole chunk, or it waits for the next batch
                continue
            rows += chunk
            self.pending[key] = waiting[len(chunk) :]
        return rows

    def add(
        self, records: np.ndarray, ids: np.ndarray, inputs: np.ndarray, touched: set[tuple[str, str]] | None = None
    ) -> int:
        """Add predicted ``records`` to the vote; drop the remaining copies of every test input they
        touch whose outcome is now final. Returns how many rows that skipped."""
        rows = np.sort(records["row"])  # dataset order within each test input: the full run's tie order
        order = np.argsort(records["row"])
        self.votes.add(
            self.identifiers, ids[rows], np.asarray(inputs[rows]), records["pred"][order], records["q_halt"][order]
        )
        keys = touched if touched is not None else {self.keys[int(r)] for r in rows} - {None}
        dropped = 0
        for key in keys:
            waiting = self.pending.get(key)  # type: ignore[arg-type]
            if not waiting:
                continue
            task, input_hash = key  # type: ignore[misc]
            candidates = self.votes.preds.get(task, {}).get(input_hash, [])
            if settled(candidates, len(waiting), self.ks, self.labels.get(key, [None])):  # type: ignore[arg-type]
                dropped += len(waiting)
                self.skipped[task] = self.skipped.get(task, 0) + len(waiting)
                self.pending[key] = []  # type: ignore[index]
        self.pending = {k: v for k, v in self.pending.items() if v}
        return dropped
