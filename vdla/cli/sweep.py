"""``vdla sweep``: sweep hardware parameters, report the Pareto front, confirm it."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import re
import sys
import time
from pathlib import Path

from vdla._fileio import atomic_write
from vdla.cli.common import (CliError, add_ray_option, log, on_interrupt, output_file,
                             write_json)
from vdla.config import HardwareConfig
from vdla.dse import report
from vdla.dse.confirm import confirm
from vdla.dse.evaluate import Evaluator, make_evaluator
from vdla.execute import make_executor
from vdla.dse.pareto import pareto_front
from vdla.dse.search import run_sweep, violation
from vdla.dse.spec import ModelSpec, SweepSpec, parse_param
from vdla.dse.store import Store

__all__ = ["add_parser", "run"]

_EPILOG = """\
examples:
  vdla sweep examples/sweep_small_cnn.toml --best best.json   # 16 points, seconds
  vdla sweep sweep.toml                          # the spec's grid or sampler, 2 jobs
  vdla sweep --board pynq-z1 --model resnet18 --param block_in=8,16,32 \\
             --param block_out=8..32 --param acc_buff_size=32K,64K,128K
  vdla sweep sweep.toml --confirm 5              # then Verilator + yosys on 5 front points
  vdla sweep sweep.toml --best best.json && vdla run resnet18 --config best.json
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sweep", help="sweep hardware parameters over models and a board: Pareto front of "
                      "latency and resources, plots, the best config",
        description="Evaluate design points (HardwareConfig parameters on a board's part) "
                    "with the compiler's timing model and a resource model calibrated "
                    "against yosys, in parallel processes or on Ray; keep every point in a "
                    "durable store (a second run resumes); report the Pareto front as a "
                    "table, Markdown, plots, HTML and JSON; confirm front points with "
                    "Verilator and yosys (--confirm).",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", metavar="SPEC", nargs="?",
                   help="sweep spec TOML (see docs/sweeps.md); flags below override it")
    p.add_argument("--board", metavar="NAME", help="board whose part bounds the resources")
    p.add_argument("--model", metavar="NAME[:WEIGHT]", action="append",
                   help="zoo model or .onnx path, with a weight; may be repeated")
    p.add_argument("--param", metavar="NAME=VALUES", action="append",
                   help="a HardwareConfig field and its values: V1,V2,... or MIN..MAX "
                        "(powers of two); sizes may use K/M; may be repeated")
    p.add_argument("--objectives", metavar="A,B,...",
                   help="objectives (default latency_ms,lut,bram,dsp; also cycles, ff, "
                        "gemm_utilization)")
    p.add_argument("--max-latency-ms", type=float, metavar="MS",
                   help="constraint: points slower than this are not on the front")
    p.add_argument("--max-utilization", type=float, metavar="SHARE",
                   help="constraint: points using more than this share (0 to 1) of any of "
                        "the part's resources are not on the front (default 1)")
    p.add_argument("--search", choices=("auto", "grid", "nsga2", "tpe"),
                   help="grid, Optuna NSGA-II or multi-objective TPE (default auto: the grid "
                        "up to 2000 points)")
    p.add_argument("--trials", type=int, metavar="N", help="points a sampler evaluates")
    p.add_argument("--seed", type=int, metavar="N", help="the sampler's seed")
    p.add_argument("--tune", type=int, metavar="N",
                   help="tune each point's convolutions with N trials (functional backend, "
                        "timing-model cycles; records in OUT/tune.db) instead of the default "
                        "schedules")
    p.add_argument("--jobs", type=int, default=2, metavar="J",
                   help="local worker processes, or the CPUs of --ray local's instance "
                        "(default 2)")
    add_ray_option(p, "evaluate the points on Ray instead of local processes")
    p.add_argument("--out", metavar="DIR",
                   help="where reports go, created if need be (default "
                        "sweep-<spec name or models>-<board>)")
    p.add_argument("--store", metavar="DB", type=output_file,
                   help="results store, SQLite (default OUT/sweep.db); shared stores are safe")
    p.add_argument("--json", metavar="PATH", type=output_file,
                   help="also write points and front as JSON here")
    p.add_argument("--best", metavar="PATH", type=output_file,
                   help="write the best config (fastest on the front within the constraints) "
                        "as JSON for --config")
    p.add_argument("--confirm", type=int, default=0, metavar="N",
                   help="confirm N front points with Verilator and yosys (minutes each)")
    p.add_argument("--no-plots", action="store_true", help="skip the plots and HTML")
    p.set_defaults(func=run)


def _model_arg(text: str) -> tuple[str, float]:
    """``NAME`` or ``NAME:WEIGHT`` (a path may hold colons: only a number after the last
    one is a weight)."""
    name, sep, weight = text.rpartition(":")
    try:
        return (name, float(weight)) if sep else (text, 1.0)
    except ValueError:
        return text, 1.0


def _spec(args):
    if args.spec:
        spec = SweepSpec.from_toml(args.spec)
    else:
        missing = [f for f, v in (("--board", args.board), ("--model", args.model),
                                  ("--param", args.param)) if not v]
        if missing:
            raise CliError(f"without a SPEC file, give {', '.join(missing)}")
        spec = None
    changes = {}
    if args.board:
        changes["board"] = args.board
    if args.model:
        changes["models"] = tuple(ModelSpec(*_model_arg(text)) for text in args.model)
    if args.param:
        params = dict(parse_param(text) for text in args.param)
        changes["parameters"] = ({**spec.parameters, **{k: tuple(v) for k, v in params.items()}}
                                 if spec else {k: tuple(v) for k, v in params.items()})
    if args.objectives:
        changes["objectives"] = tuple(o.strip() for o in args.objectives.split(",") if o.strip())
    for name in ("max_latency_ms", "max_utilization", "search", "trials", "seed", "tune"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if spec is None:
        # Named after what it sweeps (the log, the reports' titles and the default
        # folder), not the generic "sweep" ("sweep sweep: ...").
        spec = SweepSpec(**changes)
        return spec.replace(name=_default_out(spec).name.removeprefix("sweep-"))
    return dataclasses.replace(spec, **changes) if changes else spec


def run(args) -> int:
    if args.jobs < 1:
        raise CliError(f"--jobs must be at least 1, not {args.jobs}")
    if args.confirm < 0:
        raise CliError(f"--confirm must be 0 or more, not {args.confirm}")

    spec = _spec(args)
    out = Path(args.out) if args.out else _default_out(spec)
    _check_outputs(args, out)
    store_path = Path(args.store) if args.store else out / "sweep.db"
    tune_records = str(out / "tune.db") if spec.tune else None
    evaluator = Evaluator(spec, tune_records=tune_records)   # checks board and models
    out.mkdir(parents=True, exist_ok=True)
    log(f"sweep {spec.name}: {len(spec.models)} model(s) on {evaluator.board.name} "
        f"({evaluator.board.part.name}), {spec.method} search over "
        + (f"{spec.grid_size} points" if spec.method == "grid" else
           f"{spec.trials} trials of {spec.grid_size} points")
        + f"; {evaluator.resource_model.describe()}")
    progress, state = _progress()
    with Store(store_path) as store:
        on_interrupt(args, lambda: f"sweep stopped after {state['done']} point(s); every "
                     f"finished point is kept in {store_path} (run again to resume)")
        factory = functools.partial(make_evaluator, spec.to_dict(), tune_records)
        with make_executor(factory, jobs=args.jobs, ray=args.ray) as executor:
            log(f"evaluating on {executor.describe()}")
            result = run_sweep(spec, store, executor, progress=progress, evaluator=evaluator)
        state["end"]()
        records = result.records
        fronts = _front(records, spec)
        if args.confirm and not fronts:
            log("no point to confirm: the front is empty")
        elif args.confirm:
            _confirm(_spread(fronts, args.confirm, spec), spec, store, args)
            by_key = store.get_many([r["key"] for r in records])
            records = [by_key.get(r["key"], r) for r in records]
            fronts = _front(records, spec)
    valid = [r for r in records if r["valid"]]
    fitting = [r for r in valid if violation(r, spec) <= 0]
    params = _columns(spec)
    print(f"{len(records)} points ({result.reused} from the store), {len(valid)} valid, "
          f"{len(fitting)} within the constraints, {len(fronts)} on the Pareto front "
          f"of {', '.join(spec.objectives)}; {result.seconds:.1f} s")
    if fronts:
        print(report.front_table(fronts, params, list(spec.objectives)))
    reasons = report.invalid_reasons(records)
    for reason, count in reasons[:5]:
        print(f"invalid ({count}): " + (reason if len(reason) <= 200 else reason[:197] + "..."))
    meta = {"spec": spec.to_dict(), "store": str(store_path), "seconds": result.seconds,
            "reused": result.reused, "method": result.method,
            "resource_model": evaluator.resource_model.describe()}
    empty = None if fronts else _why_no_front(records, spec, evaluator.board.part.name)
    if empty:
        print(f"no point on the front: {empty}")
    # The reports are written whether or not there is a best config: an empty front is
    # worth seeing (the table of invalid reasons, the plots of the points that were over).
    written = _reports(records, fronts, spec, out, args, meta, evaluator)
    if args.best and fronts:
        best = min(fronts, key=lambda r: r["objectives"]["latency_ms"])
        HardwareConfig.from_dict(best["config"]).to_json(args.best)
        written.append(args.best)
        print(f"best: {best['config_name']} ({best['objectives']['latency_ms']:.3g} ms) -> "
              f"{args.best}")
    if written:
        print("wrote " + ", ".join(map(str, written)))
    if args.best and not fronts:
        raise CliError(f"--best {args.best}: no best config to write, the front is empty: "
                       f"{empty}")
    return 0


def _why_no_front(records, spec, part: str) -> str:
    """Why no point is on the front: which constraint removed every valid point, and
    how far the nearest point is from it (what to relax it to)."""
    valid = [r for r in records if r["valid"]]
    if not valid:
        return (f"none of the {len(records)} point(s) is valid (their reasons are above); "
                "change the parameters' values")
    if spec.fits:
        limit = spec.max_utilization
        fitting = [r for r in valid if r.get("utilization")
                   and max(r["utilization"].values()) <= limit]
        if not fitting:
            least = min(valid, key=lambda r: max(r["utilization"].values()))
            resource, share = max(least["utilization"].items(), key=lambda kv: kv[1])
            within = (f"fits within {100 * limit:g}% of" if limit < 1 else "fits")
            which = (f"max_utilization = {limit:g}" if limit < 1 else "fits = true")
            return (f"no valid point {within} {part} (constraint {which}); the smallest, "
                    f"{least['config_name']}, needs {100 * share:.0f}% of its "
                    f"{resource.upper()}")
        valid = fitting
    if spec.max_latency_ms is not None:
        fastest = min(valid, key=lambda r: r["objectives"]["latency_ms"])
        if fastest["objectives"]["latency_ms"] > spec.max_latency_ms:
            which = "valid point that fits the part" if spec.fits else "valid point"
            return (f"no point meets max_latency_ms = {spec.max_latency_ms:g}; the fastest "
                    f"{which}, {fastest['config_name']}, takes "
                    f"{fastest['objectives']['latency_ms']:.3g} ms (relax --max-latency-ms "
                    "or the spec's [constraints])")
    missing = sorted({o for r in valid for o in spec.objectives
                      if r["objectives"].get(o) is None})
    return (f"no point within the constraints has a value for every objective "
            f"(missing: {', '.join(missing) or 'none'})")


def _check_outputs(args, out: Path) -> None:
    """Refuse an --out that is a file before the sweep runs. The output files (--json,
    --best, --store) are checked before (`output_file`: their folder must exist);
    the output folder itself is created."""
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {out} is a file, not a folder")


def _default_out(spec) -> Path:
    """``sweep-<label>-<board>``: the label is the spec's name less a leading "sweep"
    (``sweep_resnet18_pynq.toml`` must not give ``sweep-sweep_...``), or, when that leaves
    nothing (flags only, or a file called sweep.toml), the models' names; the board is
    added unless the label already ends with it."""
    label = re.sub(r"^sweep(?:[-_.]+|$)", "", spec.name, flags=re.IGNORECASE)
    if not label:
        # An ONNX model by its file's stem: a path's folders would nest the output.
        label = "+".join(Path(m.name).stem if m.name.endswith(".onnx") else m.name
                         for m in spec.models)
    label = re.sub(r"[^A-Za-z0-9._+-]+", "_", label).strip("_") or "models"
    if not label.endswith(spec.board):
        label = f"{label}-{spec.board}"
    return Path(f"sweep-{label}")


def _varied(spec) -> list[str]:
    """The parameters the sweep varies (what the plots may be coloured by)."""
    return [p for p, values in spec.parameters.items() if len(values) > 1]


def _columns(spec) -> list[str]:
    """The reports' parameter columns: those the sweep varies, or, when none does (one
    point), every parameter given, so the table still says what was asked for."""
    return _varied(spec) or list(spec.parameters)


def _front(records, spec):
    ok = [r for r in records if r["valid"] and violation(r, spec) <= 0]
    unique = list({r["key"]: r for r in ok}.values())
    return pareto_front(unique, list(spec.objectives))


def _spread(front, n, spec):
    """`n` front points spread along the first objective (both ends included; all of
    them when the front has no more than `n`)."""
    ranked = sorted(front, key=lambda r: r["objectives"][spec.objectives[0]])
    picks = sorted({round(i * (len(ranked) - 1) / (n - 1)) for i in range(n)}) if n > 1 else [0]
    return [ranked[i] for i in picks]


def _confirm(points, spec, store, args):
    loaded, start = {}, time.perf_counter()
    for i, record in enumerate(points):
        if record.get("confirmed"):
            log(f"confirm [{i + 1}/{len(points)}] {record['config_name']}: already confirmed")
            continue
        elapsed = time.perf_counter() - start
        eta = f", ETA {_duration(elapsed / i * (len(points) - i))}" if i else ""
        log(f"confirm [{i + 1}/{len(points)}] {record['config_name']} (Verilator and yosys; "
            f"{_duration(elapsed)} so far{eta})")
        confirmed = confirm(record, spec, loaded=loaded, log=lambda m: log("  " + m))
        store.put_confirmed(record["key"], confirmed)
        e = confirmed["error"]
        log(f"  cycles {confirmed['cycles']:,} (model {_pct(e['cycles'])}), LUT "
            f"{confirmed['resources']['lut']:,.0f} ({_pct(e['lut'])}), BRAM "
            f"{confirmed['resources']['bram']:g} ({_pct(e['bram'])}), DSP "
            f"{confirmed['resources']['dsp']:g} ({e['dsp']:+g}); bit-exact "
            f"{'yes' if confirmed['bit_exact'] else 'NO'}")


def _pct(x):
    return "-" if x is None else f"{100 * x:+.1f}%"


def _duration(seconds: float) -> str:
    # Rounded up: an ETA of a fraction of a second is "1s", never "0s" with work left.
    seconds = math.ceil(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _progress():
    """A progress callback with an ETA: one updating line on a terminal, a log line per
    10% otherwise."""
    tty = sys.stderr.isatty()
    state = {"shown": -1, "valid": 0, "done": 0, "end": lambda: None}

    def show(done, total, record, eta):
        state["valid"] += bool(record.get("valid"))
        state["done"] = done
        pct = 100 * done // max(total, 1)
        line = (f"sweep [{done}/{total}] {pct}%, {state['valid']} valid"
                + (f", ETA {_duration(eta)}" if eta is not None and done < total else ""))
        if tty:
            print(f"\r\x1b[K{line}", end="", file=sys.stderr, flush=True)
        elif pct // 10 != state["shown"] // 10 or done == total:
            state["shown"] = pct
            log(line)

    if tty:
        state["end"] = lambda: print("\r\x1b[K", end="", file=sys.stderr, flush=True)
    return show, state


def _reports(records, front, spec, out, args, meta, evaluator):
    params = _columns(spec)
    objectives = list(spec.objectives)
    written = []
    md = out / "front.md"
    atomic_write(md, (f"# {spec.name}: Pareto front\n\n"
                      + report.front_markdown(front, params, objectives) + "\n").encode())
    written.append(md)
    document = report.to_json(records, front, meta)
    write_json(out / "sweep.json", document)
    written.append(out / "sweep.json")
    if args.json:
        write_json(args.json, document)
        written.append(args.json)
    # Drawn with no valid point too (the plot says so): the page's table of invalid
    # reasons is then what the user needs most.
    if not args.no_plots:
        # Coloured by the parameter that matters most; with nothing varying, one colour.
        varied = _varied(spec)
        color = report.most_important_parameter(records, varied) if varied else None
        cap = evaluator.capacity
        part = {"name": evaluator.board.part.name, **{k: getattr(cap, k) for k in cap.KEYS}}
        plots = report.plot(records, front, out, color_by=color, part=part,
                            max_utilization=spec.max_utilization)
        written += plots
        html = report.html_report(records, front, params, objectives, plots,
                                  title=f"vdla sweep {spec.name}", summary={
                                      "board": evaluator.board.name,
                                      "models": ", ".join(m.name for m in spec.models),
                                      "search": meta["method"],
                                      "seconds": f"{meta['seconds']:.1f}",
                                      "resource model": meta["resource_model"]})
        atomic_write(out / "report.html", html.encode())
        written.append(out / "report.html")
    return written
