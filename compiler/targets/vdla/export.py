"""The accelerator's stand-alone form of a compiled model (`VdlaTarget.export`, ``vdla
deploy``): a device script (`vdla.deploy.board.player.DeviceScript`) that plays the model
on any device without the compiler, and the host's two ends of it (`run_exported`,
there too, re-exported here: the board runs it).

    folder = export_model(compiled, "bundle/model", example)  # model.json, model.npz
    outputs, runs = run_exported("bundle/model", device, {"input": x})   # float in/out

**Recording.** The model runs once on the functional simulator through a device that
writes down every call (`_Recorder`). Which writes carry an input and which reads an
output is known from the session (`VdlaSession.locations`); every other write is the
model's own data (weights, micro-ops, programs), kept byte for byte. How an input's
int8 values become the bytes written (the blocked layout, tap packing) is the
session's own `put`, written down as an index map by probing it: each probe writes the
digits (base 127) of every element's index plus one, so the bytes written spell out
which element each came from, and zero marks padding. A random probe then checks the
map. Outputs are mapped the same way through `fetch`. The exported script is finally
played on a fresh functional simulator, host ends included, and must give the recorded
run's outputs.

A folder also gets a README.md saying what its files are.

**Host ends.** A model exports when the accelerator runs everything between its
inputs' ``quantize`` and its outputs' ``dequantize`` (which the runner computes with the
reference kernels); a model with another host op, between accelerator ops, is refused,
naming it: a board runner would need the compiler's host kernels there.
"""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path
from typing import Mapping

import numpy as np

import vdla.runtime
from vdla._fileio import atomic_write
from vdla.deploy.board.player import DeviceScript, run_exported
from vdla.isa import INSN_BYTES

__all__ = ["export_model", "host_ends", "run_exported"]

#: Digits of the probes: int8 values 0..126 (a byte that reads 0 is padding).
_RADIX = 127


def host_ends(compiled) -> tuple[list[dict], list[dict]]:
    """The model's host ends: per quantized input ``{"name": int8 tensor, "from": graph
    input, "quantize": attrs}``, per output ``{"name": int8 tensor, "to": graph output,
    "dequantize": attrs}``. ValueError naming the first op on the host that is not such
    an end, or a graph input or output the accelerator does not reach so."""
    graph, target = compiled.graph, compiled.target
    inputs, outputs = [], []
    for op in compiled.ops:
        if op.target == target.name:
            continue
        node = graph.node(op.name)
        if node.op == "quantize" and node.inputs[0] in graph.inputs:
            inputs.append({"name": node.outputs[0], "from": node.inputs[0],
                           "quantize": dict(node.attrs)})
        elif node.op == "dequantize" and node.outputs[0] in graph.outputs:
            outputs.append({"name": node.inputs[0], "to": node.outputs[0],
                            "dequantize": dict(node.attrs)})
        else:
            raise ValueError(f"{node.op} node {node.name!r} runs on the host ({op.reason}); "
                             f"a model exports for {target.name} when the accelerator runs "
                             "every op between its inputs' quantize and its outputs' "
                             "dequantize")
    ends = {o["to"] for o in outputs}
    for name in graph.outputs:
        if name not in ends:
            raise ValueError(f"graph output {name!r} is not a dequantize on the host of an "
                             f"accelerator tensor; {target.name} exports only such models")
    return inputs, outputs


class _Recorder:
    """A device that writes down every call to `inner` (``log``) while `on`."""

    def __init__(self, inner):
        self.inner, self.log, self.on = inner, [], True
        self.config, self.dram_size = inner.config, inner.dram_size
        self.backend, self.base = inner.backend, getattr(inner, "base", 0)

    def alloc(self, nbytes: int) -> int:
        addr = self.inner.alloc(nbytes)
        if self.on:
            self.log.append(("alloc", addr, int(nbytes)))
        return addr

    def free(self, addr: int) -> None:
        self.inner.free(addr)

    def write(self, addr: int, data) -> None:
        self.inner.write(addr, data)
        if self.on:
            raw = np.frombuffer(data, np.uint8) if isinstance(data, (bytes, bytearray)) \
                else np.ascontiguousarray(data).view(np.uint8).reshape(-1)
            self.log.append(("write", int(addr), raw.copy()))

    def read(self, addr: int, nbytes: int) -> np.ndarray:
        data = self.inner.read(addr, nbytes)
        if self.on:
            self.log.append(("read", int(addr), int(nbytes)))
        return data

    def run(self, insn_addr: int, insn_count: int, **options) -> dict:
        stats = self.inner.run(insn_addr, insn_count, **options)
        if self.on:
            self.log.append(("run", int(insn_addr), int(insn_count)))
        return stats

    def close(self) -> None:
        self.inner.close()


def _gather_map(size: int, apply, what: str) -> np.ndarray:
    """The index map of `apply`, a gather with zero fill from `size` int8 elements (its
    argument) to bytes (its result): per result byte, the element it holds, or -1."""
    digits = max(1, math.ceil(math.log(size + 1, _RADIX)))
    if np.any(np.asarray(apply(np.zeros(size, np.int8)), np.uint8)):
        raise ValueError(f"{what}: zeros do not give zero bytes; not a gather")
    index = None
    for d in range(digits):
        probe = ((np.arange(size, dtype=np.int64) + 1) // _RADIX ** d % _RADIX).astype(np.int8)
        got = np.asarray(apply(probe), np.uint8).astype(np.int64)
        index = got * _RADIX ** d if index is None else index + got * _RADIX ** d
    index = index - 1
    check = np.random.default_rng(0).integers(-128, 128, size, dtype=np.int8)
    want = np.where(index >= 0, check[np.maximum(index, 0)], 0).astype(np.int8)
    if index.max(initial=-1) >= size or not np.array_equal(
            np.asarray(apply(check)).view(np.int8).reshape(-1), want):
        raise ValueError(f"{what}: the probed map does not reproduce a random value")
    return index.astype(np.int32)


def _record(compiled, feed: Mapping[str, np.ndarray]):
    """(the device log of one run of `compiled` on `feed`, its host ends, the input
    maps (locations, map), the output maps, the run's outputs)."""
    ins, outs = host_ends(compiled)
    config = compiled.target.config
    recorder = _Recorder(vdla.runtime.open(config, backend="functional"))
    try:
        with compiled.session(recorder) as session:
            recorded = session.run(feed).outputs
            recorder.on = False
            device_session = session.target_session(compiled.target.name)
            graph = compiled.graph
            in_maps = []
            for t in ins:
                shape = graph.tensors[t["name"]].shape
                where = device_session.locations(t["name"])

                def put(values, name=t["name"], shape=shape, where=where):
                    start = len(recorder.log)
                    recorder.on = True
                    device_session.put(name, values.reshape(shape))
                    recorder.on = False
                    writes = recorder.log[start:]
                    del recorder.log[start:]
                    if [(a, len(d)) for _, a, d in writes] != where:
                        raise ValueError(f"input {name!r}: put wrote {len(writes)} runs "
                                         "elsewhere than the tensor's locations")
                    return np.concatenate([d for _, _, d in writes])
                in_maps.append((where, _gather_map(math.prod(shape), put, f"input "
                                                   f"{t['name']!r}")))
            out_maps = []
            for t in outs:
                where = device_session.locations(t["name"])
                raw = sum(n for _, n in where)

                def fetch(values, name=t["name"], where=where):
                    at = 0
                    for addr, n in where:
                        recorder.inner.write(addr, values[at:at + n])
                        at += n
                    return device_session.fetch(name).view(np.uint8).reshape(-1)
                out_maps.append((where, _probe_output(raw, fetch, t["name"])))
    finally:
        recorder.close()
    return recorder.log, ins, outs, in_maps, out_maps, recorded


def _probe_output(raw: int, fetch, name: str) -> np.ndarray:
    """The output map: per element of the fetched value, the raw byte it comes from."""
    # `_gather_map` maps elements to bytes; here bytes (the source) go to elements.
    index = _gather_map(raw, fetch, f"output {name!r}")
    if index.min(initial=0) < 0:
        raise ValueError(f"output {name!r}: an element of the fetched value comes from no "
                         "byte read")
    return index


def _steps(log, ins, in_maps, outs, out_maps, arrays: dict) -> tuple[list, int]:
    """The script's steps from the log (module docstring), its arrays added to
    `arrays`; and the DRAM the recording used."""
    inputs = {(a, n): (i, slot) for i, (where, _) in enumerate(in_maps)
              for slot, (a, n) in enumerate(where)}
    outputs = {(a, n): i for i, (where, _) in enumerate(out_maps) for a, n in where}
    programs = {(a, c * INSN_BYTES) for kind, a, c in log if kind == "run"}
    steps, top = [], 0
    for entry in log:
        kind, addr = entry[0], entry[1]
        if kind == "alloc":
            steps.append({"do": "alloc", "at": addr, "bytes": entry[2]})
            top = max(top, addr + entry[2])
        elif kind == "run":
            steps.append({"do": "run", "at": addr, "count": entry[2]})
        elif kind == "read":
            if (addr, entry[2]) not in outputs:
                raise ValueError(f"the run read {entry[2]} bytes at {addr:#x}, which is no "
                                 "output of the model")
            steps.append({"do": "output", "tensor": outputs[addr, entry[2]], "at": addr,
                          "bytes": entry[2]})
        elif (addr, len(entry[2])) in inputs:
            i, slot = inputs[addr, len(entry[2])]
            where, index = in_maps[i]
            at = sum(n for _, n in where[:slot])
            name = f"input{i}_map{slot}"
            arrays[name] = index[at:at + where[slot][1]]
            steps.append({"do": "input", "tensor": i, "at": addr, "map": name})
        else:
            name = f"blob{len(arrays)}"
            arrays[name] = entry[2]
            step = {"do": "write", "at": addr, "blob": name}
            if (addr, len(entry[2])) in programs:
                step["program"] = True
            steps.append(step)
    return steps, top


def export_model(compiled, out_dir: str | os.PathLike,
                 example: Mapping[str, np.ndarray] | None = None, *, name: str = "") -> Path:
    """Write `compiled` (a `CompiledModel` of the accelerator) into `out_dir` as a device
    script (``model.json``, ``model.npz``, ``README.md``), recorded from a run on
    `example`'s inputs (graph input -> float array; zeros when None: the script does not
    depend on the values) and checked by playing it back on a fresh functional
    simulator, and `example` (inputs and outputs) as ``example.npz``. Returns the
    folder. ValueError for a model with host ops between accelerator ops
    (`host_ends`)."""
    graph = compiled.graph
    feed = {name: (np.zeros(graph.tensors[name].shape, np.float32) if example is None
                   else example[name]) for name in graph.inputs}
    log, ins, outs, in_maps, out_maps, recorded = _record(compiled, feed)
    config = compiled.target.config
    arrays: dict[str, np.ndarray] = {}
    steps, top = _steps(log, ins, in_maps, outs, out_maps, arrays)
    run_ops = [op.name for op in compiled.ops if op.target == compiled.target.name
               and op.kernel.lowered is not None]
    runs = [s for s in steps if s["do"] == "run"]
    if len(runs) != len(run_ops):
        raise ValueError(f"the run made {len(runs)} program runs for {len(run_ops)} ops")
    for step, op in zip(runs, run_ops):
        step["op"] = op
    for i, (t, (_, index)) in enumerate(zip(outs, out_maps)):
        arrays[f"output{i}_map"] = index
        t["map"] = f"output{i}_map"
    for t in ins + outs:
        t["shape"] = list(graph.tensors[t["name"]].shape)
    for t in ins:
        t["from_shape"] = list(graph.tensors[t["from"]].shape)
    meta = {"model": name or graph.name, "extensions": list(config.program_extensions),
            "dram_alignment": vdla.runtime.dram_alignment(config),
            "ops": [{"name": op.name, "op": op.op, "on": op.target} for op in compiled.ops]}
    script = DeviceScript(config, tuple(steps), arrays, tuple(ins), tuple(outs),
                          top + vdla.runtime.dram_alignment(config), meta)
    script.check()
    _self_check(script, feed, recorded)
    out = Path(out_dir)
    atomic_write(out / "model.npz", _npz(arrays))
    if example is not None:
        atomic_write(out / "example.npz", _npz({k: np.asarray(v) for k, v in example.items()}))
    atomic_write(out / "model.json", (json.dumps(script.to_json(), indent=1) + "\n").encode())
    atomic_write(out / "README.md", _README.format(model=meta["model"], config=config.name,
                                                   steps=len(steps), runs=len(runs)).encode())
    return out


_README = """# {model} for the vdla accelerator, config `{config}`

A device script: the {steps} device calls that run the model, {runs} of them programs,
recorded from the compiler's session and checked by playing it back.

- `model.json`: the config, the steps, the int8 ends and the host's quantize and
  dequantize;
- `model.npz`: the bytes the steps write (weights, micro-ops, programs) and the maps
  from the int8 inputs to their bytes and from the bytes read to the outputs;
- `example.npz` (where written): an input and the reference's outputs for it.

Play it on any device of the config, a board's included, with vdla installed:

    from vdla.deploy.board.player import run_exported
    outputs, runs = run_exported("this/folder", device, {{"input": x}})

`vdla deploy MODEL --board B` puts it in a bundle with the board's project and a runner.
"""


def _npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _self_check(script: DeviceScript, feed, recorded: Mapping[str, np.ndarray]) -> None:
    """Play `script` on a fresh functional simulator, host ends included: its outputs
    must be those of the run it was recorded from."""
    with vdla.runtime.open(script.config, backend="functional") as device:
        outputs, _ = run_exported(script, device, feed)
    for name, value in recorded.items():
        if not np.array_equal(outputs[name], value):
            raise ValueError(f"the exported script's output {name!r} differs from the run "
                             "it was recorded from: the recording is wrong (please report it)")
