"""The board side of a deploy bundle: the code that runs on the board's Linux.

Every module here imports only the standard library, numpy, vdla's light core
(`vdla.config`, `vdla.extensions`, `vdla.isa`) and one another; pynq only inside the
functions that use it, on the board. A bundle carries these files and that core
(`vdla.deploy.bundle_writer.CARRIED`); tests/deploy/test_board_imports.py runs them
with every other module refused. This ``__init__`` imports nothing.
"""
