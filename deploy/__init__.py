"""Deploying a compiled model to a Zynq board (``vdla deploy``), in one place, by the
side of the wire each module runs on.

- `vdla.deploy.board`: what runs on the board. It imports only the standard library,
  numpy, vdla's light core (`vdla.config`, `vdla.extensions`, `vdla.isa`) and, on the
  board, pynq (lazily, where it is used); a bundle carries these very files
  (`vdla.deploy.bundle_writer.CARRIED`), so a board needs no vdla installed.
  ``runner`` (the bundle's ``run.py``), ``player`` (the device script and the host's
  quantize/dequantize), ``hardware`` (the register protocol over the control window and
  the DMA region, the bitstream checks) and ``manifest`` (the bundle's file hashes).
- `vdla.deploy.bundle_writer`: on the workstation, writes the bundle (the board's
  project, the model's device script recorded by
  `vdla.compiler.targets.vdla.export`, the carried code, the runner, the manifest).
- `vdla.deploy.board_device`: the board's accelerator behind vdla's full device API
  (programs validated, work counters): `vdla serve` on a board with vdla installed, and
  the tests. It needs vdla's runtime and simulators, so bundles do not carry it.

This ``__init__`` imports nothing: the board side is imported through it.
"""
