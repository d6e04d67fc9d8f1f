"""Token queues and a command queue in Verilator (cocotb)."""

import json

from cocotb_harness import run_cocotb
from hw_harnesses import HW_CONFIGS
from store_fetch_harness import QueueHarness


def test_queues():
    # The smallest and the default token-queue depths, and a small command queue.
    depths = dict(small=HW_CONFIGS["small"].token_queue_depth,
                  big=HW_CONFIGS["default"].token_queue_depth,
                  cmd=HW_CONFIGS["small"].cmd_queue_depth)
    harness = QueueHarness(small_depth=depths["small"], big_depth=depths["big"],
                           cmd_depth=depths["cmd"])
    run_cocotb(harness, toplevel="queue_harness", testbench="tb_queues",
               env={"VDLA_QUEUE_DEPTHS": json.dumps(depths)})
