"""The command line and the words about it agree: build-engine's backend flags are the options
classes' fields (one flag per field, no flag without a field), and every flag a message or a help
text names is a flag of some command."""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

import typer
from typer.testing import CliRunner

from hrm_deploy.cli import app
from hrm_deploy.engines.config import EngineConfig
from hrm_deploy.engines.options import command_line, every_class

PACKAGE = Path(__file__).resolve().parents[2] / "hrm_deploy"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?!\w)")  # --calib-data, not trtexec's --saveEngine
# flags of other programs that a message tells the user to pass to them
OTHER_PROGRAMS = {"--model-repository": "tritonserver"}
# a message whose flag is being reworded where it lives (the precision stage): flag -> its file
BEING_REWORDED: dict[str, str] = {}
# build-engine's own flags beside the common fields: the precision's short forms, output and display
COMMAND_ONLY = {"--fp16", "--bf16", "--int8", "--fp8", "--nvfp4", "--fp32", "--out", "--output", "--quiet", "--help"}


def _command(name: str | None = None):
    root = typer.main.get_command(app)
    return root if name is None else root.commands[name]  # type: ignore[attr-defined]


def _long(params) -> set[str]:
    return {o for p in params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}


def _every_flag() -> set[str]:
    found: set[str] = set()

    def walk(command) -> None:
        found.update(_long(command.params))
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    walk(_command())
    return found


def test_every_build_option_is_a_flag_and_every_flag_an_option():
    """Each field of each building backend's options class is one build-engine flag; each flag of
    build-engine is such a field, a common field of EngineConfig, or the command's own."""
    flags = _long(_command("build-engine").params)
    options = {f.metadata["flag"]: (cls, f.name) for cls in every_class() for f in fields(cls)}
    missing = {flag: owner for flag, owner in options.items() if flag not in flags}
    assert not missing, f"build options without a build-engine flag: {missing}"
    assert [flag.name for flag in command_line()] == list(dict.fromkeys(name for _, name in options.values()))
    common = {f"--{f.name.replace('_', '-')}" for f in fields(EngineConfig)} | {"--no-accuracy-check"}
    stray = flags - set(options) - common - COMMAND_ONLY
    assert not stray, f"build-engine flags that set no option: {sorted(stray)}"


def test_a_new_options_field_becomes_a_flag(monkeypatch):
    """The command is made from the classes: a field added to an options class is a flag of the
    command made after it, with its help (no edit to the command)."""
    from dataclasses import dataclass

    from hrm_deploy.backends.torch.builder.options import TorchOptions
    from hrm_deploy.engines import options as options_module
    from hrm_deploy.engines.options import option

    @dataclass(frozen=True)
    class Wider(TorchOptions):
        lanes: int | None = option(None, "--lanes", "torch backend: lanes.")

    real = options_module.every_class
    monkeypatch.setattr(options_module, "every_class", lambda: [Wider if c is TorchOptions else c for c in real()])
    [made] = [flag for flag in command_line() if flag.name == "lanes"]
    assert made.flag == "--lanes" and made.owner is Wider and made.help == "torch backend: lanes."
    assert made.value("3") == "3" and not made.switch

    from hrm_deploy.cli.engine import backend_flags

    seen = {}
    fresh = typer.Typer()
    fresh.command()(backend_flags(lambda quiet=False, **options: seen.update(options)))
    result = CliRunner().invoke(fresh, ["--lanes", "3", "--no-fuse"])
    assert result.exit_code == 0, result.output
    assert seen["lanes"] == 3 and seen["fuse"] is True and seen["tf32"] is False  # a switch: given or not


def test_a_switch_flips_its_fields_default():
    by_name = {flag.name: flag for flag in command_line()}
    assert by_name["fuse"].switch and by_name["fuse"].value(True) is False and by_name["fuse"].value(False) is True
    assert by_name["tf32"].value(True) is True
    assert by_name["timing_cache"].value("none") is None and by_name["timing_cache"].value("a.cache") == "a.cache"


def _strings(node: ast.AST) -> list[str]:
    return [sub.value for sub in ast.walk(node) if isinstance(sub, ast.Constant) and isinstance(sub.value, str)]


def _messages(tree: ast.AST) -> list[tuple[int, str]]:
    """The words a user reads: what is raised, logged, warned or echoed, and every help text."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            found += [(node.lineno, text) for text in _strings(node.exc)]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            said = owner in ("log", "logger", "logging", "warnings", "typer") and name in (
                "debug",
                "info",
                "warning",
                "error",
                "exception",
                "warn",
                "echo",
            )
            if said:
                found += [(node.lineno, text) for text in _strings(node)]
            found += [(node.lineno, text) for kw in node.keywords if kw.arg == "help" for text in _strings(kw.value)]
            if name == "option" and len(node.args) >= 3:  # a build option's help (engines.options.option)
                found += [(node.lineno, text) for text in _strings(node.args[2])]
    return found


def test_every_flag_a_message_names_exists():
    flags = _every_flag()
    unknown = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, text in _messages(ast.parse(path.read_text())):
            for flag in FLAG.findall(text):
                where = path.relative_to(PACKAGE).as_posix()
                if flag in flags or flag in OTHER_PROGRAMS or BEING_REWORDED.get(flag) == where:
                    continue
                unknown.append(f"{where}:{line}: {flag}")
    assert not unknown, "messages name flags no command has:\n" + "\n".join(unknown)


def test_the_message_check_sees_a_flag_in_a_raise():
    tree = ast.parse('raise ConfigError(f"use --no-such-flag {x}")\nlog.info("--also-not")\nx = "--ignored"')
    named = [flag for _, text in _messages(tree) for flag in FLAG.findall(text)]
    assert named == ["--no-such-flag", "--also-not"]


def test_the_root_help_names_every_target():
    from hrm_deploy.engines.targets import TARGETS

    text = " ".join(CliRunner().invoke(app, ["--help"], env={"NO_COLOR": "1", "COLUMNS": "200"}).output.split())
    missing = [name for name in TARGETS if name not in text]
    assert not missing, f"hrm-deploy --help names no {missing}"
