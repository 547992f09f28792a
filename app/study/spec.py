"""The study file: a TOML description of a grid of training runs and of the table they fill.

A study names a base configuration, axes (config fields by dotted path, each with a list of
values), named rows (sets of overrides, e.g. ablation variants), extra cells outside the cross
product, seeds, evaluation options and the layout of its Markdown table::

    name = "toy"                       # default: the file's stem
    title = "A toy study"              # heading of table.md
    base_config = "base.toml"          # optional, relative to this file
    seeds = [0, 1]

    [base]                             # inline config, over base_config
    steps = 2

    [axes]
    loss = ["tb", "raptb"]

    [rows]
    "default" = {}
    "no detach" = { "objective.detach_pterm" = false }

    [[extra_cells]]                    # axis combinations run beyond the cross product
    loss = "subtb"

    [eval]
    samples = 32                       # default: the config's eval_samples
    seed = 0                           # default: each run's training seed
    exact = true                       # also raptb eval --exact (enumerable tasks): exact.*

    [table]
    rows = ["loss"]                    # keys (axis paths or "row") that label table rows
    columns = ["row"]                  # keys spread over columns, one group per value
    headers = { loss = "Objective" }
    labels = { loss = { tb = "TB" } }
    metrics = [{ key = "acc", name = "Acc", decimals = 3 }]
    plots = ["acc"]                    # default: every table metric
    curves = [{ x = "unique_correct", y = "acc", window = 50 }]   # training curves

This module only reads and checks the file's shape; ``plan`` checks every path and value
against ``TrainConfig``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

ROW_KEY = "row"
"""Table key of the named rows (a study's ``rows``), next to the axis paths."""

Scalar = str | int | float | bool
Value = Scalar | list[Scalar]


class StudyError(ValueError):
    """The study file is invalid; the message is one line naming the file and the field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EvalSpec(_Section):
    samples: Annotated[int, Field(ge=1)] | None = None
    """Samples N per run; None: the run config's ``eval_samples``."""
    seed: int | None = None
    """Seed of the evaluation draw; None: each run's training seed."""
    exact: bool = False
    """Also run ``raptb eval --exact`` (enumerable tasks: Expr24); its eval/exact.json values are
    table metrics ``exact.<key>`` (``exact.acc``, ``exact.expected_distinct.6400``)."""


class MetricSpec(_Section):
    key: str
    """Dotted path into eval/metrics.json (``log_pterm_by_length.9``), ``train.<field>`` for the
    last record of the run's metrics.jsonl (``train.log_z``), or ``exact.<path>`` into
    eval/exact.json (needs ``[eval] exact``)."""
    name: str | None = None
    """Column header; None: the key."""
    decimals: Annotated[int, Field(ge=0, le=12)] = 3

    @property
    def label(self) -> str:
        return self.name or self.key


class CurveSpec(_Section):
    """A training-curve chart: ``y`` against ``x``, two fields of the runs' metrics.jsonl, one line
    per run (e.g. the batch accuracy against the distinct correct samples found so far)."""

    x: str = "step"
    y: str
    window: Annotated[int, Field(ge=1)] = 1
    """Trailing moving average of ``y`` over this many records (1: raw)."""
    name: str | None = None
    """Chart title; None: "<y> against <x>"."""

    @property
    def label(self) -> str:
        return self.name or f"{self.y} against {self.x}"


class TableSpec(_Section):
    rows: list[str] | None = None
    """Keys (axis paths or "row") whose values label the table's rows; None: every axis, then
    "row" when the study has named rows (minus the ``columns``)."""
    columns: list[str] = []
    """Keys whose value combinations each get a group of metric columns (a pivot)."""
    headers: dict[str, str] = {}
    """Header of a key's column (e.g. "replay.kind" -> "Replay"); default: the key."""
    labels: dict[str, dict[str, str]] = {}
    """Display text of a key's values (e.g. "replay.kind" -> {"prt": "PRT"})."""
    metrics: list[MetricSpec] = [MetricSpec(key="acc", name="Acc")]
    plots: list[str] | None = None
    """Metric keys that get a chart; None: every table metric."""
    curves: list[CurveSpec] = []
    """Training-curve charts (from metrics.jsonl), after the metric charts."""


class StudySpec(_Section):
    name: str | None = None
    title: str | None = None
    description: str | None = None
    base_config: Path | None = None
    base: dict[str, Any] = {}
    axes: dict[str, list[Value]] = {}
    rows: dict[str, dict[str, Any]] = {}
    extra_cells: list[dict[str, Value]] = []
    seeds: Annotated[list[int], Field(min_length=1)] = [0]
    eval: EvalSpec = EvalSpec()
    table: TableSpec = TableSpec()

    @model_validator(mode="after")
    def _consistent(self) -> StudySpec:
        for path, values in self.axes.items():
            if not values:
                raise ValueError(f"axes.{path}: needs at least one value")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds: repeated seed")
        for index, cell in enumerate(self.extra_cells):
            unknown = sorted(set(cell) - set(self.axes))
            if unknown or set(cell) != set(self.axes):
                raise ValueError(
                    f"extra_cells[{index}]: must set exactly the axes {sorted(self.axes)}"
                    + (f" (unknown: {', '.join(unknown)})" if unknown else "")
                )
        keys = self.table_keys
        placed = self.table_rows + self.table.columns
        for key in placed:
            if key not in keys:
                raise ValueError(f"table: '{key}' is not an axis or 'row' (keys: {keys})")
        if sorted(placed) != sorted(keys):
            raise ValueError(f"table: rows and columns must place each of {keys} exactly once")
        metric_keys = [m.key for m in self.table.metrics]
        for key in self.table.plots or []:
            if key not in metric_keys:
                raise ValueError(f"table.plots: '{key}' is not one of table.metrics")
        for key in metric_keys:
            if key.startswith("exact.") and not self.eval.exact:
                raise ValueError(f"table.metrics: '{key}' needs exact = true in [eval]")
        return self

    @property
    def table_keys(self) -> list[str]:
        """Keys that tell cells apart: the axis paths, then "row" when there are named rows."""
        return [*self.axes, *([ROW_KEY] if self.rows else [])]

    @property
    def table_rows(self) -> list[str]:
        if self.table.rows is not None:
            return self.table.rows
        return [key for key in self.table_keys if key not in self.table.columns]

    @property
    def plot_metrics(self) -> list[MetricSpec]:
        keys = self.table.plots
        return [m for m in self.table.metrics if keys is None or m.key in keys]


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables to dotted paths: ``{"objective": {"beta": 1}}`` -> ``{"objective.beta": 1}``.

    TOML writes ``objective.beta = 1`` as a nested table and ``"objective.beta" = 1`` as one key;
    both mean the same field here.
    """
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{path}."))
        else:
            out[path] = value
    return out


def _normalise(data: dict[str, Any]) -> dict[str, Any]:
    """Dotted paths for axes, rows and extra cells, whichever way the file spelled them."""
    data = dict(data)
    if isinstance(data.get("axes"), dict):
        data["axes"] = flatten(data["axes"])
    if isinstance(data.get("rows"), dict):
        data["rows"] = {
            name: flatten(value) if isinstance(value, dict) else value
            for name, value in data["rows"].items()
        }
    if isinstance(data.get("extra_cells"), list):
        data["extra_cells"] = [
            flatten(cell) if isinstance(cell, dict) else cell for cell in data["extra_cells"]
        ]
    return data


def _error_line(path: Path, exc: ValidationError) -> str:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "study"
    message = first["msg"].removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{path}: {field}: {message}{more}"


def load_study(path: Path) -> StudySpec:
    """Read and check a study file; relative ``base_config`` is resolved against its folder.

    Raises:
        StudyError: missing file, invalid TOML, or a field of the wrong shape (one line).
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StudyError(f"{path}: study file does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise StudyError(f"{path}: not valid TOML: {exc}") from None
    try:
        spec = StudySpec.model_validate(_normalise(data))
    except ValidationError as exc:
        raise StudyError(_error_line(path, exc)) from None
    updates: dict[str, Any] = {}
    if spec.name is None:
        updates["name"] = path.stem
    if spec.base_config is not None and not spec.base_config.is_absolute():
        updates["base_config"] = path.parent / spec.base_config
    return spec.model_copy(update=updates) if updates else spec
