"""What a sweep explores: `SweepSpec`, read from TOML (or built from CLI flags).

    spec = SweepSpec.from_toml("sweep.toml")
    spec.points()          # every combination of the parameter values (a grid)

A spec file::

    board = "pynq-z1"                  # its part's capacity is a constraint; its bus
                                       # width, DRAM and clock are the points' defaults
    search = "auto"                    # grid | nsga2 | tpe | auto (grid when it is small)
    trials = 600                       # points a sampler evaluates (not the grid)
    seed = 0
    tune = 0                           # schedules tuned per conv (0: the default chooser)

    [[models]]                         # one or more; a zoo name or an .onnx path
    name = "resnet18"
    weight = 1.0                       # the weighted sum of cycles is the objective

    [parameters]                       # any HardwareConfig field: a list of values, or
    block_in = [8, 16, 32]             # a range {min, max} of powers of two, or
    block_out = { min = 8, max = 32 }  # {min, max, step} of integers
    inp_buff_size = ["16K", "32K"]     # sizes may be written with K/M suffixes
    alu_ops = [["MIN", "MAX", "ADD", "SHR"], ["MIN", "MAX", "ADD", "SHR", "MUL"]]

    objectives = ["latency_ms", "lut", "bram", "dsp"]  # `vdla.dse.pareto.OBJECTIVES`

    [constraints]
    fits = true                        # the part's LUT, FF, DSP and BRAM
    max_utilization = 0.95             # with fits: each at most this share of the part
    max_latency_ms = 50.0              # optional

The parameters are `vdla.HardwareConfig`'s own fields, checked against
``dataclasses.fields`` when the spec is read: an extension added to the config later is
sweepable with no change here. Every value is what ``HardwareConfig.from_dict`` takes
(``alu_ops`` as lists of op names); `SweepSpec.check_values` refuses, before anything is
evaluated, a value that HardwareConfig refuses for itself (a misspelt op, a negative
size), while values that do not fit together make invalid points, each with its reason.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import itertools
import json
import math
import random
import re
import tomllib
from pathlib import Path
from typing import Any, Mapping, Sequence

from vdla.config import HardwareConfig
from vdla.dse.pareto import check_objectives

__all__ = ["DEFAULT_OBJECTIVES", "SEARCHES", "ModelSpec", "SweepSpec", "parse_param", "parse_value",
           "show_value"]

#: How points are chosen: the whole grid, Optuna's NSGA-II or multi-objective TPE, or the
#: grid when it has at most `GRID_LIMIT` points and NSGA-II otherwise.
SEARCHES = ("auto", "grid", "nsga2", "tpe")
GRID_LIMIT = 2000
#: What a spec that names no objectives optimizes.
DEFAULT_OBJECTIVES = ("latency_ms", "lut", "bram", "dsp")
_TOP_KEYS = ("board", "search", "trials", "seed", "tune", "models", "parameters",
             "objectives", "constraints", "name")
_CONSTRAINTS = ("fits", "max_utilization", "max_latency_ms")
_MODEL_KEYS = ("name", "weight")
_RANGE_KEYS = ("min", "max", "step")
_SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
#: Combinations of the other parameters `SweepSpec.check_values` tries with a value that
#: makes no config with the base's: all of them up to this many, else this many at random.
JOINT_TRIES = 2_000


def _named(unknown: Sequence, known: Sequence[str]) -> str:
    """The `unknown` keys or names, each quoted and, where one is a misspelling of a
    `known` one (`difflib.get_close_matches`), followed by what it is close to: an error
    names what was written, never the whole table it was written in."""
    words = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), list(known), n=1)
        words.append(repr(key) + (f" (did you mean {close[0]!r}?)" if close else ""))
    return ", ".join(words)


def _unknown_keys(table: Mapping, known: Sequence[str]) -> list:
    """The keys of `table` that are not `known`, in the order they were written."""
    return [key for key in table if key not in known]


def parse_value(text: Any) -> Any:
    """A parameter value as written: a number, ``"32K"``-style sizes, or as is."""
    if isinstance(text, str):
        # A sign too: "-32K" is then refused as the number it means, not as a string.
        m = re.fullmatch(r"\s*([+-]?\d+)\s*([KMG])(i?B)?\s*", text, re.IGNORECASE)
        if m:
            return int(m.group(1)) * _SUFFIX[m.group(2).upper()]
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return float(text)
        except ValueError:
            pass
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
    return text


def _expand(name: str, values: Any) -> list:
    """The values of one parameter: a list, or a range table."""
    if isinstance(values, Mapping):
        form = "a range is {min, max} (powers of two) or {min, max, step}"
        unknown = _unknown_keys(values, _RANGE_KEYS)
        if unknown:
            raise ValueError(f"parameter {name!r}: unknown key(s) "
                             f"{_named(unknown, _RANGE_KEYS)} in its range; {form}")
        missing = [key for key in ("min", "max") if key not in values]
        if missing:
            raise ValueError(f"parameter {name!r}: its range lacks "
                             f"{' and '.join(missing)}; {form}")
        lo, hi = parse_value(values["min"]), parse_value(values["max"])
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)) or lo > hi:
            raise ValueError(f"parameter {name!r}: range bounds must be integers with min <= "
                             f"max, not {lo!r}..{hi!r}")
        if "step" in values:
            step = parse_value(values["step"])
            if not isinstance(step, int) or step < 1:
                raise ValueError(f"parameter {name!r}: step must be a positive integer, "
                                 f"not {step!r}")
            return list(range(lo, hi + 1, step))
        if lo < 1:
            raise ValueError(f"parameter {name!r}: a power-of-two range needs min >= 1, "
                             f"not {lo}")
        return [1 << e for e in range(math.ceil(math.log2(lo)), int(math.log2(hi)) + 1)]
    if isinstance(values, (list, tuple)):
        if not values:
            raise ValueError(f"parameter {name!r} has no values")
        return [parse_value(v) for v in values]
    return [parse_value(values)]


def parse_param(text: str) -> tuple[str, list]:
    """A CLI ``--param NAME=V1,V2,...`` (or ``NAME=MIN..MAX``, powers of two). A value
    that joins names with ``+`` is a list, as a spec file writes ``["MIN", "MAX"]``: the
    commas separate values, so ``alu_ops=MIN+MAX+ADD+SHR,MIN+MAX+ADD+SHR+REQ`` is two
    values of alu_ops. Booleans are ``true`` and ``false`` (``alu_hold=false,true``)."""
    name, sep, rest = text.partition("=")
    if not sep or not name.strip() or not rest.strip():
        raise ValueError(f"--param takes NAME=V1,V2,... or NAME=MIN..MAX, not {text!r}")
    name = name.strip()
    if ".." in rest:
        lo, _, hi = rest.partition("..")
        return name, _expand(name, {"min": lo.strip(), "max": hi.strip()})
    values = []
    for v in rest.split(","):
        v = v.strip()
        # A leading sign is a number's ("+8"), not a list's separator.
        values.append([part.strip() for part in v.split("+")] if "+" in v[1:] else v)
    return name, _expand(name, values)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A model of the sweep: a zoo name or an ONNX path, and its weight in the objective."""

    name: str
    weight: float = 1.0


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """A sweep (see the module docstring for the file format).

    board : the board name (`vdla.boards`); its part bounds the resources
    models : the `ModelSpec` s; the cycles objective is their weighted sum
    parameters : HardwareConfig field -> the values to try (in order)
    objectives : objective names (`vdla.dse.pareto.OBJECTIVES`, which says whether each
        is minimized or maximized)
    fits : points that do not fit the part are kept but are not on the front
    max_utilization : with `fits`, the share of each of the part's resources a point may
        use (0 < x <= 1; 1, the default: all of it). Below 1 it leaves room for what a
        system puts beside the accelerator (the processing system's interconnect, a
        video pipeline) and for the resource model's error, and keeps a design off the
        last block RAMs, where placement and timing get hard.
    max_latency_ms : points slower than this (weighted) are kept but not on the front
    search, trials, seed : how points are chosen (`SEARCHES`)
    tune : trials per convolution when each point's schedules are tuned
        (`vdla.dse.evaluate`); 0 takes the default chooser's schedules
    name : a label for reports (default: the file's stem)
    """

    board: str
    models: tuple[ModelSpec, ...]
    parameters: Mapping[str, tuple]
    objectives: tuple[str, ...] = DEFAULT_OBJECTIVES
    fits: bool = True
    max_utilization: float = 1.0
    max_latency_ms: float | None = None
    search: str = "auto"
    trials: int = 500
    seed: int = 0
    tune: int = 0
    name: str = "sweep"

    def __post_init__(self):
        if not self.models:
            raise ValueError("a sweep needs at least one model ([[models]] name = ...)")
        for m in self.models:
            if not isinstance(m.weight, (int, float)) or isinstance(m.weight, bool) or not (
                    m.weight > 0 and math.isfinite(m.weight)):
                raise ValueError(f"model {m.name!r}: weight must be a positive number, "
                                 f"not {m.weight!r}")
        if len({m.name for m in self.models}) != len(self.models):
            raise ValueError("a model is listed twice in the sweep")
        fields = {f.name for f in dataclasses.fields(HardwareConfig)}
        unknown = sorted(set(self.parameters) - fields)
        if unknown:
            raise ValueError(f"unknown sweep parameter(s) {_named(unknown, sorted(fields))}; "
                             f"the parameters are HardwareConfig's fields: "
                             f"{', '.join(sorted(fields))}")
        if not self.parameters:
            raise ValueError("a sweep needs at least one parameter with values")
        for name, values in self.parameters.items():
            if not values:
                raise ValueError(f"parameter {name!r} has no values")
        check_objectives(list(self.objectives))
        if self.search not in SEARCHES:
            raise ValueError(f"unknown search {_named([self.search], SEARCHES)}; known: "
                             f"{', '.join(SEARCHES)}")
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 1:
            raise ValueError(f"trials must be a positive integer, not {self.trials!r}")
        if isinstance(self.tune, bool) or not isinstance(self.tune, int) or self.tune < 0:
            raise ValueError(f"tune must be a non-negative integer, not {self.tune!r}")
        if (isinstance(self.max_utilization, bool)
                or not isinstance(self.max_utilization, (int, float))
                or not 0 < self.max_utilization <= 1):
            raise ValueError(f"max_utilization must be a number above 0 and at most 1 (a "
                             f"share of each resource of the part), not "
                             f"{self.max_utilization!r}")
        if self.max_latency_ms is not None and not (
                isinstance(self.max_latency_ms, (int, float)) and self.max_latency_ms > 0):
            raise ValueError(f"max_latency_ms must be a positive number, not {self.max_latency_ms!r}")

    # --- reading ------------------------------------------------------------------------

    @classmethod
    def from_toml(cls, path: str | Path) -> "SweepSpec":
        """Read a spec file; ValueError naming the file and what is wrong."""
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"sweep spec {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"sweep spec {path} is not valid TOML: {exc}") from None
        try:
            return cls.from_dict(data, name=path.stem)
        except ValueError as exc:
            raise ValueError(f"sweep spec {path}: {exc}") from None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, name: str = "sweep") -> "SweepSpec":
        unknown = _unknown_keys(data, _TOP_KEYS)
        if unknown:
            raise ValueError(f"unknown key(s) {_named(unknown, _TOP_KEYS)}; a sweep spec has "
                             f"{', '.join(_TOP_KEYS)}")
        if "board" not in data:
            raise ValueError("a sweep spec names its board: board = \"pynq-z1\"")
        models = []
        for m in data.get("models", []):
            if isinstance(m, str):
                m = {"name": m}
            if not isinstance(m, Mapping):
                raise ValueError(f"a model is a name (a zoo model or an .onnx path) or a "
                                 f"table {{name = ..., weight = ...}}, not {m!r}")
            unknown = _unknown_keys(m, _MODEL_KEYS)
            if unknown:
                which = f"model {m['name']!r}" if "name" in m else "a model in [[models]]"
                raise ValueError(f"{which}: unknown key(s) {_named(unknown, _MODEL_KEYS)}; "
                                 f"a model has {', '.join(_MODEL_KEYS)}")
            if "name" not in m:
                raise ValueError("a model in [[models]] has no name (name = \"resnet18\")")
            models.append(ModelSpec(str(m["name"]), m.get("weight", 1.0)))
        params = data.get("parameters", {})
        if not isinstance(params, Mapping):
            raise ValueError("[parameters] must be a table of HardwareConfig fields")
        objectives = data.get("objectives", DEFAULT_OBJECTIVES)
        if not isinstance(objectives, (list, tuple)):
            raise ValueError(f"objectives is a list of names, such as {list(DEFAULT_OBJECTIVES)}")
        constraints = data.get("constraints", {})
        if not isinstance(constraints, Mapping):
            raise ValueError(f"[constraints] must be a table holding "
                             f"{', '.join(_CONSTRAINTS)}, not {constraints!r}")
        unknown = _unknown_keys(constraints, _CONSTRAINTS)
        if unknown:
            raise ValueError(f"unknown constraint(s) {_named(unknown, _CONSTRAINTS)}; "
                             f"[constraints] may hold {', '.join(_CONSTRAINTS)}")
        if not isinstance(constraints.get("fits", True), bool):
            raise ValueError(f"constraint fits must be true or false, not "
                             f"{constraints['fits']!r}")
        return cls(board=str(data["board"]), models=tuple(models),
                   parameters={k: tuple(_expand(k, v)) for k, v in params.items()},
                   objectives=tuple(objectives), fits=bool(constraints.get("fits", True)),
                   max_utilization=constraints.get("max_utilization", 1.0),
                   max_latency_ms=constraints.get("max_latency_ms"),
                   search=data.get("search", "auto"), trials=data.get("trials", 500),
                   seed=data.get("seed", 0), tune=data.get("tune", 0),
                   name=str(data.get("name", name)))

    # --- the space ----------------------------------------------------------------------

    @property
    def grid_size(self) -> int:
        return math.prod(len(v) for v in self.parameters.values())

    @property
    def method(self) -> str:
        """The search that runs: `search`, with ``auto`` resolved."""
        if self.search != "auto":
            return self.search
        return "grid" if self.grid_size <= GRID_LIMIT else "nsga2"

    def points(self) -> list[dict]:
        """Every combination of the parameter values (the grid), in a fixed order."""
        names = list(self.parameters)
        return [dict(zip(names, combo))
                for combo in itertools.product(*(self.parameters[n] for n in names))]

    def check_values(self, base: HardwareConfig | None = None) -> None:
        """ValueError naming every parameter value that `HardwareConfig` refuses for
        itself, with its own reason (what the field allows), before anything is evaluated:
        a misspelt ALU op, a negative size, a block that is no power of two.

        Each value is tried alone in `base` (the board's default config; default
        HardwareConfig's). HardwareConfig names the field first (``HardwareConfig.<name>
        must ...``) when the value itself is wrong, and the sizes of the whole config
        (``HardwareConfig (batch=...)``, ``HardwareConfig.<name>=N holds ...``) when values
        do not fit together: that joint invalidity stays what it is, an invalid point
        with its reason (a 128K acc buffer needs blocks of 16; with blocks of 8 the GEMM
        instruction overflows). As a guard, a value is refused only when no combination
        of the other parameters' values makes a config with it either.
        """
        base_fields = (base or HardwareConfig()).to_dict()
        alone = {(name, i): _config_error({**base_fields, name: value})
                 for name, values in self.parameters.items() for i, value in enumerate(values)}
        # The partners tried are the values that make a config alone (a parameter with
        # none keeps the base's): one misspelt ALU op must not make every other value
        # look bad.
        partners = {}
        for name, values in self.parameters.items():
            good = tuple(v for i, v in enumerate(values) if alone[name, i] is None)
            if good:
                partners[name] = good
        problems = []
        for name, values in self.parameters.items():
            others = {n: v for n, v in partners.items() if n != name}
            for i, value in enumerate(values):
                error = alone[name, i]
                if error is None or not error.startswith(f"HardwareConfig.{name} ") or any(
                        _config_error({**base_fields, **combo, name: value}) is None
                        for combo in _combinations(others, JOINT_TRIES, self.seed)):
                    continue
                problems.append(f"{name} = {show_value(value)}: {error}")
        if problems:
            # HardwareConfig's messages hold semicolons: several go on lines of their own.
            raise ValueError(f"{len(problems)} parameter value(s) make no HardwareConfig "
                             "with any combination of the other parameters' values:"
                             + (f" {problems[0]}" if len(problems) == 1
                                else "".join(f"\n  {p}" for p in problems)))

    def to_dict(self) -> dict:
        return {"name": self.name, "board": self.board, "search": self.search,
                "trials": self.trials, "seed": self.seed, "tune": self.tune,
                "models": [dataclasses.asdict(m) for m in self.models],
                "parameters": {k: list(v) for k, v in self.parameters.items()},
                "objectives": list(self.objectives),
                "constraints": {"fits": self.fits, "max_latency_ms": self.max_latency_ms,
                                **({"max_utilization": self.max_utilization}
                                   if self.max_utilization != 1.0 else {})}}

    @property
    def key(self) -> str:
        """A hash of what the sweep explores (its points are listed under it in a store)."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def replace(self, **changes) -> "SweepSpec":
        return dataclasses.replace(self, **changes)


def _config_error(fields: Mapping[str, Any]) -> str | None:
    """Why `fields` make no HardwareConfig (its own check's message), or None."""
    try:
        HardwareConfig.from_dict(fields)
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None


def _combinations(parameters: Mapping[str, Sequence], limit: int, seed: int):
    """The combinations of `parameters`' values (dicts): every one when there are at most
    `limit`, else `limit` drawn at random (seeded: the same spec, the same answer)."""
    names = list(parameters)
    if math.prod(len(v) for v in parameters.values()) <= limit:
        for combo in itertools.product(*(parameters[n] for n in names)):
            yield dict(zip(names, combo))
        return
    rng = random.Random(seed)
    for _ in range(limit):
        yield {n: rng.choice(parameters[n]) for n in names}


def show_value(value: Any) -> str:
    """A parameter value as a spec writes it (lists, names and booleans in TOML's
    JSON-like form: ``["MIN", "REQ"]``, ``true``)."""
    if isinstance(value, (list, tuple, str, bool)):
        return json.dumps(list(value) if isinstance(value, tuple) else value)
    return repr(value)
