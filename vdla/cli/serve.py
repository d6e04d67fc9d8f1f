"""``vdla serve``: serve this machine's accelerator to ``vdla run MODEL --remote
HOST:PORT`` on a workstation (`vdla.runtime.remote`). On a board's Linux, ``--board NAME``
serves the bitstream's accelerator (`vdla.deploy.board_device.BoardDevice`, as root); anywhere,
``--sim functional|verilator`` serves a simulated one. Clients must hold the shared key
(``--key-file`` or ``$VDLA_REMOTE_KEY``)."""

from __future__ import annotations

from vdla.cli.common import CONFIG_HELP, CliError, load_config, log

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve this machine's accelerator (a board's, or a "
                                     "simulated one) to `vdla run --remote`")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--board", metavar="NAME",
                       help="the board this runs on (`vdla boards`): its bitstream's accelerator")
    where.add_argument("--sim", choices=("functional", "verilator"),
                       help="serve a simulated accelerator instead")
    p.add_argument("--config", metavar="FILE",
                   help=f"the config the bitstream was built from (default: the board's, or "
                        f"the default config); {CONFIG_HELP}")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=9091, help="port (default 9091; 0: any free)")
    p.add_argument("--key-file", metavar="PATH",
                   help="the shared key clients must hold (default $VDLA_REMOTE_KEY)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="--board: seconds a run may take before it is reported hung "
                        "(default 10)")
    p.set_defaults(func=run)


def run(args) -> int:
    # Imported here: numpy and the runtime, which `vdla --help` has no need of (heavy).
    import vdla.runtime
    from vdla.runtime.remote import read_key, serve

    try:
        key = read_key(args.key_file)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if not 0 <= args.port < 65536:
        raise CliError(f"--port must be 0..65535, not {args.port}")
    if not args.timeout > 0:
        raise CliError(f"--timeout must be a positive number of seconds, not {args.timeout}")
    config = load_config(args.config) if args.config else None
    if args.board:
        from vdla.boards import BOARDS, runtime_hosts  # heavy: the boards load the runtime
        if args.board not in BOARDS:
            raise CliError(f"--board {args.board!r}: one of {', '.join(sorted(BOARDS))}")
        if not BOARDS[args.board].runs_runtime:
            # Checked here: the board is opened only when a client connects.
            raise CliError(f"--board {args.board}: the board runtime runs on a Zynq's Linux; "
                           f"serve from {runtime_hosts()}")

        def open_device():
            return BOARDS[args.board].open_hardware(config, timeout=args.timeout)
    else:
        def open_device():
            return vdla.runtime.open(config, backend=args.sim)
    serve(open_device, host=args.host, port=args.port, key=key, log=log)
    return 0
