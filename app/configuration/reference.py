"""The configuration documented from its own fields: CLI help, shown defaults, docs table.

Every field of ``TrainConfig`` (general sections and the registered tasks' sections) carries its
description once, in its pydantic ``Field``; this module turns the fields into the text the
``raptb train`` flags show and into the docs' reference table (``raptb config --markdown``),
so neither can drift from the model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from raptb.adapters.tasks.registry import task_names, task_spec
from raptb.app.configuration.config import (
    PRETRAINED_PRESET,
    TINY_PRESET,
    TrainConfig,
    build_config,
    task_presets,
)
from raptb.app.configuration.losses import LOSSES
from raptb.app.configuration.record import config_toml

TABLE_START = "<!-- config-reference:start -->"
TABLE_END = "<!-- config-reference:end -->"


def _sections(tasks: Sequence[str] | None = None) -> dict[str, type[BaseModel]]:
    """Section name -> model: the general sections, then one per task of ``tasks`` (default:
    every registered task)."""
    general = {
        name: field.annotation
        for name, field in TrainConfig.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
    }
    names = task_names() if tasks is None else tasks
    return {**general, **{name: task_spec(name).options for name in names}}


def config_fields(tasks: Sequence[str] | None = None) -> Iterator[tuple[str, FieldInfo]]:
    """(dotted path, field) of every leaf field, top-level fields first, then the sections (task
    sections of ``tasks``, default every registered task)."""
    sections = _sections(tasks)
    for name, field in TrainConfig.model_fields.items():
        if name not in sections:
            yield name, field
    for section, model in sections.items():
        for name, field in model.model_fields.items():
            yield f"{section}.{name}", field


def field_at(path: str) -> FieldInfo:
    """The field at dotted ``path`` (``optim.lr``, ``smiles.scaffolds``)."""
    for candidate, field in config_fields():
        if candidate == path:
            return field
    raise KeyError(path)


def _format(value: Any, quote: bool = False) -> str:
    """A value as TOML spells it (strings quoted only inside lists, where "" must show)."""
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_format(v, quote=True) for v in value) + "]"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and quote:
        return json.dumps(value)
    return str(value)


def _lookup(tree: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def default_text(path: str, tasks: Sequence[str] | None = None) -> str | None:
    """The default of ``path`` and the presets of ``tasks`` (default: every registered task)
    that change it, e.g. ``0.8; smiles: 0.5``; None when the field has no default value and no
    preset sets one."""
    default = field_at(path).default
    names = task_names() if tasks is None else tasks
    presets = [(name, _lookup(task_presets(name), path)) for name in names]
    presets.append(("pretrained models", _lookup(PRETRAINED_PRESET, path)))
    presets.append(("embedded tiny model", _lookup(TINY_PRESET, path)))
    by_value: dict[str, tuple[Any, list[str]]] = {}  # losses setting one value share an entry
    for loss in LOSSES.values():
        value = _lookup(dict(loss.presets), path)
        if value is not None:
            by_value.setdefault(_format(value), (value, []))[1].append(loss.name)
    presets.extend((", ".join(names), value) for value, names in by_value.values())
    changed = [f"{name}: {_format(v)}" for name, v in presets if v is not None and v != default]
    if default is None and not changed:
        return None
    text = "None" if default is None else _format(default)
    return "; ".join([text, *changed])


def markdown_table(tasks: Sequence[str] | None = None) -> str:
    """The docs' reference table (docs/configuration.md): one row per field with its default and
    description (task sections of ``tasks``, default every registered task)."""
    rows = ["| field | default | description |", "| --- | --- | --- |"]
    for path, field in config_fields(tasks):
        default = (default_text(path, tasks) or "None").replace("|", "\\|")
        description = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{path}` | {default} | {description} |")
    return "\n".join(rows) + "\n"


def config_command(
    task: Annotated[
        str | None, typer.Option(help="Show the defaults this task resolves to.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Show the defaults this model resolves to, as raptb train --model runs them "
            "(a pretrained model's preset: LoRA, learning rate, kappa). Default: the embedded "
            "tiny model."
        ),
    ] = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print the reference table of every field.")
    ] = False,
) -> None:
    """Print the resolved default configuration (TOML) of a task and model, as raptb train runs
    it with these flags alone; or the reference table of its fields."""
    if markdown:
        typer.echo(markdown_table(), nl=False)
        return
    try:
        config = build_config(overrides={"task": task, "model": model})
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(config_toml(config), nl=False)
