"""The CPU target: the front half's graph, int8 or float32, compiled to C.

Its data flow, one module per step:

    shapes      a node's sizes and epilogue (what its C depends on; the tuner's keys)
    schedule    the knobs, their checks, the default chooser and the tuner's space
    lower       a node to its kernel: conv, depthwise, dense, patches (a ViT's patch
                embedding as one GEMM), or ops (pools, elementwise, copies; opbase
                holds what they share; and the sequence models' kernels: matmul,
                norms, qnorms, attention, sequence)
    epilogue    what every convolution and dense kernel does after its sums (bias,
                requantization, residual, activation or clamp, store), written once
    kernel      the compiled form of one op: a C function, its params, its scratch
    program     a graph's kernels as one library, the whole-graph runner, the
                stand-alone project (vdla compile)
    library     kernels into a shared library (vdla_cpu.h), calling and timing them
    build       the system C compiler and the content-hashed build cache
    cfiles      the fixed C, Makefile and README text: files in c/ (c/templates/ with
                @NAME@ placeholders), read and filled in
    isa         the instruction set the code is written for (AVX-512 VNNI, AVX2, C)
    machine     the machine as the kernels see it (caches, ISA extensions, AMX tiles,
                measured FMA and int8 throughput: machine_bench), cached per machine
    tuning      the tuner's tasks (wall time)
    target      `CpuTarget` and its sessions

`CpuTarget` is what the rest of vdla uses (`vdla.compiler.targets.get("cpu")`).
"""
