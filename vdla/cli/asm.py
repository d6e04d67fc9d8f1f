"""``vdla asm``: assemble a text program into an instruction stream."""

from __future__ import annotations

import sys
from pathlib import Path

from vdla._fileio import atomic_write
from vdla.cli.common import CONFIG_HELP, load_config, output_file, read_file
from vdla.isa import Program

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    asm = sub.add_parser("asm", help="assemble a text program into an instruction stream")
    asm.add_argument("file", metavar="FILE", help="assembly text")
    asm.add_argument("-o", "--output", required=True, type=output_file,
                     metavar="OUT", help="binary output")
    asm.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    asm.set_defaults(func=run)


def run(args) -> int:
    config = load_config(args.config)
    program = Program.from_asm(read_file(args.file, binary=False), config, source=args.file)
    out = Path(args.output)
    atomic_write(out, program.to_bytes())
    print(f"{args.file}: {len(program)} instructions, {program.nbytes} bytes -> {out} "
          f"(config {config.name})", file=sys.stderr)
    return 0
