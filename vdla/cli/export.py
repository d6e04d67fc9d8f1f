"""``vdla export``: a built-in model (`vdla.compiler.zoo`) as an ONNX file."""

from __future__ import annotations

from vdla.cli.common import CliError, output_file
from vdla.compiler.frontend import zoo, zoo_transformers

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    export = sub.add_parser("export", help="write a built-in model (vdla.compiler.zoo) as ONNX")
    export.add_argument("model", metavar="MODEL",
                        help="zoo model name (resnet18, mobilenet_v1, small_cnn, ...)")
    export.add_argument("-o", "--output", required=True, type=output_file,
                        metavar="FILE.onnx", help="ONNX output")
    export.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    export.add_argument("--image-size", type=int, metavar="S",
                        help="input height and width (default: the model's)")
    export.add_argument("--opset", type=int, default=13, metavar="K",
                        help="ONNX opset to write (default 13)")
    export.set_defaults(func=run)


def run(args) -> int:
    # onnx is a heavy import: every command's parser is built at start-up, so only the
    # export itself loads it.
    from vdla.compiler.frontend.onnx_export import MAX_OPSET, MIN_OPSET, save_onnx

    if args.batch < 1:
        raise CliError(f"--batch must be a positive integer, not {args.batch}")
    if args.image_size is not None and args.image_size < 1:
        raise CliError(f"--image-size must be a positive integer, not {args.image_size}")
    if not MIN_OPSET <= args.opset <= MAX_OPSET:
        raise CliError(f"--opset {args.opset} is not supported; choose {MIN_OPSET} to {MAX_OPSET}")
    if args.model not in zoo.names():   # a user error (exit 1), not a usage error (2)
        raise CliError(f"unknown model {args.model!r}; known models: {', '.join(zoo.names())}")
    graph = zoo.get(args.model, batch=args.batch, image_size=args.image_size)
    path = save_onnx(graph, args.output, opset=args.opset)
    # Parameters as torch counts them: every constant but BN's running statistics (a
    # transformer's: but its masks and scalars).
    stats = {n.inputs[i] for n in graph.nodes() if n.op == "batch_norm" for i in (3, 4)}
    params = (zoo_transformers.parameter_count(graph)
              if args.model in zoo_transformers.TRANSFORMERS else
              sum(t.data.size for name, t in graph.tensors.items()
                  if t.is_constant and name not in stats))
    print(f"{path}: {args.model}, {len(graph.nodes())} ops, {params:,} parameters, "
          f"opset {args.opset}")
    return 0
