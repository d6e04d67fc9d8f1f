"""A compiled model as a script of device calls, to run where no compiler is: the model
half of ``vdla deploy``'s bundle (`vdla.compiler.targets.vdla.export` records it). Board
side (`vdla.deploy.board`): the standard library, numpy and vdla's light core.

    script = DeviceScript.load("bundle/model")        # model.json + model.npz
    outputs, runs = script.play(device, {"input_q": q})   # int8 in, int8 out
    outputs, runs = run_exported(script, device, {"input": x})   # float in and out

A model on the accelerator is, seen from the device, a fixed sequence of calls: allocate
the buffers, arenas and programs; write the weights and programs; write the quantized
inputs; run each op's program; read the outputs. The exporter records that sequence
from a session on the functional simulator, and this module plays it back on any
`vdla.runtime.Device` (a simulator's, a remote one, a board's
`vdla.deploy.board_device.BoardDevice`) or, on a board without vdla, the DMA region of
`vdla.deploy.board.hardware.RegionDevice`. Playing needs numpy and the ISA's encoding,
nothing of the compiler.

The steps (``model.json``'s ``steps``, in order):

- ``alloc``: ``bytes``, and ``at``, the address the recording got. A device's allocator
  hands out the same offsets from its `Device.base` for the same sequence, and the
  play checks that it does; a device with ``place`` (`RegionDevice`) puts the buffer
  at ``at`` itself, its base a multiple of the script's ``dram_alignment``.
- ``write``: array ``blob`` of ``model.npz`` at ``at``; with ``program``, the bytes are
  instructions, whose LOAD/STORE addresses move by the device's `base`
  (`vdla.isa.relocate.relocate_encoded`): the accelerator has no base register, so a
  board's programs carry bus addresses.
- ``input``: input ``tensor``'s bytes at ``at``: ``q.reshape(-1)[map]``, where ``map``
  (an int32 array of ``model.npz``) gives the element each byte holds and -1 a byte of
  padding (zero). The maps are the compiler's packing (blocked layout, tap packing)
  written down, so the player does not need the compiler's code for it.
- ``run``: the program at ``at``, ``count`` instructions (op ``op``).
- ``output``: output ``tensor``'s bytes, read at ``at`` (``bytes``); the value is
  ``raw[map]`` over the output's reads concatenated, reshaped to its shape.

`DeviceScript.play` frees what it allocated, so a device plays a script again and again.

`run_exported` adds the host's two ends: the float inputs quantized and the int8
outputs dequantized with the arithmetic of the compiler's reference kernels
(``quantize``, ``dequantize``), which `quantize` and `dequantize` here are.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from vdla.config import HardwareConfig
from vdla.isa.encoding import decode_stream
from vdla.isa.program import Program
from vdla.isa.relocate import relocate_encoded

__all__ = ["FORMAT", "BundleError", "DeviceScript", "dequantize", "quantize", "run_exported"]

#: The version of ``model.json``'s layout; a player refuses another.
FORMAT = "vdla-device-script/1"
STEPS = ("alloc", "write", "input", "run", "output")


class BundleError(ValueError):
    """A device script that cannot be played: malformed, for another config, or a device
    that does not place it as it was recorded."""


@dataclasses.dataclass(frozen=True)
class DeviceScript:
    """config : the `HardwareConfig` the programs are encoded for
    steps : the device calls (module docstring), in order
    arrays : ``model.npz``'s arrays by name (blobs and maps)
    inputs, outputs : per tensor: ``name``, ``shape`` (int8 values)
    dram_bytes : the DRAM the recording used, from address 0 (a board's DMA region must
        hold at least this)
    meta : the rest of ``model.json`` (the model, its ops, the host's quantize and
        dequantize, which the exporter's own runner applies)
    """

    config: HardwareConfig
    steps: tuple[dict, ...]
    arrays: Mapping[str, np.ndarray]
    inputs: tuple[dict, ...]
    outputs: tuple[dict, ...]
    dram_bytes: int
    meta: dict

    # --- files ------------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {"format": FORMAT, "config": self.config.to_dict(),
                "dram_bytes": self.dram_bytes, "inputs": list(self.inputs),
                "outputs": list(self.outputs), "steps": list(self.steps), **self.meta}

    @classmethod
    def load(cls, folder: str | os.PathLike) -> "DeviceScript":
        """The script of ``model.json`` and ``model.npz`` in `folder`.

        folder : the script's folder (a bundle's ``model/``)
        BundleError for missing or unreadable files, another format, or a layout that is
        not the one `to_json` writes (each field's type and range is checked, naming the
        field, its value and what is allowed), and steps naming arrays that are not
        there."""
        folder = Path(folder)
        where = folder / "model.json"
        try:
            data = json.loads(where.read_text())
            with np.load(folder / "model.npz", allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in npz.files}
        except (OSError, ValueError, RecursionError, EOFError, zipfile.BadZipFile) as exc:
            raise BundleError(f"{os.fspath(folder)}: not a device script ({exc})") from None
        if not isinstance(data, dict):
            raise BundleError(f"{where}: a JSON object is needed, not a {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise BundleError(f"{where}: format {data.get('format')!r}; this "
                              f"vdla plays {FORMAT!r}: export the model with this vdla")
        try:
            config = HardwareConfig.from_dict(data.pop("config"))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BundleError(f"{where}: bad config ({exc})") from None
        _check_layout(data, where)
        keys = ("format", "dram_bytes", "inputs", "outputs", "steps")
        script = cls(config, tuple(data["steps"]), arrays, tuple(data["inputs"]),
                     tuple(data["outputs"]), data["dram_bytes"],
                     {k: v for k, v in data.items() if k not in keys})
        script.check()
        return script

    def check(self) -> None:
        """BundleError for a step of an unknown kind, a field of the wrong type or range,
        or naming a missing array or tensor, and for maps that are not integer arrays."""
        for i, step in enumerate(self.steps):
            kind = step.get("do") if isinstance(step, dict) else None
            if kind not in STEPS:
                raise BundleError(f"step {i}: unknown kind {kind!r} (allowed {list(STEPS)})")
            for field, low in _STEP_FIELDS[kind].items():
                _natural(step.get(field), low, f"step {i} ({kind}): {field}")
            if not isinstance(step.get("op", ""), str):
                raise BundleError(f"step {i} ({kind}): op must be a string, not "
                                  f"{step['op']!r:.80}")
            needed = {"write": "blob", "input": "map"}.get(kind)
            if needed and needed not in step:
                raise BundleError(f"step {i} ({kind}): needs a {needed}")
            for key in ("blob", "map"):
                if key in step:
                    self._array(step[key], key == "map", f"step {i} ({kind})")
            if kind in ("input", "output"):
                listed = self.inputs if kind == "input" else self.outputs
                if not step["tensor"] < len(listed):
                    raise BundleError(f"step {i} ({kind}): tensor {step['tensor']} of "
                                      f"{len(listed)}")
        for t in self.outputs:
            self._array(t["map"], True, f"output {t['name']!r}")

    def _array(self, name, is_map: bool, what: str) -> None:
        if not isinstance(name, str) or name not in self.arrays:
            raise BundleError(f"{what}: array {name!r:.80} is not in model.npz")
        if is_map and self.arrays[name].dtype.kind not in "iu":
            raise BundleError(f"{what}: map {name!r} is {self.arrays[name].dtype}, not an "
                              "integer array")

    # --- playing ----------------------------------------------------------------------------

    def play(self, device, inputs: Mapping[str, np.ndarray]) -> tuple[dict, list[dict]]:
        """Run the script on `device` (open, of this script's config) with the int8
        `inputs` (by tensor name); returns ({output tensor name: int8 array}, the stats of
        each run, in order, with ``op``). BundleError for a device of another config, one
        whose DRAM is too small or that places an allocation elsewhere than recorded, or
        inputs of the wrong names, shapes or types."""
        if device.config != self.config:
            raise BundleError(f"the model is compiled for config {self.config.name}; the "
                              f"device runs {device.config.name}")
        values = self._inputs(inputs)
        base = int(getattr(device, "base", 0))
        placing = hasattr(device, "place")
        align = int(self.meta.get("dram_alignment", 1))
        if placing and base % align:
            raise BundleError(f"the device's DRAM starts at {base:#x}, not a multiple of "
                              f"{align} bytes, the config's DRAM alignment")
        if device.dram_size < self.dram_bytes:
            raise BundleError(f"the model needs {self.dram_bytes:,} bytes of DRAM; the "
                              f"device has {device.dram_size:,}")
        allocated, raw, runs = [], [[] for _ in self.outputs], []
        try:
            for i, step in enumerate(self.steps):
                kind = step["do"]
                if kind == "alloc" and placing:
                    device.place(step["at"], step["bytes"])
                elif kind == "alloc":
                    addr = device.alloc(step["bytes"])
                    allocated.append(addr)
                    if addr != step["at"] + base:
                        raise BundleError(
                            f"step {i}: the device allocated {step['bytes']:,} bytes at "
                            f"{addr:#x}, not at {step['at'] + base:#x} as recorded (offset "
                            f"{step['at']:#x} from its base {base:#x}): its allocator differs")
                elif kind == "write":
                    data = self.arrays[step["blob"]]
                    if step.get("program") and base:
                        data = self._moved(step["blob"], base)
                    device.write(step["at"] + base, data)
                elif kind == "input":
                    flat = values[step["tensor"]].reshape(-1)
                    index = self._map(step["map"], flat.size, f"step {i} (input)")
                    device.write(step["at"] + base,
                                 np.where(index >= 0, flat[np.maximum(index, 0)], 0)
                                 .astype(np.int8))
                elif kind == "run":
                    stats = device.run(step["at"] + base, step["count"])
                    runs.append({"op": step.get("op", ""), **stats})
                else:
                    raw[step["tensor"]].append(device.read(step["at"] + base, step["bytes"]))
        finally:
            for addr in reversed(allocated):
                device.free(addr)
        outputs = {}
        for i, out in enumerate(self.outputs):
            data = np.concatenate(raw[i]) if raw[i] else np.zeros(0, np.uint8)
            index = self._map(out["map"], data.size, f"output {out['name']!r}")
            if (index < 0).any() or index.size != int(np.prod(out["shape"])):
                raise BundleError(f"output {out['name']!r}: map {out['map']!r} has "
                                  f"{index.size} elements, a negative one or not the "
                                  f"{int(np.prod(out['shape']))} of shape {out['shape']}")
            outputs[out["name"]] = data[index].view(np.int8).reshape(out["shape"])
        return outputs, runs

    def _map(self, name: str, size: int, what: str) -> np.ndarray:
        """Map `name`, checked to index an array of `size` elements (-1: padding)."""
        index = self.arrays[name]
        if index.size and (int(index.max()) >= size or int(index.min()) < -1):
            raise BundleError(f"{what}: map {name!r} holds indices {int(index.min())}.."
                              f"{int(index.max())}, outside -1..{size - 1}")
        return index

    def _inputs(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        names = [t["name"] for t in self.inputs]
        if set(inputs) != set(names):
            raise BundleError(f"the model's int8 inputs are {names}, not {sorted(inputs)}")
        out = []
        for t in self.inputs:
            x = np.asarray(inputs[t["name"]])
            if x.dtype != np.int8 or list(x.shape) != list(t["shape"]):
                raise BundleError(f"input {t['name']!r} must be int8 of shape "
                                  f"{tuple(t['shape'])}, not {x.dtype} {x.shape}")
            out.append(x)
        return out

    def _moved(self, blob: str, base: int) -> bytes:
        """Program `blob` with every LOAD/STORE moved by `base` bytes."""
        encoded = self.arrays[blob].tobytes()
        program = Program(tuple(decode_stream(encoded, self.config)), self.config)
        return relocate_encoded(program, encoded, base, self.config)


#: Each step kind's integer fields, with the least value each may take.
_STEP_FIELDS = {"alloc": {"at": 0, "bytes": 1}, "write": {"at": 0},
                "input": {"at": 0, "tensor": 0}, "run": {"at": 0, "count": 1},
                "output": {"at": 0, "bytes": 0, "tensor": 0}}


def _natural(value, low: int, what: str) -> int:
    """`value`, an integer of at least `low`; BundleError naming `what` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BundleError(f"{what} must be an integer of at least {low}, not {value!r:.80}")
    return value


def _shape(value, what: str) -> None:
    if not isinstance(value, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value):
        raise BundleError(f"{what} must be a list of non-negative integers, not "
                          f"{value!r:.80}")


def _scale(value, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or value == float("inf"):
        raise BundleError(f"{what} must be a positive number, not {value!r:.80}")


def _check_layout(data: dict, where: Path) -> None:
    """BundleError naming the first field of ``model.json`` (`data`, its config taken
    out) whose type or range is not the layout `DeviceScript.to_json` writes."""
    _natural(data.get("dram_bytes"), 0, f"{where}: dram_bytes")
    if "dram_alignment" in data:
        _natural(data["dram_alignment"], 1, f"{where}: dram_alignment")
    for key in ("steps", "inputs", "outputs"):
        if not isinstance(data.get(key), list) or not all(
                isinstance(item, dict) for item in data[key]):
            raise BundleError(f"{where}: {key} must be a list of JSON objects, not "
                              f"{data.get(key)!r:.80}")
    for kind, fields in (("inputs", ("name", "from")), ("outputs", ("name", "to", "map"))):
        for i, t in enumerate(data[kind]):
            what = f"{where}: {kind}[{i}]"
            for field in fields:
                if not isinstance(t.get(field), str):
                    raise BundleError(f"{what}: {field} must be a string, not "
                                      f"{t.get(field)!r:.80}")
            _shape(t.get("shape"), f"{what}: shape")
            ends = ("quantize", "from_shape") if kind == "inputs" else ("dequantize",)
            end = t.get(ends[0])
            if not isinstance(end, dict):
                raise BundleError(f"{what}: {ends[0]} must be a JSON object, not {end!r:.80}")
            _scale(end.get("scale"), f"{what}: {ends[0]} scale")
            if kind == "inputs":
                _shape(t.get("from_shape"), f"{what}: from_shape")


def quantize(x, scale: float) -> np.ndarray:
    """Float `x` to int8 at `scale`: x / scale rounded half up, clipped to [-128, 127]:
    the compiler's reference ``quantize`` kernel's arithmetic, in float64."""
    q = np.floor(np.asarray(x, dtype=np.float64) / float(scale) + 0.5)
    return np.clip(q, -128, 127).astype(np.int8)


def dequantize(q: np.ndarray, scale: float) -> np.ndarray:
    """Int8 `q` at `scale` to float32 (the reference ``dequantize``: in float64, then
    rounded to float32)."""
    return (np.asarray(q).astype(np.float64) * float(scale)).astype(np.float32)


def run_exported(script: DeviceScript | str | os.PathLike, device,
                 feed: Mapping[str, Any]) -> tuple[dict, list[dict]]:
    """Run an exported model on `device`: the float `feed` (graph input -> array)
    quantized as the model's host did, the script played, its outputs dequantized.

    script : a `DeviceScript`, or the folder of one
    device : what `DeviceScript.play` plays on
    feed : graph input name -> float array of the input's shape
    Returns ({graph output: float32 array}, the stats of each run). BundleError for a
    feed missing an input or of the wrong shape, or a quantize of another dtype than
    int8."""
    if not isinstance(script, DeviceScript):
        script = DeviceScript.load(script)
    q = {}
    for t in script.inputs:
        if t["from"] not in feed:
            raise BundleError(f"the model's input {t['from']!r} is missing from the feed "
                              f"(it has {sorted(feed)})")
        x = np.asarray(feed[t["from"]], np.float32)
        if list(x.shape) != list(t["from_shape"]):
            raise BundleError(f"input {t['from']!r} must have shape {tuple(t['from_shape'])}, "
                              f"not {x.shape}")
        if t["quantize"].get("dtype", "int8") != "int8":
            raise BundleError(f"input {t['from']!r}: quantize to {t['quantize']['dtype']!r}; "
                              "only 'int8' is supported")
        q[t["name"]] = quantize(x, t["quantize"]["scale"])
    outputs, runs = script.play(device, q)
    out = {t["to"]: dequantize(outputs[t["name"]], t["dequantize"]["scale"])
           for t in script.outputs}
    return out, runs
