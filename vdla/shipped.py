"""Configs shipped with vdla, and the one loader behind every ``--config``.

A shipped config is a JSON document in the package's ``configs`` folder, named by its
file's stem (``pynq-z1-plus``). Besides the config it says what the design is for and
where its figures come from, which `HardwareConfig` itself must not carry (two configs
with the same parameters are the same design, whatever was measured on them)::

    {"description": "...", "board": "pynq-z1",
     "config": {...vdla's keys, VTA's, or a `vdla config show --json` document...},
     "figures": {"fits": true, "resources": {...}, "runs": [...]}}

`resolve_config` is what ``--config`` means on every command: a path that exists wins,
else the name of a shipped config, else an error naming both readings and the shipped
names. Importing this module is light (no numpy): the command line imports it at start.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from pathlib import Path
from typing import Any, Mapping

from vdla.config import HardwareConfig

__all__ = ["SHIPPED_DIR", "Resolved", "ShippedConfig", "load_config", "resolve_config",
           "shipped", "shipped_configs", "shipped_names"]

#: The package-data folder of the shipped configs (pyproject.toml's package-data).
SHIPPED_DIR = Path(__file__).resolve().parent / "configs"

#: The top-level keys of a shipped config's document: required, then optional.
DOCUMENT_KEYS = ("config", "description", "board", "figures")
_REQUIRED_KEYS = ("config", "description")


@dataclasses.dataclass(frozen=True)
class ShippedConfig:
    """One shipped config: the design and what is known about it.

    name : the shipped name (the file's stem), what ``--config NAME`` takes
    config : the `HardwareConfig`
    description : a sentence or two on what the design is and why
    board : the board it is meant for (a `vdla boards` name), or None
    figures : its measured figures as the file records them: ``fits`` (bool, whether it
        fits the board), ``resources`` (each resource: ``used`` and ``of``, with a
        ``source``), ``runs`` (models run on it: ``model``, ``cycles``, ``backend``,
        ``bit_exact``, ``commit``, the commit they were measured at, and optionally
        ``baseline``: another config's ``config`` name and ``cycles``). The runs are
        `bench/model_layers.py`'s totals in the documentation's figures, copied by hand
        when those are measured again (tests/vdla/test_shipped.py checks the two agree)
    path : the file it was read from
    """

    name: str
    config: HardwareConfig
    description: str
    board: str | None
    figures: Mapping[str, Any]
    path: Path

    @property
    def fits(self) -> bool | None:
        """Whether the file's figures say the config fits its board (None: not said)."""
        return self.figures.get("fits")

    def to_dict(self) -> dict[str, Any]:
        """What ``vdla config list --json`` prints for it."""
        return {"name": self.name, "config_name": self.config.name,
                "extensions": list(self.config.extensions), "board": self.board,
                "fits": self.fits, "description": self.description,
                "figures": dict(self.figures), "config": self.config.to_dict()}


@dataclasses.dataclass(frozen=True)
class Resolved:
    """What a ``--config`` value named: the config, and the shipped entry when it was a
    shipped name or a path to a shipped config's document (else None)."""

    config: HardwareConfig
    shipped: ShippedConfig | None = None


def shipped_names() -> list[str]:
    """The names of the shipped configs, sorted."""
    return sorted(path.stem for path in SHIPPED_DIR.glob("*.json"))


def shipped(name: str) -> ShippedConfig:
    """The shipped config `name`.

    name : a shipped name (see `shipped_names`)
    Raises ValueError naming the shipped configs when there is none of that name, or what
    is wrong with its file.
    """
    if name not in shipped_names():
        raise ValueError(f"no shipped config {name!r}; shipped: {_listing()}")
    path = SHIPPED_DIR / f"{name}.json"
    return _read_document(path, name)


def shipped_configs() -> list[ShippedConfig]:
    """Every shipped config, sorted by name."""
    return [shipped(name) for name in shipped_names()]


def resolve_config(spec: str | os.PathLike | None) -> Resolved:
    """What ``--config SPEC`` names, on every command.

    spec : a path to a config JSON (vdla's keys, VTA's ``vta_config.json``, a ``vdla
        config show --json`` document or a shipped config's document), or the name of a
        shipped config; None for VTA's default config
    A path that exists wins over a shipped name (a user's own file is never shadowed).
    Raises ValueError when `spec` is neither, naming the shipped configs, or naming the
    file and what is wrong with it.
    """
    if spec is None:
        return Resolved(HardwareConfig())
    path = Path(spec)
    if path.exists():
        return _read_path(path)
    text = os.fspath(spec)
    if text in shipped_names():
        entry = shipped(text)
        return Resolved(entry.config, entry)
    close = difflib.get_close_matches(text, shipped_names(), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"cannot read hardware config {text!r}: no such file, and no shipped config has "
        f"that name (shipped: {_listing()}; `vdla config list` describes them){hint}")


def load_config(spec: str | os.PathLike | None) -> HardwareConfig:
    """The config ``--config SPEC`` names (see `resolve_config`); VTA's default for None."""
    return resolve_config(spec).config


def _listing() -> str:
    return ", ".join(shipped_names()) or "none"


def _read_path(path: Path) -> Resolved:
    """The config in the file `path`: a shipped config's document (told apart by its
    ``config`` key, which no config form has) or anything `HardwareConfig.from_dict`
    reads. Errors say which file, as `HardwareConfig.from_json`'s do."""
    where = f"hardware config {str(path)!r}"
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ValueError(f"cannot read {where}: {why}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not valid JSON: {exc}") from None
    if isinstance(data, Mapping) and "config" in data:
        entry = _parse_document(data, path.stem, path, where)
        # The document of a shipped config, given by path, is that shipped config.
        return Resolved(entry.config, entry if path.resolve().parent == SHIPPED_DIR else None)
    try:
        return Resolved(HardwareConfig.from_dict(data))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def _read_document(path: Path, name: str) -> ShippedConfig:
    where = f"shipped config {name!r} ({path})"
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where} cannot be read: {exc}") from None
    return _parse_document(data, name, path, where)


def _parse_document(data: Any, name: str, path: Path, where: str) -> ShippedConfig:
    """A shipped config's document `data`, checked key by key (a misspelt key is refused,
    never ignored: the figures are what `vdla config list` reports).

    data : the parsed JSON
    name, path : the entry's name and the file it came from
    where : how errors name the file
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be a JSON object, not {type(data).__name__}")
    unknown = sorted(set(data) - set(DOCUMENT_KEYS), key=str)
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; "
                         f"a shipped config's document has {', '.join(DOCUMENT_KEYS)}")
    missing = [key for key in _REQUIRED_KEYS if key not in data]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(map(repr, missing))}")
    try:
        config = HardwareConfig.from_dict(data["config"])
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{where}: config: {exc}") from None
    description, board = data["description"], data.get("board")
    if not isinstance(description, str) or not description.strip():
        raise ValueError(f"{where}: description must be a non-empty string, not "
                         f"{description!r}")
    if board is not None and not isinstance(board, str):
        raise ValueError(f"{where}: board must be a board's name or null, not {board!r}")
    figures = data.get("figures", {})
    _check_figures(figures, where)
    return ShippedConfig(name=name, config=config, description=description, board=board,
                         figures=figures, path=path)


def _check_figures(figures: Any, where: str) -> None:
    """ValueError naming the first figure of the wrong type (the ones `vdla config list`
    reads; others are kept as they are, for the reader of the file)."""
    if not isinstance(figures, Mapping):
        raise ValueError(f"{where}: figures must be a JSON object, not {figures!r}")
    fits = figures.get("fits")
    if fits is not None and not isinstance(fits, bool):
        raise ValueError(f"{where}: figures.fits must be true, false or null, not {fits!r}")
    resources = figures.get("resources", {})
    if not isinstance(resources, Mapping):
        raise ValueError(f"{where}: figures.resources must be a JSON object, not {resources!r}")
    for resource, use in resources.items():
        if resource == "source":
            continue
        if not (isinstance(use, Mapping) and all(_is_number(use.get(k)) for k in ("used", "of"))):
            raise ValueError(f"{where}: figures.resources.{resource} must be "
                             f'{{"used": number, "of": number}}, not {use!r}')
    runs = figures.get("runs", [])
    if not isinstance(runs, list):
        raise ValueError(f"{where}: figures.runs must be a list, not {runs!r}")
    for i, run in enumerate(runs):
        if not (isinstance(run, Mapping) and isinstance(run.get("model"), str)
                and _is_number(run.get("cycles"))):
            raise ValueError(f"{where}: figures.runs[{i}] needs a 'model' name and a number "
                             f"of 'cycles', not {run!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
