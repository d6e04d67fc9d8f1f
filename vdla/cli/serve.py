"""``vdla serve``: serve this machine's accelerator to ``vdla run MODEL --remote
HOST:PORT`` on a workstation (`vdla.runtime.remote`). On a board's Linux, ``--board NAME``
serves the bitstream's accelerator (`vdla.deploy.board_device.BoardDevice`, as root); anywhere,
``--sim functional|verilator`` serves a simulated one.

``vdla serve --new-key DIR`` first writes a key folder: the server's TLS certificate and
a shared key (``DIR/server.pem``, ``DIR/client.key``); clients get a copy of
``client.key``. The server listens on 127.0.0.1 unless ``--host`` says otherwise."""

from __future__ import annotations

from vdla.cli.common import CONFIG_HELP, CliError, load_config, log

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve this machine's accelerator (a board's, or a "
                                     "simulated one) to `vdla run --remote`")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--board", metavar="NAME",
                       help="the board this runs on (`vdla boards`): its bitstream's accelerator")
    where.add_argument("--sim", choices=("functional", "verilator"),
                       help="serve a simulated accelerator instead")
    where.add_argument("--new-key", metavar="DIR",
                       help="write a new key folder (TLS certificate and shared key) and "
                            "exit; give clients a copy of DIR/client.key")
    p.add_argument("--key-dir", metavar="DIR",
                   help="the key folder `--new-key` wrote (needed to serve)")
    p.add_argument("--config", metavar="FILE",
                   help=f"the config the bitstream was built from (default: the board's, or "
                        f"the default config); {CONFIG_HELP}")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1, this machine only; "
                        "0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=9091, help="port (default 9091; 0: any free)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="--board: seconds a run may take before it is reported hung "
                        "(default 10)")
    p.add_argument("--session-seconds", type=float, default=3600.0, metavar="S",
                   help="wall time one session may hold the device (default 3600)")
    p.add_argument("--idle-seconds", type=float, default=60.0, metavar="S",
                   help="seconds a session's client may take to send a call (default 60)")
    p.add_argument("--max-uops", type=int, default=500_000_000, metavar="N",
                   help="instructions and micro-ops one session's programs may run "
                        "(default 500 million)")
    p.set_defaults(func=run)


def run(args) -> int:
    # Imported here: numpy, ssl and the runtime, which `vdla --help` has no need of (heavy).
    import vdla.runtime
    from vdla.runtime.remote import Limits, new_key, read_server_key, serve

    if args.new_key:
        try:
            key = new_key(args.new_key)
        except (ValueError, ImportError, OSError) as exc:
            raise CliError(str(exc)) from None
        print(f"wrote {args.new_key}/server.pem (the server's certificate and private key: "
              f"it stays on the server) and {key.path} (the shared key and the "
              "certificate's fingerprint: copy it to each client)")
        print(f"certificate SHA-256 fingerprint: {key.fingerprint}")
        print(f"serve: vdla serve --sim functional --key-dir {args.new_key}   (or --board NAME)")
        print(f"client: vdla run MODEL --remote HOST:PORT --key-file {key.path}")
        return 0
    if not (args.board or args.sim):
        raise CliError("give --board NAME or --sim functional|verilator to serve (or "
                       "--new-key DIR to make a key first)")
    if not args.key_dir:
        raise CliError("--key-dir DIR is needed: the folder `vdla serve --new-key DIR` "
                       "writes (its TLS certificate and shared key)")
    if not 0 <= args.port < 65536:
        raise CliError(f"--port must be 0..65535, not {args.port}")
    if not args.timeout > 0:
        raise CliError(f"--timeout must be a positive number of seconds, not {args.timeout}")
    try:
        limits = Limits(session_seconds=args.session_seconds, idle_seconds=args.idle_seconds,
                        max_uops=args.max_uops)
        key = read_server_key(args.key_dir)
    except ValueError as exc:
        raise CliError(str(exc).replace("session_seconds", "--session-seconds")
                       .replace("idle_seconds", "--idle-seconds")
                       .replace("max_uops", "--max-uops")) from None
    config = load_config(args.config) if args.config else None
    if args.board:
        from vdla.boards import BOARDS, runtime_hosts  # heavy: the boards load the runtime
        if args.board not in BOARDS:
            raise CliError(f"--board {args.board!r}: one of {', '.join(sorted(BOARDS))}")
        if not BOARDS[args.board].runs_runtime:
            # Checked here, before serve() opens the board's hardware.
            raise CliError(f"--board {args.board}: the board runtime runs on a Zynq's Linux; "
                           f"serve from {runtime_hosts()}")

        def open_device():
            return BOARDS[args.board].open_hardware(config, timeout=args.timeout)
    else:
        def open_device():
            return vdla.runtime.open(config, backend=args.sim)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        log(f"vdla serve: listening on {args.host}: other machines can reach it; TLS and "
            "the key protect the calls (docs/boards.md, Security)")
    serve(open_device, host=args.host, port=args.port, key=key, log=log, limits=limits)
    return 0
