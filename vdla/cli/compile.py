"""``vdla compile MODEL --target cpu -o DIR``: write a model compiled for a target as
something that runs without vdla (`Target.export`): for the CPU target a C project (the
generated sources, ``vdla_model.h``, a Makefile, the params file and an example program)
that builds with ``make``. ``--check`` builds it and runs the example on the model's input,
comparing the output with the reference."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from vdla.cli.common import (CliError, add_batch_option, add_calibration_option,
                             add_records_option, add_seed_option, check_model_options, log,
                             open_records, progress_line)
from vdla.cli.target_args import (add_chooser_option, add_precision_option,
                                  add_target_options, make_target)
from vdla.compiler import pipeline, targets

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser(
        "compile", help="write a model compiled for a target as a stand-alone project "
                        "(the cpu target: C sources, a header and a Makefile)",
        description="Compile MODEL for a target and write it into DIR in a form that runs "
                    "without vdla. The cpu target writes the generated C (model.c, "
                    "vdla_cpu.h), the API header vdla_model.h, model.params (the weights "
                    "and tables), an example program run_model.c and a Makefile: `make -C "
                    "DIR` builds libvdla_model.so, libvdla_model.a and run_model with no "
                    "Python.")
    p.add_argument("model", metavar="MODEL", help="zoo model name or an .onnx path")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="output folder")
    p.add_argument("--target", default="cpu", metavar="NAME",
                   help=f"the target ({', '.join(targets.names())}); only targets with a "
                        "stand-alone form (cpu) can be written (default cpu)")
    add_precision_option(p)
    add_records_option(p)
    add_chooser_option(p)
    add_calibration_option(p)
    add_seed_option(p)
    add_batch_option(p)
    p.add_argument("--check", action="store_true",
                   help="then build the project with make and run its example on the "
                        "model's input; its output must match the reference")
    add_target_options(p, "compile")
    p.set_defaults(func=run)


def run(args) -> int:
    check_model_options(args)
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise CliError(f"-o {args.output!r} is a file; give a folder to write the project in")
    target = make_target(args.target, args, "compile", precision=args.precision, log=log)
    records = open_records(args.records)
    if records is not None and not target.measure_backends:
        raise CliError(f"--records: target {target.name!r} has no tunable ops")
    model = pipeline.load_model(args.model, seed=args.seed, calibration=args.calibration,
                                batch=args.batch)
    graph = pipeline.graph_for(model, target, precision=args.precision)
    show, done = progress_line("compiling")
    try:
        compiled, schedules = pipeline.compile_for(graph, target, records=records,
                                                   progress=show, chooser=args.chooser)
    finally:
        done()
        if records is not None:
            records.close()
    # A worked example beside the project: the seeded input and the reference's output
    # for it, so that run_model can be tried and checked without writing an input file.
    example = {**model.feed, **_reference(graph, model.feed)}
    folder = Path(target.export(compiled, out, example=example,
                                exact=args.precision == "int8"))
    files = sorted(p.name for p in folder.iterdir() if p.is_file())
    print(f"{args.model} ({args.precision}): {len(compiled.ops)} ops compiled for "
          f"{target.name}" + (f", {len(schedules)} with tuned schedules from {args.records}"
                              if args.records else "")
          + f"; wrote {folder}/: {', '.join(files)}")
    if {"in.bin", "out.bin"} <= set(files):
        print(f"build it with `make -C {folder}`; run it with `cd {folder} && ./run_model "
              "model.params in.bin my_out.bin` (in.bin: the seeded input; out.bin: the "
              "reference's output for it; README.md gives the files' byte layout)")
    elif "Makefile" in files:
        print(f"build it with `make -C {folder}`; README.md says how to run it")
    elif "README.md" in files:
        print(f"{folder}/README.md says how to run it")
    if args.check and "Makefile" not in files:
        print(f"--check builds a C project; {target.name}'s form is none (it was played back "
              "and checked against the reference as it was written)")
    elif args.check:
        _check(folder, model, graph, args.precision)
    return 0


def _reference(graph, feed) -> dict:
    """The reference's outputs of `graph` on `feed`."""
    from vdla.compiler.reference import run_reference  # heavy (numpy): only here

    outputs = run_reference(graph, feed)
    return {name: outputs[name] for name in graph.outputs}


def _check(folder: Path, model, graph, precision: str) -> None:
    """make the project in a scratch copy, run its example on the model's feed, compare."""
    # numpy and the reference are heavy imports that only --check needs.
    import numpy as np
    from vdla.compiler.ir.graph import DTYPES  # heavy (numpy), as above
    from vdla.compiler.reference import run_reference  # heavy (numpy), as above

    make = shutil.which("make")
    if make is None:
        raise CliError("--check needs make (apt install make)")
    with tempfile.TemporaryDirectory(prefix="vdla-compile-check-") as tmp:
        work = Path(tmp) / "project"
        shutil.copytree(folder, work)
        log(f"building {folder} with make (in a scratch copy) ...")
        start = time.perf_counter()
        proc = subprocess.run([make, "-j2"], cwd=work, capture_output=True, text=True,
                              env={**os.environ})
        if proc.returncode:
            raise CliError(f"make failed in the written project (exit status "
                           f"{proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        inputs = []
        for i, name in enumerate(graph.inputs):
            path = work / f"input{i}.bin"
            path.write_bytes(np.ascontiguousarray(
                model.feed[name], DTYPES[graph.tensors[name].dtype]).tobytes())
            inputs.append(str(path))
        outputs = [str(work / f"output{i}.bin") for i in range(len(graph.outputs))]
        proc = subprocess.run([str(work / "run_model"), str(work / "model.params"), *inputs,
                               *outputs, "10"], capture_output=True, text=True)
        if proc.returncode:
            raise CliError(f"the built run_model failed (exit status {proc.returncode}): "
                           f"{proc.stderr.strip()}")
        reference = run_reference(graph, model.feed)
        for path, name in zip(outputs, graph.outputs):
            t = graph.tensors[name]
            got = np.fromfile(path, DTYPES[t.dtype]).reshape(t.shape)
            if precision == "float32":
                error = pipeline.relative_error(got, reference[name])
                if error > pipeline.FLOAT_TOLERANCE:
                    raise CliError(f"the built program's output {name!r} is {error:.3g} "
                                   "relative from the float reference")
            elif not np.array_equal(got, reference[name]):
                raise CliError(f"the built program's output {name!r} differs from the "
                               "quantized reference")
        what = ("within " + f"{pipeline.FLOAT_TOLERANCE:g} of the float reference"
                if precision == "float32" else "bit-exact vs the quantized reference")
        print(f"checked: built with make in {time.perf_counter() - start:.1f} s; run_model "
              f"on the model's input: {what}; {proc.stdout.strip()}")
