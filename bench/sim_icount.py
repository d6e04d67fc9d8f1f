"""Instructions the Verilator model executes per simulated cycle, counted by callgrind: a
measure of a build's speed that the machine's other tenants cannot move (wall-clock rates
on a shared two-core machine move by 20% and more from one minute to the next), for
comparing builds or changes to the design side by side.

It runs some of a model's ops once on the default Verilator build and keeps each op's
DRAM image and program. The data do not change a program's cycles: the accelerator's
control flow does not depend on them, so an image taken after the run runs the same
cycles again. Each image is then run under ``valgrind --tool=callgrind``, counting only
inside the harness's ``vdla_run``, on every library: the default build and each
``--library LABEL=PATH`` (another build of the same config's model, such as a change to
try). A small C driver, built with the system's C compiler, loads a library and runs the
image, so no Python runs under valgrind. Every library must run each op in the same
number of cycles, or it is not the same design.

    python bench/sim_icount.py [--model resnet18] [--ops layer2.0.conv1 ...]
                               [--library lto=PATH ...]

Counts are a proxy for time, and a rough one across build levels: the profile-guided
default build runs 4-7% fewer instructions than the LTO build, and has been from as fast
to 1.3x faster, through code layout and branches. So compare libraries built alike: a
design change against the same level's build of the design before it.

Needs valgrind and cc. One op of 270,000 cycles takes about 20 s per library.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import vdla
from vdla.compiler import pipeline
from vdla.compiler.targets.op_parallel import OpWorker, op_tasks
from vdla.compiler.targets.vdla.target import VdlaTarget
from vdla.sim.verilator.build import build_model

#: A GEMM-bound convolution and a load-bound one of ResNet-18.
DEFAULT_OPS = ("layer2.0.conv1", "layer4.0.downsample.0")

DRIVER = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef struct { int32_t status; uint32_t state; uint64_t cycles; uint64_t counters[256]; } Run;
int main(int argc, char** argv) {
    /* LIBRARY IMAGE DRAM_SIZE INSN_ADDR INSN_COUNT READ_LAT WRITE_LAT BYTES MAX_R MAX_W BUDGET */
    if (argc != 12) { fprintf(stderr, "driver: 11 arguments\n"); return 2; }
    void* lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) { fprintf(stderr, "driver: %s\n", dlerror()); return 2; }
    void* (*create)(uint64_t, uint64_t, uint64_t, double, uint32_t, uint32_t, const char*) =
        (void* (*)(uint64_t, uint64_t, uint64_t, double, uint32_t, uint32_t, const char*))
        dlsym(lib, "vdla_create");
    uint8_t* (*dram)(void*) = (uint8_t* (*)(void*))dlsym(lib, "vdla_dram");
    int32_t (*run)(void*, uint64_t, uint64_t, uint64_t, uint64_t, int32_t, Run*) =
        (int32_t (*)(void*, uint64_t, uint64_t, uint64_t, uint64_t, int32_t, Run*))
        dlsym(lib, "vdla_run");
    uint64_t size = strtoull(argv[3], 0, 0);
    void* h = create(size, strtoull(argv[6], 0, 0), strtoull(argv[7], 0, 0), atof(argv[8]),
                     (uint32_t)atoi(argv[9]), (uint32_t)atoi(argv[10]), "");
    if (!h) { fprintf(stderr, "driver: no DRAM\n"); return 2; }
    FILE* f = fopen(argv[2], "rb");
    if (!f) { fprintf(stderr, "driver: cannot open %s\n", argv[2]); return 2; }
    size_t n = fread(dram(h), 1, size, f);
    fclose(f);
    Run r;
    memset(&r, 0, sizeof r);
    int32_t status = run(h, strtoull(argv[4], 0, 0), strtoull(argv[5], 0, 0),
                         strtoull(argv[11], 0, 0), 4096, 0, &r);
    printf("{\"status\": %d, \"cycles\": %llu, \"image_bytes\": %zu}\n", status,
           (unsigned long long)r.cycles, n);
    return status == 0 ? 0 : 1;
}
"""


def capture_ops(model_name: str, ops: list[str], folder: Path) -> list[dict]:
    """Run `ops` of `model_name` on the default Verilator build, each fed from the
    reference as a parallel run feeds it, and keep each one's DRAM image and program."""
    target = VdlaTarget(vdla.HardwareConfig(), backend="verilator")
    model = pipeline.load_model(model_name)
    compiled, _ = pipeline.compile_for(pipeline.graph_for(model, target), target)
    reference = pipeline.reference_of(compiled.graph, model.feed)
    tasks = {task.ops[0]: task for task in op_tasks(compiled, reference)}
    unknown = [op for op in ops if op not in tasks]
    if unknown:
        raise SystemExit(f"--ops: {', '.join(unknown)} not among {model_name}'s accelerator "
                         f"ops ({', '.join(tasks)})")
    worker = OpWorker(compiled)
    device = worker.session.device
    runs = []
    run = device.run

    def remembered(insn_addr, insn_count, **options):   # what the session runs
        runs.append((insn_addr, insn_count))
        return run(insn_addr, insn_count, **options)

    device.run = remembered
    captured = []
    for name in ops:
        (ran, _), = worker(tasks[name]).values()
        insn_addr, insn_count = runs[-1]
        dram = device.simulator.dram
        top = int(np.flatnonzero(dram)[-1]) + 1
        image = folder / f"{name}.bin"
        dram[:top].tofile(image)
        timing = device.simulator.model.timing
        captured.append({"op": name, "cycles": ran.cycles, "image": image,
                         "args": [len(dram), insn_addr, insn_count, timing.read_latency,
                                  timing.write_latency, float(timing.bytes_per_cycle),
                                  timing.max_reads, timing.max_writes, 1 << 40]})
    return captured


def count(driver: Path, library: Path, op: dict) -> tuple[int, int]:
    """(instructions in vdla_run, harness cycles) of `op` run on `library`."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
               "--toggle-collect=vdla_run", str(driver), str(library), str(op["image"]),
               *map(str, op["args"])]
    proc = subprocess.run(command, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or not found:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stdout}{proc.stderr[-2000:]}")
    return int(found.group(1)), json.loads(proc.stdout)["cycles"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--ops", nargs="+", default=list(DEFAULT_OPS), metavar="NAME")
    parser.add_argument("--library", action="append", default=[], metavar="LABEL=PATH",
                        help="another model library of the default config to count")
    args = parser.parse_args(argv)
    missing = [tool for tool in ("valgrind", "cc") if shutil.which(tool) is None]
    if missing:
        raise SystemExit(f"needs {' and '.join(missing)} on the PATH")
    default = build_model(vdla.HardwareConfig())
    libraries = {"default build": default.library}
    for item in args.library:
        label, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            raise SystemExit(f"--library {item!r}: give LABEL=PATH of a model library")
        libraries[label] = Path(path)
    with tempfile.TemporaryDirectory(prefix="vdla-icount-") as tmp:
        folder = Path(tmp)
        (folder / "driver.c").write_text(DRIVER)
        subprocess.run(["cc", "-O2", "-o", str(folder / "driver"), str(folder / "driver.c"),
                        "-ldl"], check=True)
        ops = capture_ops(args.model, args.ops, folder)
        print(f"{args.model}: instructions in vdla_run per simulated cycle (callgrind)")
        width = max(map(len, libraries))
        ok = True
        for op in ops:
            print(f"  {op['op']} ({op['cycles']:,} cycles)")
            first = want = None
            for label, library in libraries.items():
                instructions, cycles = count(folder / "driver", library, op)
                per_cycle = instructions / cycles
                first, want = first or per_cycle, want or cycles
                same = cycles == want
                ok &= same
                print(f"    {label:<{width}}  {per_cycle:8,.0f} per cycle  "
                      f"{per_cycle / first:5.3f}x the default"
                      + ("" if same else f"  (ran {cycles:,} cycles: another design)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
