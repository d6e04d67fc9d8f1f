"""``vdla disasm``: an instruction stream back to assembly text (the round trip is
exact)."""

from __future__ import annotations

import sys
from pathlib import Path

from vdla._fileio import atomic_write
from vdla.cli.common import CONFIG_HELP, load_config, output_file, read_file
from vdla.isa import Program

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    disasm = sub.add_parser("disasm", help="disassemble an instruction stream")
    disasm.add_argument("file", metavar="FILE", help="binary instruction stream")
    disasm.add_argument("-o", "--output", type=output_file,
                        metavar="OUT", help="write here instead of stdout")
    disasm.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    disasm.set_defaults(func=run)


def run(args) -> int:
    config = load_config(args.config)
    program = Program.from_bytes(read_file(args.file, binary=True), config)
    text = program.to_asm()
    if args.output:
        atomic_write(Path(args.output), text.encode())
    else:
        sys.stdout.write(text)
    return 0

