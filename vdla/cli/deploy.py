"""``vdla deploy MODEL --board B -o DIR``: a folder to copy to a Zynq board that runs the
model there (`vdla.deploy.bundle_writer`): the board's project (the Vivado script that builds
the bitstream and its .hwh), the model compiled for the board's config as a device
script, the board-side code the runner needs (so the board needs only numpy), a runner
(``python3 run.py image.npy``) and a manifest with every file's hash.
The bundle is played back on the functional simulator before it is written."""

from __future__ import annotations

from vdla.cli.common import (CONFIG_HELP, add_batch_option, add_calibration_option,
                             add_records_option, add_seed_option, board_config,
                             check_model_options, log, open_records)
from vdla.cli.target_args import DEFAULT_TARGET, add_chooser_option

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("deploy", help="write a bundle that runs a model on a Zynq board: "
                                      "the bitstream's project, the compiled model, a runner")
    p.add_argument("model", metavar="MODEL",
                   help="zoo model name (resnet18, small_cnn, ...) or an .onnx path")
    p.add_argument("--board", required=True, metavar="NAME",
                   help="the board (`vdla boards`; the runtime runs on the Zynq ones)")
    p.add_argument("--config", metavar="FILE",
                   help=f"the accelerator's config (default: the board's); {CONFIG_HELP}")
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="the bundle's folder (must not exist, or be empty)")
    add_records_option(p)
    add_chooser_option(p)
    add_seed_option(p)
    add_calibration_option(p)
    add_batch_option(p)
    p.set_defaults(func=run)


def run(args) -> int:
    check_model_options(args)
    # heavy: the compiler and the boards (numpy), only once a command runs
    from vdla.deploy.bundle_writer import write_bundle
    from vdla.compiler import pipeline, targets

    board, config = board_config(args.board, args.config)     # (ValueError: main says so)
    target = targets.get(DEFAULT_TARGET, config=config, backend="functional")
    records = open_records(args.records)
    model = pipeline.load_model(args.model, seed=args.seed, calibration=args.calibration,
                                batch=args.batch)
    graph = pipeline.graph_for(model, target)
    log(f"compiling {args.model} for {board.name} ({config.name}) ...")
    try:
        compiled, schedules = pipeline.compile_for(graph, target, records=records,
                                                   chooser=args.chooser)
    finally:
        if records is not None:
            records.close()
    reference = pipeline.reference_of(graph, model.feed)
    example = {**model.feed, **{name: reference[name] for name in graph.outputs}}
    log("recording the model's device calls and playing them back ...")
    manifest = write_bundle(board, target, compiled, args.output, example=example,
                            model=args.model)
    files = manifest["files"]
    print(f"{args.output}: {args.model} for {board.title} ({config.name}, "
          f"{board.clock_mhz:g} MHz): {len(files)} files, "
          f"{len([op for op in compiled.ops if op.target == target.name])} ops on the "
          f"accelerator" + (f", {len(schedules)} tuned" if schedules else ""))
    print(f"  build the bitstream: cd {args.output}/project && vivado -mode batch -source "
          f"{next(n for n in files if n.startswith('project/') and n.endswith('.tcl'))[8:]}")
    print(f"  on the board: sudo python3 run.py [image.npy] (see {args.output}/README.md)")
    return 0
