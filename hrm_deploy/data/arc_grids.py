"""ARC grids in upstream's token format, and the augmentations upstream's builders apply.

Tokens (``dataset/build_arc_dataset.py``): PAD 0, end-of-grid 1, colours 0..9 as 2..11. A grid
sits at the top-left of a ``side x side`` canvas (upstream: 30, seq_len 900) with an end-of-grid
border on the row below it and the column right of it. Augmented puzzles are named
``{task}_t{transform}_{permutation}`` (HRM) or ``{task}|||t{transform}|||{permutation}`` (TRM):
colour ``c`` becomes ``permutation[c]`` (colour 0 fixed), then the dihedral ``transform`` applies.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

from hrm_deploy.errors import DataError

PAD, EOS, COLOUR_OFFSET = 0, 1, 2
VOCAB_SIZE = 12
MAX_GRID = 30
# dataset/common.py: DIHEDRAL_INVERSE[t] undoes transform t
DIHEDRAL_INVERSE = (0, 3, 2, 1, 4, 5, 6, 7)
TRM_SEPARATOR = "|||"
_HRM_NAME = re.compile(r"^(?P<task>.+)_t(?P<t>[0-7])_(?P<perm>\d{10})$")


def dihedral_transform(grid: np.ndarray, tid: int) -> np.ndarray:
    """Upstream's ``dihedral_transform``: the 8 rotations / flips, by id 0..7."""
    if tid == 1:
        return np.rot90(grid, k=1)
    if tid == 2:
        return np.rot90(grid, k=2)
    if tid == 3:
        return np.rot90(grid, k=3)
    if tid == 4:
        return np.fliplr(grid)
    if tid == 5:
        return np.flipud(grid)
    if tid == 6:
        return grid.T
    if tid == 7:
        return np.fliplr(np.rot90(grid, k=1))
    return grid


def inverse_dihedral_transform(grid: np.ndarray, tid: int) -> np.ndarray:
    return dihedral_transform(grid, DIHEDRAL_INVERSE[tid])


def augment_name(task: str, tid: int, mapping: np.ndarray) -> str:
    """HRM's identifier of an augmented puzzle: ``{task}_t{tid}_{mapping digits}``."""
    return f"{task}_t{tid}_{''.join(str(int(x)) for x in mapping)}"


def parse_name(name: str) -> tuple[str, int, np.ndarray | None]:
    """(task, transform id, colour mapping) of an identifier in either upstream's naming;
    (name, 0, None) for an original (not augmented) puzzle."""
    if TRM_SEPARATOR in name:
        task, trans, perm = name.split(TRM_SEPARATOR)[-3:]
        return task, int(trans[1:]), np.array([int(c) for c in perm], dtype=np.uint8)
    match = _HRM_NAME.match(name)
    if match is None:
        return name, 0, None
    return match["task"], int(match["t"]), np.array([int(c) for c in match["perm"]], dtype=np.uint8)


def inverse_augment(name: str, grid: np.ndarray) -> np.ndarray:
    """Undo ``name``'s augmentation on a colour grid (upstream's ``inverse_aug``)."""
    _, tid, mapping = parse_name(name)
    if mapping is None:
        return grid
    inv_perm = np.argsort(mapping).astype(np.uint8)
    return inv_perm[inverse_dihedral_transform(grid, tid)]


def grid_hash(grid: np.ndarray) -> str:
    """TRM's ``grid_hash``: sha256 of the shape bytes and the uint8 cells."""
    grid = np.ascontiguousarray(grid, dtype=np.uint8)
    return hashlib.sha256(bytes(grid.shape) + grid.tobytes()).hexdigest()


def grid_side(seq_len: int) -> int:
    side = int(round(seq_len**0.5))
    if side * side != seq_len:
        raise DataError(f"seq_len {seq_len} is not a square grid; ARC datasets have seq_len side*side (900)")
    return side


def crop_batch(rows: np.ndarray) -> list[np.ndarray]:
    """Upstream's ``crop`` on every row of ``rows`` [N, side*side] (vectorised): the largest
    top-left rectangle of colour tokens (ties: the fewest rows), minus 2; an empty grid
    (shape (0, 0)) when the first cell is not a colour."""
    rows = np.asarray(rows)
    side = grid_side(rows.shape[1])
    grids = rows.reshape(-1, side, side)
    invalid = (grids < COLOUR_OFFSET) | (grids > VOCAB_SIZE - 1)  # [N, side, side]
    first_bad = np.where(invalid.any(2), invalid.argmax(2), side)  # [N, side] first non-colour column
    num_c = np.minimum.accumulate(first_bad, axis=1)  # scanning stops at the narrowest row so far
    area = num_c * np.arange(1, side + 1)
    best = area.argmax(1)  # first maximum, as upstream's strict ">"
    out = []
    for grid, r, a, c in zip(grids, best, area.max(1), num_c[np.arange(len(grids)), best]):
        if a == 0:
            out.append(np.zeros((0, 0), np.uint8))
        else:
            out.append((grid[: r + 1, :c] - COLOUR_OFFSET).astype(np.uint8))
    return out


def encode_grid(grid: np.ndarray, side: int = MAX_GRID, offset: tuple[int, int] = (0, 0)) -> np.ndarray:
    """Upstream's padding of one colour grid at ``offset`` into ``side x side`` tokens with the
    end-of-grid border; returns the flat [side*side] uint8 row."""
    pad_r, pad_c = offset
    nrow, ncol = grid.shape
    out = np.pad(
        grid.astype(np.uint8) + COLOUR_OFFSET, ((pad_r, side - pad_r - nrow), (pad_c, side - pad_c - ncol))
    ).astype(np.uint8)
    eos_row, eos_col = pad_r + nrow, pad_c + ncol
    if eos_row < side:
        out[eos_row, pad_c:eos_col] = EOS
    if eos_col < side:
        out[pad_r:eos_row, eos_col] = EOS
    return out.flatten()


def to_grid(value: object, where: str, max_grid: int = MAX_GRID) -> np.ndarray:
    """A task file's grid (list of lists of 0..9) as uint8, checked like upstream's ``arc_grid_to_np``."""
    try:
        arr = np.array(value)
    except ValueError:
        arr = np.zeros(0)
    if arr.ndim != 2 or arr.dtype.kind not in "iu" or arr.size == 0:
        raise DataError(f"{where}: not a grid (a non-empty list of equal-length lists of integers 0..9)")
    if arr.shape[0] > max_grid or arr.shape[1] > max_grid:
        raise DataError(f"{where}: grid {arr.shape[0]}x{arr.shape[1]} exceeds the {max_grid}x{max_grid} maximum")
    if arr.min() < 0 or arr.max() > 9:
        raise DataError(f"{where}: colours must be 0..9, found {int(arr.min())}..{int(arr.max())}")
    return arr.astype(np.uint8)
