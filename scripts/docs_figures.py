"""Run the commands behind every figure of the documentation and keep their output.

Each figure is one command (a `vdla` command or a `bench/` script, with flags that keep
it reasonably short); its stdout, trimmed where a page needs only part of it, goes to
``docs/figures/NAME.txt``, and the plots it draws go to ``docs/img/``. The first line of
every figure file says where the figure came from: the command, the commit, the date,
the machine (CPU name, cores, and the instruction set the CPU target generates for), its
load average when the command started, and how long the command took. The pages include
the files with ``--8<--`` snippets, so every number they show is one a command printed
at a known commit.

    python3 scripts/docs_figures.py               # every figure (12-30 minutes on 2 cores)
    python3 scripts/docs_figures.py --only run_resnet18 roofline_resnet18
    python3 scripts/docs_figures.py --list        # names, commands and output files

A figure whose numbers belong to the machine it ran on (the CPU target against
onnxruntime and OpenVINO) is kept per machine: its file is
``docs/figures/NAME--MACHINE.txt`` (and its plots ``NAME--MACHINE.png``), MACHINE the CPU's
name and the instruction set the CPU target generates for (``amd-epyc-avx2``), so a run on
another kind of machine adds its file beside the others instead of replacing them.

Run it at the commit the documentation describes, with the Verilator model cache warm
(the first Verilator run of a config builds its model, about a minute). On two cores it
took 12 minutes at a load average of 3 and half an hour where other work kept the load
near 8; the provenance line records the load each figure ran under. A figure whose
command fails keeps its old file; the script goes on and exits with status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vdla._tools import python_module_argv

ROOT = Path(__file__).resolve().parents[1]
FIGURES_DIR = ROOT / "docs" / "figures"
IMG_DIR = ROOT / "docs" / "img"
# Every figure file starts with this, then the command as a reader would type it.
PROVENANCE_PREFIX = "$ "


@dataclasses.dataclass(frozen=True)
class Figure:
    """name : the figure file's stem (``docs/figures/NAME.txt``)
    command : what a reader types, from the repository root: ``vdla ...`` or
        ``python3 bench/...``; ``{tmp}`` is a scratch folder the command may write into
    tail : keep only the last `tail` lines of stdout (None: all of it)
    head : keep only the first `head` lines (applied before `tail`)
    plots : files the command writes under ``{tmp}`` -> their names in ``docs/img/``
    shows : what the figure is, for ``--list``
    per_machine : keep one file (and plot) per kind of machine (`stem`)
    """

    name: str
    command: str
    shows: str
    tail: int | None = None
    head: int | None = None
    plots: dict[str, str] = dataclasses.field(default_factory=dict)
    per_machine: bool = False

    def stem(self, slug: str | None = None) -> str:
        """The file's stem: the name, and for a per-machine figure ``--`` and the slug
        of the machine (default: this one, `machine_slug`)."""
        if not self.per_machine:
            return self.name
        return f"{self.name}{MACHINE_SEP}{machine_slug() if slug is None else slug}"

    def plot_name(self, name: str, slug: str | None = None) -> str:
        """Plot `name`'s file in ``docs/img/`` (a per-machine figure's carries the slug)."""
        if not self.per_machine:
            return name
        base, dot, ext = name.rpartition(".")
        return f"{base}{MACHINE_SEP}{machine_slug() if slug is None else slug}{dot}{ext}"

    def argv(self, tmp: Path) -> list[str]:
        words = shlex.split(self.command.replace("{tmp}", str(tmp)))
        if words[0] == "vdla":            # the CLI of this interpreter, whatever is on PATH
            return python_module_argv("vdla", *words[1:])
        if words[0] == "python3":
            return [sys.executable, *words[1:]]
        raise ValueError(f"figure {self.name}: a command starts with vdla or python3, "
                         f"not {words[0]!r}")

    def shown_command(self) -> str:
        return self.command.replace("{tmp}", "OUT")

    def trim(self, text: str) -> str:
        lines = text.rstrip("\n").split("\n")
        if self.head is not None:
            lines = lines[:self.head]
        if self.tail is not None:
            lines = lines[-self.tail:]
        return "\n".join(lines) + "\n"


# The CPU figures use one thread: on a machine whose cores other work keeps busy, an
# OpenMP team of two waits at every barrier for a descheduled thread, and the figure
# would measure the neighbours rather than the code.
# 54 points: a minute or two on two quiet cores (the 972-point grid is bench/sweep.py's).
RESNET18_SWEEP = ("vdla sweep --board pynq-z1 --model resnet18 --param block_in=8,16,32 "
                  "--param block_out=8,16,32 --param wgt_buff_size=64K,256K "
                  "--param acc_buff_size=32K,64K,128K --out {tmp}/sweep")
#: BERT-base on the pynq-z1 with and without the ALU's extensions for transformers.
TRANSFORMER_SWEEP = ("vdla sweep --board pynq-z1 --model bert_base --param alu_hold=false,true "
                     "--param alu_ops=MIN+MAX+ADD+SHR+REQ,MIN+MAX+ADD+SHR+REQ+TAB,"
                     "MIN+MAX+ADD+SHR+REQ+DIV,MIN+MAX+ADD+SHR+REQ+TAB+DIV "
                     "--param div_pipeline=false,true --out {tmp}/sweep")

FIGURES = [
    Figure("targets", "vdla targets",
           "the registered targets, their requantization modes and what they run"),
    Figure("boards", "vdla boards", "the FPGA boards, their parts and default configs"),
    Figure("run_resnet18", "vdla run resnet18",
           "ResNet-18 on the accelerator's Verilator model: per-op table and summary"),
    Figure("run_resnet18_zcu104", "vdla run resnet18 --board zcu104",
           "ResNet-18 on the ZCU104's 32x32 config, memory model and clock: the summary",
           tail=7),
    Figure("run_resnet18_cpu", "vdla run resnet18 --target cpu --threads 1",
           "ResNet-18 on the CPU target: per-op table and the whole-graph time", tail=12),
    # Without the GPU target: on Triton's interpreter it takes minutes and times nothing
    # a GPU would; the GPU page has the roofline figures instead.
    Figure("compare_resnet18",
           "vdla compare resnet18 --targets vdla,cpu,host --threads 1 "
           "--reference onnxruntime,openvino --chart docs/img/compare_resnet18.png",
           "ResNet-18 on the accelerator, the CPU and the host, onnxruntime and OpenVINO "
           "beside them: time per op group, bar chart"),
    Figure("roofline_resnet18",
           "vdla roofline resnet18 --gpu h100-sxm,a100-sxm --plot docs/img/roofline_resnet18.png",
           "per-kernel roofline estimate of ResNet-18 (int8) on two GPUs"),
    Figure("roofline_resnet18_fp16",
           "vdla roofline resnet18 --gpu h100-sxm,a100-sxm --precision float16 --top 3",
           "the same estimate for the float16 graph: totals and the costliest kernels"),
    Figure("roofline_gpus",
           "vdla roofline resnet18 --gpu h100-sxm,h100-pcie,h200,a100-sxm,l4,t4,rtx-4090 "
           "--top 1",
           "every named GPU's datasheet peaks and its source, and ResNet-18's totals on each"),
    Figure("tune_c8", "vdla tune --layer C8 --trials 32 --records {tmp}/tune.db --jobs 2",
           "32 Verilator-measured schedules of ResNet-18's C8 layers against the default"),
    Figure("sweep_resnet18", RESNET18_SWEEP,
           "a 54-point sweep of ResNet-18 on pynq-z1's xc7z020: front, invalid reasons, plot",
           plots={"sweep/sweep.png": "sweep_resnet18_xc7z020.png"}),
    Figure("sweep_bert_base", TRANSFORMER_SWEEP,
           "BERT-base (128 tokens) on pynq-z1 with and without TAB, DIV, the pipelined "
           "divider and alu_hold: front and plot", plots={"sweep/sweep.png": "sweep_bert_base_xc7z020.png"}),
    Figure("frontend", "python3 bench/frontend.py --models resnet18 resnet50",
           "time of the compiler's front half on ResNet-18 and ResNet-50"),
    Figure("coverage", "python3 bench/coverage.py --backend functional --verilator-models none",
           "per model: ops and MACs on vdla against the host, host ops by reason"),
    Figure("resnet18_layers", "python3 bench/resnet18_layers.py",
           "GEMM utilization of ResNet-18's C2-C11 on Verilator, one and two virtual threads"),
    Figure("model_layers", "python3 bench/model_layers.py",
           "ResNet-18, ResNet-50 and MobileNet-v1 layer by layer on Verilator: before, "
           "after, the timing model"),
    Figure("model_layers_vta_plus", "python3 bench/model_layers.py --config vta-plus",
           "the three models layer by layer on VTA's sizes with REQ and hold, beside the "
           "timing model"),
    Figure("model_layers_pynq_z1_plus",
           "python3 bench/model_layers.py --config pynq-z1-plus --models resnet18 mobilenet_v1 "
           "resnet50",
           "the three models layer by layer on pynq-z1-plus (1x16x32, REQ, hold, the "
           "window, 220 DSPs, a 128-bit bus)"),
    Figure("model_layers_pynq_z1_transformers",
           "python3 bench/model_layers.py --config pynq-z1-transformers --models bert_tiny "
           "gpt_mini vit_tiny",
           "BERT-tiny, GPT-mini and ViT-tiny layer by layer on pynq-z1-transformers (TAB, "
           "DIV and the pipelined divider): Verilator against the timing model"),
    Figure("model_layers_zcu104_plus",
           "python3 bench/model_layers.py --config zcu104-plus --board zcu104 --models resnet50 "
           "resnet18 mobilenet_v1 mobilenet_v2",
           "the four models the DPU's latencies cover, layer by layer on zcu104-plus at the "
           "ZCU104's DRAM model, beside the timing model"),
    Figure("dpu_zcu104", "python3 bench/dpu.py --plot {tmp}/dpu.png",
           "zcu104-plus against the Vitis AI DPU B4096 on the ZCU104: cycles on Verilator "
           "beside the DPU's published latencies, resources, a plot",
           plots={"dpu.png": "dpu_zcu104.png"}),
    Figure("sweep_zcu104_dpu",
           "vdla sweep bench/sweep_zcu104_dpu.toml --out {tmp}/sweep --best {tmp}/best.json",
           "the ZCU104 sweep that chose zcu104-plus: its front and what it left out",
           plots={"sweep/sweep.png": "sweep_zcu104_dpu.png"}),
    Figure("resnet18_layers_vta_plus", "python3 bench/resnet18_layers.py --config vta-plus",
           "ResNet-18's C2-C11 on VTA's sizes with REQ and hold"),
    Figure("resnet18_layers_pynq_z1_plus",
           "python3 bench/resnet18_layers.py --config pynq-z1-plus",
           "ResNet-18's C2-C11 on pynq-z1-plus"),
    Figure("extension_table", "python3 bench/extensions.py",
           "what each extension past VTA saves on Verilator and costs by yosys"),
    Figure("sweep_extensions", "python3 bench/sweep_extensions.py --out {tmp}/sweep",
           "ResNet-18 and MobileNet-v1 on pynq-z1 with the extensions past VTA as sweep "
           "dimensions: the fronts with and without them",
           plots={"sweep/fronts.png": "sweep_extensions.png"}),
    Figure("front_timing",
           "python3 bench/front_timing.py bench/baselines/sweep_extensions_fronts.json "
           "--out {tmp}/front-timing.json --jobs 2",
           "the timing model against Verilator on every layer of the three models for each "
           "extension combination on the extensions sweep's fronts"),
    Figure("pools", "python3 bench/pools.py", "pools on Verilator against the timing model"),
    Figure("hw_timing", "python3 bench/hw_timing.py",
           "cycles of GEMM and ALU instructions, load/store/fetch bus words per cycle"),
    Figure("sim_speed", "python3 bench/sim_speed.py --no-cold --repeat 5",
           "the Verilator backend's simulated cycles per second: the old build and each "
           "speed-up"),
    Figure("sim_scaling", "python3 bench/sim_scaling.py --out {tmp}/scaling",
           "ResNet-18's ops simulated in parallel on local processes and Ray actors, and "
           "a cluster projection, with its plot",
           plots={"scaling/sim_scaling.png": "sim_scaling.png"}),
    Figure("tuner_speed", "python3 bench/tuner_speed.py --per-task 4",
           "the tuner's measurements per minute on C2-C11, the old build against today's"),
    Figure("tuner_transfer", "python3 bench/tuner_transfer.py",
           "the cost model on configs it never saw: ranking, and few-shot tuning of the "
           "reduced layers (replayed Verilator measurements)"),
    Figure("tuner_model", "python3 bench/tuner_model.py --part zeroshot model "
           "--plot {tmp}/tuner_model.png",
           "zero-shot schedules and ResNet-18 tuned in 64 measurements on unseen configs "
           "(Verilator; resumes from its records in vdla's cache)",
           plots={"tuner_model.png": "tuner_model_resnet18.png"}),
    Figure("tuner_model_cpu", "python3 bench/tuner_model.py --part cpu "
           "--cpu-plot {tmp}/tuner_model_cpu.png",
           "MobileNet-v1 float32 tuned in 64 measurements on the CPU, against 1,000 from "
           "scratch (wall time, one thread; resumes from its records in vdla's cache)",
           plots={"tuner_model_cpu.png": "tuner_model_mobilenet_cpu.png"}),
    Figure("tuner_adapt_cpu", "python3 bench/tuner_model.py --part cpu --cpu-model resnet18 "
           "--cpu-precision float32 int8 --cpu-leave-out auto "
           "--cpu-plot {tmp}/tuner_adapt_cpu.png",
           "ResNet-18 tuned in 64 measurements on the CPU by models trained without this "
           "machine's instruction set, against 1,000 from scratch (wall time, one thread; "
           "resumes from its records in vdla's cache), one file per kind of machine",
           plots={"tuner_adapt_cpu_float32.png": "tuner_adapt_cpu_float32.png",
                  "tuner_adapt_cpu_int8.png": "tuner_adapt_cpu_int8.png"}, per_machine=True),
    Figure("resnet18_e2e", "python3 bench/resnet18_e2e.py --repeat 5",
           "vdla run resnet18 and resnet50 end to end, warm, sequential and in parallel"),
    Figure("functional_sim", "python3 bench/functional_sim.py --repeat 3",
           "the functional simulator's int8 MAC/s on blocked GEMMs"),
    Figure("cpu_fusion", "python3 bench/cpu_fusion.py --rounds 15",
           "MobileNet-v1's depthwise and pointwise pairs and ResNet-18's stem and max "
           "pool, fused and unfused, alternating in one process"),
    Figure("cpu_speed",
           "python3 bench/cpu.py --threads 2 --skip-tune --skip-convergence --skip-exactness "
           "--rounds 9 --out {tmp}/cpu",
           "the CPU target against onnxruntime and OpenVINO (default schedules), with its "
           "chart, one file per kind of machine",
           plots={"cpu/cpu.png": "cpu_speed.png"}, per_machine=True),
    Figure("cpu_transformers",
           "python3 bench/cpu_transformers.py --runs 5 --rounds 3 --ops --out {tmp}/transformers",
           "the CPU target against onnxruntime's fastest way on BERT-base and ViT-tiny, "
           "float32 and int8, one file per kind of machine", per_machine=True),
    Figure("cpu_bf16", "python3 bench/cpu_bf16.py --inputs 8",
           "the bf16 precision's error against float32 on the CPU target's tile kernels "
           "(on the software model of the tiles where AMX-BF16 does not run)"),
    Figure("transformer_error", "python3 bench/transformer_error.py",
           "the seeded transformers' int8 logits against float, with the integer "
           "softmax, LayerNorm and GELU and with them in float"),
]
BY_NAME = {f.name: f for f in FIGURES}


def _git(*args: str) -> str:
    """git's output, its trailing newline removed (not its leading spaces: a porcelain
    status line starts with one where the index is unchanged)."""
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.rstrip("\n")


def commit() -> str:
    """The short commit, with ``-dirty`` when tracked files outside the figures differ."""
    head = _git("rev-parse", "--short", "HEAD")
    changed = [line[3:] for line in _git("status", "--porcelain", "--untracked-files=no")
               .splitlines()]
    ours = ("docs/figures/", "docs/img/")
    return head + ("-dirty" if any(not p.startswith(ours) for p in changed) else "")


ISA_NAMES = {"amx": "AMX", "avx512vnni": "AVX-512 VNNI", "avx2": "AVX2",
             "portable": "portable C"}
#: Between a per-machine figure's name and its machine's slug in file names.
MACHINE_SEP = "--"


def machine_slug() -> str:
    """This machine's kind for per-machine figure files: the CPU's name and the
    instruction set the CPU target generates for, lower case, words joined by ``-``
    (``amd-epyc-avx2``; trademark marks and the clock dropped)."""
    from vdla._platform import cpu_name
    from vdla.compiler.targets.cpu import isa
    name = re.sub(r"\((r|tm)\)|\bcpu\b|@.*$", " ", cpu_name().lower())
    return re.sub(r"[^a-z0-9]+", "-", f"{name} {isa.detect().name}").strip("-")


def figure_of(stem: str) -> tuple[Figure, str | None]:
    """The figure a file stem belongs to and its machine slug (None: not per machine).
    KeyError for a stem no figure makes."""
    name, sep, slug = stem.partition(MACHINE_SEP)
    figure = BY_NAME[name]
    if bool(sep) != figure.per_machine or (sep and not slug):
        raise KeyError(stem)
    return figure, slug or None


def machine() -> str:
    """The CPU, its cores and the instruction set the CPU target generates code for."""
    # Imported here: the CPU target probes the C compiler, which --list has no need of.
    from vdla._platform import cpu_name
    from vdla.compiler.targets.cpu import isa
    found = isa.detect().name
    return f"{cpu_name()}, {os.cpu_count()} cores, {ISA_NAMES.get(found, found)}"


def provenance(figure: Figure, where: str, load: float, seconds: float) -> str:
    """The first line of a figure file. `load` is the one-minute load average when the
    command started: wall-time figures on a machine others keep busy are slower."""
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    return (f"{PROVENANCE_PREFIX}{figure.shown_command()}    "
            f"# commit {where}, {today}, {machine()}, load {load:.1f}, {seconds:.0f} s")


def make(figure: Figure, where: str) -> tuple[bool, float, str]:
    """Run `figure`'s command; write its file and plots. (ok, seconds, error)"""
    from vdla._fileio import atomic_write
    with tempfile.TemporaryDirectory(prefix=f"vdla-figure-{figure.name}-") as tmp:
        load = os.getloadavg()[0]
        started = time.perf_counter()
        done = subprocess.run(figure.argv(Path(tmp)), cwd=ROOT, capture_output=True,
                              text=True)
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            last = (done.stderr or done.stdout).strip().splitlines()[-5:]
            return False, seconds, f"exit status {done.returncode}: " + " | ".join(last)
        missing = [src for src in figure.plots if not (Path(tmp) / src).is_file()]
        if missing:   # nothing written: a figure's text and its plots go together
            return False, seconds, (f"the command wrote no {', '.join(missing)} (it exited "
                                    f"0; its last line: {done.stdout.strip()[-200:]!r})")
        for src, dst in figure.plots.items():
            data = (Path(tmp) / src).read_bytes()
            atomic_write(IMG_DIR / figure.plot_name(dst), data)
        # The scratch folder's name changes every run; the command line calls it OUT.
        output = done.stdout.replace(tmp, "OUT")
        text = provenance(figure, where, load, seconds) + "\n" + figure.trim(output)
        atomic_write(FIGURES_DIR / f"{figure.stem()}.txt", text.encode())
    return True, seconds, ""


# A README block that quotes a figure: the marker line, then a ```text fence that
# `sync_readme` rewrites from the figure file (the provenance line, then the figure's
# first `head` or last `tail` lines). The README cannot include snippets (GitHub shows it
# as it is), so the script copies, and tests/test_docs_figures.py checks the copy.
README = ROOT / "README.md"
_README_BLOCK = re.compile(r"(<!-- figure (\w+)(?: (head|tail)=(\d+))? -->\n```text\n)(.*?)(```)",
                           re.S)


def readme_quote(name: str, cut: str | None, n: int | None) -> str:
    """What the README shows of figure `name`: its provenance line and a cut of it."""
    lines = (FIGURES_DIR / f"{name}.txt").read_text().rstrip("\n").split("\n")
    first, body = lines[0], lines[1:]
    if cut == "head":
        body = body[:n]
    elif cut == "tail":
        body = body[-n:]
    return "\n".join([first, *body]) + "\n"


def sync_readme(text: str) -> str:
    """`text` (the README) with every figure block rewritten from its figure file."""
    def quote(m: re.Match) -> str:
        name, cut, n = m.group(2), m.group(3), m.group(4)
        if name not in BY_NAME:
            raise ValueError(f"README quotes figure {name!r}, which scripts/docs_figures.py "
                             f"does not define (known: {', '.join(BY_NAME)})")
        if BY_NAME[name].per_machine:
            raise ValueError(f"README quotes figure {name!r}, which is kept per machine: "
                             "the README quotes one file, so quote a figure that is not")
        return m.group(1) + readme_quote(name, cut, int(n) if n else None) + m.group(6)
    return _README_BLOCK.sub(quote, text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=list(BY_NAME),
                        help="make only these figures")
    parser.add_argument("--list", action="store_true",
                        help="list the figures, their commands and files, and stop")
    args = parser.parse_args(argv)
    chosen = [BY_NAME[n] for n in args.only] if args.only else FIGURES
    if args.list:
        slug = "MACHINE"          # --list names no machine: it probes no compiler
        for f in chosen:
            plots = "".join(f" + docs/img/{f.plot_name(p, slug)}" for p in f.plots.values())
            print(f"{f.name:24} docs/figures/{f.stem(slug)}.txt{plots}\n{'':24} "
                  f"{f.shown_command()}\n{'':24} {f.shows}")
        return 0
    where = commit()
    failed = []
    total = time.perf_counter()
    for i, figure in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {figure.name}: {figure.shown_command()}", end=" ... ",
              file=sys.stderr, flush=True)
        ok, seconds, error = make(figure, where)
        print(f"{seconds:.0f} s" + ("" if ok else f", FAILED ({error})"), file=sys.stderr,
              flush=True)
        if not ok:
            failed.append(figure.name)
    from vdla._fileio import atomic_write
    atomic_write(README, sync_readme(README.read_text()).encode())
    print(f"{len(chosen) - len(failed)} of {len(chosen)} figures written at commit {where} "
          f"in {time.perf_counter() - total:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
