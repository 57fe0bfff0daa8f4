"""``hrm-deploy data arc`` and ``hrm-deploy arc-eval``: ARC datasets and upstream's ARC score."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hrm_deploy.cli.common import Quiet, user_errors
from hrm_deploy.cli.data import data_app


@data_app.command("arc")
@user_errors
def arc(
    source: Annotated[
        Path, typer.Option("--source", help="Folder of ARC task JSON files (<subset>/<task>.json or <task>.json).")
    ],
    output: Annotated[Path, typer.Option("-o", "--out", "--output", help="Dataset folder to create.")] = Path(
        "data/arc-aug-1000"
    ),
    num_aug: Annotated[int, typer.Option(help="Augmented copies per task (upstream: 1000).")] = 1000,
    seed: Annotated[int, typer.Option(help="Random seed (same seed and files, same dataset).")] = 42,
    max_grid: Annotated[int, typer.Option(help="Canvas side (upstream: 30, seq_len 900); grids must fit.")] = 30,
    test_subset: Annotated[
        list[str] | None,
        typer.Option("--test-subset", help="Sub-folder whose test pairs form the test split (repeatable)."),
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Build an ARC dataset in upstream's format (augmentations, identifiers.json) from task files."""
    from hrm_deploy.data.arc import ArcSpec, build_arc, find_subsets
    from hrm_deploy.progress import progress

    spec = ArcSpec(
        source=str(source),
        num_aug=num_aug,
        seed=seed,
        max_grid=max_grid,
        test_subsets=tuple(test_subset) if test_subset else ("evaluation",),
    )
    total = sum(len(files) for _, files in find_subsets(source))
    with progress(total, "building ARC dataset", quiet, unit="tasks") as advance:
        splits, identifiers = build_arc(spec, output, advance)
    typer.echo(
        f"wrote {output}: {len(splits['train'])} train examples, {len(splits['test'])} test examples, "
        f"{len(identifiers)} puzzle identifiers"
    )
