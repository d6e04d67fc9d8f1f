"""The CPU target: the compiler's quantized graph compiled to C, built with the system C
compiler (gcc ``-O3 -march=native``, OpenMP) and loaded through ctypes.

`vdla.compiler.targets.cpu.build` builds C sources into a shared library, cached on disk
by content hash, and writes a stand-alone project (sources and a Makefile).
"""
