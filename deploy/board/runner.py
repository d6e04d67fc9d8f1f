"""What ``python3 run.py [image.npy]`` does on the board (`vdla.deploy.bundle_writer`
writes run.py, which puts the bundle's carried code first on the path and calls
`main`). Board side (`vdla.deploy.board`): the standard library, numpy and vdla's light
core; pynq only to load a bitstream and open the hardware.

1. check the bundle's files, the carried code included, against its manifest
   (`vdla.deploy.board.manifest.check_bundle`);
2. load the device script (`vdla.deploy.board.player.DeviceScript`);
3. with ``--bitstream``, load it through pynq (its ``.hwh`` beside it);
4. refuse a bitstream whose manifest (``project/manifest.json`` by default: the config
   the Vivado project was generated for) differs from the model's config or extensions,
   naming the difference (`vdla.deploy.board.hardware.bitstream_mismatch`);
5. open the accelerator at the board's register base (the manifest's
   ``register_base``; `vdla.deploy.board.hardware.open_layers`), with a DMA region the
   size the model needs, as the device the script plays on (`RegionDevice`);
6. run the input (the image, or the bundled example) through the model
   (`run_exported`: quantized on the host as at compile time, played on the device,
   dequantized) and print the cycles per op, the run's time and the top classes; the
   example's outputs are checked bit for bit against those the compiler's reference
   computed.

Exit status: 0 done (and, for the example, bit-exact); 1 an error, named on stderr
(``run.py: error: ...``, for every malformed bundle file too), or an example that
differs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

from vdla.deploy.board.hardware import (Accelerator, BoardError, BoardTimeout, RegionDevice,
                                        bitstream_config, bitstream_mismatch, open_layers)
from vdla.deploy.board.manifest import BundleMismatch, check_bundle
from vdla.deploy.board.player import BundleError, DeviceScript, run_exported

__all__ = ["main"]

#: Bytes the DMA region is rounded up to (pynq's allocations are pages; a MiB keeps the
#: region's size a round number in the board's logs).
REGION_ROUND = 1 << 20


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run.py", description="run this bundle's model on "
                                "the board's accelerator")
    p.add_argument("image", nargs="?", help="a .npy float32 array of the model's input "
                   "shape (default: the bundled example, checked bit for bit)")
    p.add_argument("--bitstream", metavar="BIT", help="load this bitstream first (pynq; "
                   "its .hwh beside it); default: the one already loaded")
    p.add_argument("--manifest", metavar="JSON", help="the bitstream's manifest (default: "
                   "project/manifest.json, the config the project was generated for)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="seconds one op may run before the run is stopped (default 10)")
    p.add_argument("--top", type=int, default=5, metavar="K",
                   help="classes to print (default 5)")
    p.add_argument("-o", "--output", metavar="NPY", help="also save the output here")
    return p


def main(argv: list[str], *, bundle: str | os.PathLike,
         open_device: Callable | None = None) -> int:
    """Run.py's work (module docstring); returns the exit status.

    argv : run.py's arguments (`_parser`)
    bundle : the bundle's folder
    open_device : ``open_device(config, manifest, dram_size, timeout)`` opens the
        device instead of the board's hardware (a test's Verilator shim, a simulator)
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.timeout > 0:
        parser.error(f"--timeout must be a positive number of seconds, not {args.timeout}")
    if args.top < 1:
        parser.error(f"--top must be a positive integer, not {args.top}")
    bundle = Path(bundle)
    try:
        info = check_bundle(bundle)
        script = DeviceScript.load(bundle / "model")
        manifest = Path(args.manifest) if args.manifest else bundle / "project" / "manifest.json"
        problem = bitstream_mismatch(bitstream_config(manifest), script.config)
        if problem:
            raise BoardError(f"{manifest}: {problem}")
        feed, expected = _feed(args.image, script, bundle)
        if args.bitstream:
            _load_bitstream(args.bitstream)
        size = -(-script.dram_bytes // REGION_ROUND) * REGION_ROUND
        if open_device is None:
            try:
                device = RegionDevice(script.config, Accelerator(
                    *open_layers(int(info["register_base"]), size), timeout=args.timeout))
            except OSError as exc:
                raise BoardError(f"cannot open the accelerator ({exc}): run.py runs on the "
                                 "board's Linux, as root, with the bitstream loaded") from None
        else:
            device = open_device(script.config, manifest, size, args.timeout)
        try:
            start = time.perf_counter()
            outputs, runs = run_exported(script, device, feed)
            wall = time.perf_counter() - start
        finally:
            device.close()
    except (BundleMismatch, BundleError, BoardError, BoardTimeout, OSError,
            ValueError) as exc:
        print(f"run.py: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:    # a bundle file malformed in a way no check above names
        print(f"run.py: error: {type(exc).__name__}: {exc} (is the bundle as `vdla deploy` "
              "wrote it?)", file=sys.stderr)
        return 1
    _report(info, script, runs, wall, outputs, args.top)
    if args.output:
        try:
            np.save(args.output, next(iter(outputs.values())))
        except OSError as exc:
            print(f"run.py: error: -o {args.output}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    if expected is not None:
        same = all(np.array_equal(outputs[name], want) for name, want in expected.items())
        print(f"the bundled example: {'bit-exact' if same else 'DIFFERS from'} the "
              "compiler's reference")
        return 0 if same else 1
    return 0


def _feed(image: str | None, script: DeviceScript, bundle: Path):
    """(the feed, the expected outputs or None)."""
    if image is not None:
        if len(script.inputs) != 1:
            raise ValueError(f"the model has {len(script.inputs)} inputs; run.py takes one")
        return {script.inputs[0]["from"]: np.load(image, allow_pickle=False)}, None
    path = bundle / "model" / "example.npz"
    if not path.is_file():
        raise ValueError("no image given and the bundle has no example (model/example.npz)")
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise BundleError(f"{path}: not an example of the model's inputs ({exc})") from None
    with npz:
        missing = [t["from"] for t in script.inputs if t["from"] not in npz.files]
        if missing:
            raise BundleError(f"{path}: no array for the model's input(s) {missing} (it "
                              f"holds {sorted(npz.files)})")
        feed = {t["from"]: npz[t["from"]] for t in script.inputs}
        expected = {t["to"]: npz[t["to"]] for t in script.outputs if t["to"] in npz.files}
    return feed, expected


def _load_bitstream(path: str) -> None:
    try:
        import pynq  # heavy, and on the board image only
    except ImportError:
        raise BoardError("--bitstream needs pynq (the PYNQ image has it); without it, load "
                         "the bitstream with fpgautil and leave --bitstream out") from None
    pynq.Overlay(path)


def _report(info: dict, script: DeviceScript, runs: list, wall: float, outputs: dict,
            top: int) -> None:
    clock = script.config.clock_mhz
    counted = all(r.get("cycles") is not None for r in runs)   # (a simulator may not count)
    cycles = sum(int(r["cycles"]) for r in runs) if counted else None
    timing = (f"{cycles:,} cycles = {cycles / (clock * 1e3):.3f} ms at {clock:g} MHz; "
              if counted else "no cycle counters; ")
    print(f"{info['model']} on {info['board']} ({script.config.name}): {len(runs)} "
          f"programs, {timing}{wall * 1e3:.1f} ms wall with the host's part")
    width = max((len(r["op"]) for r in runs), default=2)
    for r in runs:
        if r.get("cycles") is not None:
            print(f"  {r['op']:<{width}}  {int(r['cycles']):>12,} cycles")
    for name, value in outputs.items():
        flat = np.asarray(value).reshape(-1)
        best = np.argsort(-flat, kind="stable")[:top]
        print(f"{name}: top {len(best)}: " + ", ".join(f"{i} ({flat[i]:.3f})" for i in best))
