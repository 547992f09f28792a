"""A study's runs: the cross product axes x rows x seeds (plus extra cells), each a checked config.

Every run's configuration is built by ``app.configuration.config.build_config``, the function
``raptb train`` uses, from base_config < [base] < the axis values < the row's overrides < the seed;
so a typo in a dotted path or a value of the wrong type is a one-line error naming the study file,
the part of it that sets the field, and the field.

Order: cells in axis order (each axis's values as listed, values only named by extra cells after
them), then rows in file order, then seeds; a run's directory name joins its axis values, its
row and its seed (``rp-tb-s0``, ``beta1-rho0.5-s2``, ``rp-w-o-absorption-s0``).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

from raptb.app.configuration.config import ConfigError, TrainConfig, build_config
from raptb.app.study.spec import ROW_KEY, StudyError, StudySpec, Value, flatten

SEED_KEY = "seed"


@dataclass(frozen=True)
class PlannedRun:
    """One run of a study: where it sits in the table and the configuration it trains."""

    name: str
    values: dict[str, Value]
    """Axis path -> value."""
    row: str | None
    seed: int
    config: TrainConfig = field(compare=False)
    overrides: dict[str, Any] = field(compare=False)
    """Dotted overrides over the base (axis values and the row's), for ``--dry-run``."""

    def key(self, name: str) -> Value | None:
        """The run's value of a table key: an axis path, "row" or "seed"."""
        if name == ROW_KEY:
            return self.row
        if name == SEED_KEY:
            return self.seed
        return self.values.get(name)

    def cell(self, keys: list[str]) -> tuple[str, ...]:
        """Formatted values of ``keys``: runs of one cell differ only in their seed."""
        return tuple(format_value(self.key(k)) for k in keys)


def format_value(value: Value | None) -> str:
    """A value as the study file's labels and ``--only`` spell it (lists comma-joined)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(format_value(v) for v in value)
    return str(value)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._]+", "-", text).strip("-").lower() or "x"


def run_name(values: dict[str, Value], row: str | None, seed: int) -> str:
    """Directory name: string values as they are, others prefixed by their field's last name."""
    parts = []
    for path, value in values.items():
        text = format_value(value)
        parts.append(text if isinstance(value, str) else f"{path.rsplit('.', 1)[-1]}{text}")
    if row is not None:
        parts.append(row)
    return "-".join([*(_slug(p) for p in parts), f"s{seed}"])


def _build(spec: StudySpec, where: str, overrides: dict[str, Any], source: str) -> TrainConfig:
    try:
        return build_config(spec.base_config, overrides)
    except ConfigError as exc:
        raise StudyError(f"{source}: {where}: {exc}") from None


def _cells(spec: StudySpec) -> list[dict[str, Value]]:
    """Axis value combinations in table order: the cross product and the extra cells."""
    paths = list(spec.axes)
    cells = [
        dict(zip(paths, combo, strict=True)) for combo in itertools.product(*spec.axes.values())
    ]
    for extra in spec.extra_cells:
        cell = {path: extra[path] for path in paths}
        if cell not in cells:
            cells.append(cell)
    order = {path: list(values) for path, values in spec.axes.items()}
    for cell in cells:
        for path, value in cell.items():
            if value not in order[path]:
                order[path].append(value)
    return sorted(cells, key=lambda c: tuple(order[p].index(c[p]) for p in paths))


def plan_study(spec: StudySpec, source: str) -> list[PlannedRun]:
    """Every run of ``spec`` with its validated config; ``source`` names the file in errors.

    Raises:
        StudyError: a field set twice (by an axis and a row, or as the seed), or a path/value
            ``TrainConfig`` rejects.
    """
    base = flatten(spec.base)
    rows: dict[str | None, dict[str, Any]] = {
        name: overrides for name, overrides in spec.rows.items()
    } or {None: {}}
    parts = [("base", list(base)), ("axes", list(spec.axes))]
    parts += [(f"rows.{name}", list(o)) for name, o in rows.items()]
    for where, paths in parts:
        if SEED_KEY in paths:
            raise StudyError(f"{source}: {where}: set seeds with 'seeds', not the seed field")
        if where.startswith("rows.") and (clash := sorted(set(paths) & set(spec.axes))):
            raise StudyError(f"{source}: {where}: sets the axis {clash[0]} (set it in one place)")
    _build(spec, "base", base, source)
    for path, values in spec.axes.items():
        for value in values:
            _build(spec, f"axes.{path}", {**base, path: value}, source)
    for name, overrides in rows.items():
        if name is not None:
            _build(spec, f"rows.{name}", {**base, **overrides}, source)

    runs: list[PlannedRun] = []
    for cell in _cells(spec):
        for row, overrides in rows.items():
            where = ", ".join(f"{p} = {format_value(v)}" for p, v in cell.items())
            where = where + (f", row {row}" if row is not None else "")
            for seed in spec.seeds:
                merged = {**base, **cell, **overrides, SEED_KEY: seed}
                config = _build(spec, where or "base", merged, source)
                name = run_name(cell, row, seed)
                runs.append(PlannedRun(name, cell, row, seed, config, {**cell, **overrides}))
    names = [run.name for run in runs]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise StudyError(f"{source}: two runs would share the directory name {twice}")
    return runs


def select_runs(runs: list[PlannedRun], only: list[str]) -> list[PlannedRun]:
    """Runs matching any of the ``only`` items; an item is ``KEY=VALUE[,KEY=VALUE...]`` (all
    must match), KEY an axis path, "row" or "seed"; a VALUE may hold commas (a row named
    "FlowRL, 5,000 steps") where no ``KEY=`` follows them. No item: every run.

    Raises:
        StudyError: a malformed item, or one that selects no run.
    """
    if not only:
        return runs
    chosen: set[str] = set()
    for item in only:
        wanted: dict[str, str] = {}
        # a comma starts a new KEY=VALUE only where one follows: a row's name may hold commas
        for part in (p.strip() for p in re.split(r",(?=\s*[\w.]+\s*=)", item)):
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise StudyError(f"--only: '{item}' is not KEY=VALUE[,KEY=VALUE...]")
            wanted[key.strip()] = value.strip()
        matched = [
            run.name
            for run in runs
            if all(format_value(run.key(k)) == v for k, v in wanted.items())
        ]
        if not matched:
            raise StudyError(f"--only: '{item}' selects no run of the study")
        chosen.update(matched)
    return [run for run in runs if run.name in chosen]
