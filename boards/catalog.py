"""The boards vdla knows, one definition each.

Part capacities are the vendors' data-sheet figures: LUTs, flip-flops, DSP slices and
36 Kbit block RAMs for Xilinx (DS190, DS891); ALMs, registers, variable-precision DSP
blocks and M10K blocks for the Cyclone V (its device overview); LUT4s, flip-flops,
18x18 multipliers and 18 Kbit EBRs for the ECP5 (its family data sheet). UltraRAM
(zcu104) and LUT/MLAB RAM are not counted as block RAM.

Clocks are what the untested vendor scripts ask the processing system (or PLL) for.
The ECP5 board's is below the Fmax `vdla estimate --board ulx3s-85f` measures. The
others are not timing results (vdla cannot run the vendors' timing analysis here):
100 MHz on the 7-series parts, where the write stage's one-cycle ALU on the acc SRAM
output makes it plausible (docs/hardware.md), and 125 and 150 MHz on the faster
UltraScale+ -1 and -2 speed grades.

Each default config fits its part: `python bench/boards.py` synthesises every one and
prints its utilization (docs/boards.md).
"""

from __future__ import annotations

from vdla.boards.board import Board, Part, Resources
from vdla.config import HardwareConfig

__all__ = ["BOARDS", "get", "names", "runtime_hosts"]

MiB = 1 << 20
GiB = 1 << 30
KiB = 1 << 10

XC7Z020 = Part("xc7z020clg400-1", "zynq-7000",
               Resources(lut=53_200, ff=106_400, dsp=220, bram=140))
XCZU3EG = Part("xczu3eg-sbva484-1-i", "zynq-ultrascale+",
               Resources(lut=70_560, ff=141_120, dsp=360, bram=216))
XCZU7EV = Part("xczu7ev-ffvc1156-2-e", "zynq-ultrascale+",
               Resources(lut=230_400, ff=460_800, dsp=1_728, bram=312))
CYCLONE_V_SE_A6 = Part("5CSEBA6U23I7", "cyclone-v",
                       Resources(lut=41_910, ff=166_036, dsp=112, bram=553))
LFE5U_85F = Part("LFE5U-85F-6BG381C", "ecp5",
                 Resources(lut=83_640, ff=83_640, dsp=156, bram=208))

#: VTA's default design (the PYNQ configuration of the TVM paper).
_VTA = HardwareConfig()

#: Zynq-7000: the accelerator's registers behind M_AXI_GP0 (Vivado's first address for
#: a PL peripheral there), its DRAM master on S_AXI_HP0 (64 bits). The HP ports have
#: their own clock, up to 150 MHz (the Zynq-7000 TRM's 1,200 MB/s read per port), so a
#: 128-bit master at 100 MHz bridged to HP0 at 150 MHz gets 12 bytes a cycle.
_ZYNQ7_HP_MHZ = 150
_ZYNQ7_VENDOR = {"ps_ip": "processing_system7", "ctrl_port": "M_AXI_GP0",
                 "dram_port": "S_AXI_HP0", "irq_pin": "IRQ_F2P", "fclk": "FCLK_CLK0",
                 "port_fclk": "FCLK_CLK1"}
#: Zynq UltraScale+: registers behind M_AXI_HPM0_FPD, DRAM on S_AXI_HP0_FPD (128 bits).
#: The PL-side AXI ports run up to 333 MHz on the -2 speed grade (DS925's PS-PL AXI
#: interface limit), so on the ZCU104 a wider master at the 150 MHz fabric clock, bridged
#: to HP0 on a second PL clock at 333 MHz, gets up to 35.5 bytes a cycle (a 256-bit
#: master: 32, which is also what the Vitis AI DPU's two 128-bit data ports give it per
#: cycle at its 300 MHz).
_ZYNQMP_HP_MHZ = 333
_ZYNQMP_VENDOR = {"ps_ip": "zynq_ultra_ps_e", "ctrl_port": "M_AXI_HPM0_FPD",
                  "dram_port": "S_AXI_HP0_FPD", "irq_pin": "pl_ps_irq0", "fclk": "pl_clk0",
                  "port_fclk": "pl_clk1"}

BOARDS = {board.name: board for board in (
    Board(
        name="pynq-z1", title="Digilent PYNQ-Z1", part=XC7Z020, clock_mhz=100,
        dram_bus_width=64, dram_gbytes_per_s=2.1, dram_read_latency_ns=200,
        dram_port_mhz=_ZYNQ7_HP_MHZ,
        dram_size=512 * MiB, register_base=0x43C0_0000,
        host="Zynq-7000 Cortex-A9: M_AXI_GP0 to the registers, S_AXI_HP0 to DDR3",
        config=_VTA,
        vendor={**_ZYNQ7_VENDOR, "board_part": "www.digilentinc.com:pynq-z1:part0:1.0"}),
    Board(
        name="pynq-z2", title="TUL PYNQ-Z2", part=XC7Z020, clock_mhz=100,
        dram_bus_width=64, dram_gbytes_per_s=2.1, dram_read_latency_ns=200,
        dram_port_mhz=_ZYNQ7_HP_MHZ,
        dram_size=512 * MiB, register_base=0x43C0_0000,
        host="Zynq-7000 Cortex-A9: M_AXI_GP0 to the registers, S_AXI_HP0 to DDR3",
        config=_VTA,
        vendor={**_ZYNQ7_VENDOR, "board_part": "tul.com.tw:pynq-z2:part0:1.0"}),
    Board(
        name="ultra96-v2", title="Avnet Ultra96-V2", part=XCZU3EG, clock_mhz=125,
        dram_bus_width=128, dram_gbytes_per_s=8.5, dram_read_latency_ns=180,
        dram_size=2 * GiB, register_base=0xA000_0000,
        host="Zynq UltraScale+ Cortex-A53: M_AXI_HPM0_FPD to the registers, "
             "S_AXI_HP0_FPD to LPDDR4",
        config=HardwareConfig(dram_bus_width=128),
        vendor={**_ZYNQMP_VENDOR, "board_part": "avnet.com:ultra96v2:part0:1.2"}),
    Board(
        name="zcu104", title="AMD Zynq UltraScale+ MPSoC ZCU104", part=XCZU7EV,
        clock_mhz=150, dram_bus_width=128, dram_gbytes_per_s=19.2,
        dram_read_latency_ns=160, dram_size=2 * GiB, register_base=0xA000_0000,
        dram_port_mhz=_ZYNQMP_HP_MHZ,
        host="Zynq UltraScale+ Cortex-A53: M_AXI_HPM0_FPD to the registers, "
             "S_AXI_HP0_FPD to DDR4",
        config=HardwareConfig(block_in=32, block_out=32, inp_buff_size=64 * KiB,
                              wgt_buff_size=512 * KiB, acc_buff_size=256 * KiB,
                              dram_bus_width=128),
        vendor={**_ZYNQMP_VENDOR, "board_part": "xilinx.com:zcu104:part0:1.1"}),
    Board(
        # The HPS reaches the registers through its lightweight HPS-to-FPGA bridge
        # (0xFF20_0000); the accelerator reads DDR3 through an FPGA-to-SDRAM port.
        name="de10-nano", title="Terasic DE10-Nano", part=CYCLONE_V_SE_A6, clock_mhz=100,
        dram_bus_width=64, dram_gbytes_per_s=3.2, dram_read_latency_ns=220,
        dram_size=1 * GiB, register_base=0xFF20_0000,
        host="Cyclone V HPS Cortex-A9: lightweight HPS-to-FPGA bridge to the registers, "
             "FPGA-to-SDRAM port 0 to DDR3",
        # yosys maps a memory with write lanes (the DMA fills wgt, inp and acc elements a
        # bus word at a time) into M10Ks two bits wide, since its M10K model has no byte
        # enables: 4-5x the blocks Quartus would use. The default is sized to fit even
        # that count: 8x8 keeps the wgt element 512 bits wide (docs/boards.md).
        config=HardwareConfig(block_in=8, block_out=8, wgt_buff_size=64 * KiB,
                              acc_buff_size=32 * KiB),
        vendor={"clock_pin": "PIN_V11", "clock_pin_mhz": 50, "hps_ip": "altera_hps",
                "lw_bridge": "h2f_lw_axi_master", "sdram_port": "f2h_sdram0_data"}),
    Board(
        # No hard processor: a soft CPU (e.g. a LiteX SoC with VexRiscv and a LiteDRAM
        # port for the accelerator) maps the registers into its I/O region, which starts
        # at 0x8000_0000 in LiteX's default memory map, and the accelerator gets its own
        # port on the 16-bit SDR SDRAM controller, seeing the 32 MiB from address 0.
        # 35 MHz (the PLL makes it from the 25 MHz oscillator as 25 x 7 / 5): nextpnr
        # routes the default config at 40.0 MHz on the -6 speed grade (`vdla estimate`).
        name="ulx3s-85f", title="Radiona ULX3S (85F)", part=LFE5U_85F, clock_mhz=35,
        dram_bus_width=32, dram_gbytes_per_s=0.2, dram_read_latency_ns=120,
        dram_size=32 * MiB, register_base=0x8000_0000,
        host="soft CPU (e.g. LiteX VexRiscv): its I/O region to the registers, a "
             "LiteDRAM port to the 32 MiB SDR SDRAM",
        config=HardwareConfig(block_in=16, block_out=8, uop_buff_size=16 * KiB,
                              inp_buff_size=16 * KiB, wgt_buff_size=64 * KiB,
                              acc_buff_size=64 * KiB, dram_bus_width=32),
        vendor={"nextpnr_device": "--85k", "package": "CABGA381", "speed": 6,
                "clock_pin": "G2", "clock_pin_mhz": 25}),
)}


def names() -> list[str]:
    return list(BOARDS)


def runtime_hosts() -> str:
    """The boards whose Linux runs the board runtime (`Board.runs_runtime`), for the
    errors that refuse the others."""
    return ", ".join(name for name, board in BOARDS.items() if board.runs_runtime)


def get(name: str) -> Board:
    """The board called `name`; an unknown name fails listing the known ones."""
    try:
        return BOARDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown board {name!r}; known boards: {', '.join(BOARDS)}") from None
