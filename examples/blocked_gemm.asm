# A blocked int8 GEMM for `vdla sim`: C = clip((A . B^T) >> 6) on VTA's default config.
#
#   A : 2 x 32 int8 (2 rows, K = 32: two inp elements of 16 per row)
#   B : 32 x 32 int8 (N = 32 output columns: two blocks of 16; K in two blocks of 16)
#   C : 2 x 32 int8 (four out elements: row m, column block n at index 2m + n)
#
# The DRAM image (blocked_gemm.py writes it) holds, at these byte addresses:
#   0x000  two micro-ops (4 bytes each)        uop element 0
#   0x040  A, row-major (4 inp elements)        inp element 4   (0x40 / 16)
#   0x100  B in 16 x 16 blocks, (n, k) order    wgt element 1   (0x100 / 256)
#   0x500  C is stored here (4 out elements)    out element 80  (0x500 / 16)
# dram_base fields count elements of the memory type, from DRAM address 0 (where
# `vdla sim --dram` loads the image).
.config 1x16x16_i8w8a32_15_15_18_17

# compute module: the micro-ops. uop 0 = (acc 0, inp 0, wgt 0), uop 1 = (acc 0, inp 1, wgt 1):
# one K block each.
LOAD UOP dram_base=0 y_size=1 x_size=2 x_stride=2

# load module: A and B into the inp and wgt SRAMs; the last load's token (push_next)
# tells compute that both are there.
LOAD INP dram_base=4 y_size=1 x_size=4 x_stride=4
LOAD WGT dram_base=1 y_size=1 x_size=4 x_stride=4 push_next

# compute: clear the four accumulators, then for row m (iter_out) and column block n
# (iter_in): acc[2m + n] += sum over k of inp[2m + k] . wgt[2n + k]. It first waits for
# the loads' token (pop_prev).
GEMM reset_reg uop_bgn=0 uop_end=1 iter_out=4 iter_in=1 dst_factor_out=1
GEMM uop_bgn=0 uop_end=2 iter_out=2 iter_in=2 dst_factor_out=2 dst_factor_in=1 src_factor_out=2 wgt_factor_in=2 pop_prev

# The int32 sums to int8: an arithmetic shift right by 6, then clip to -128..127 (the
# ALU reads acc[dst] and an immediate; uop 0's dst, stepped by dst_factor_out).
ALU SHR use_imm imm=6 uop_bgn=0 uop_end=1 iter_out=4 iter_in=1 dst_factor_out=1
ALU MAX use_imm imm=-128 uop_bgn=0 uop_end=1 iter_out=4 iter_in=1 dst_factor_out=1
ALU MIN use_imm imm=127 uop_bgn=0 uop_end=1 iter_out=4 iter_in=1 dst_factor_out=1 push_next

# store module: waits for compute's token, writes C, and gives FINISH its token back.
STORE dram_base=80 y_size=1 x_size=4 x_stride=4 pop_prev push_prev

# FINISH waits for the store (pop_next): the run ends when C is in DRAM.
FINISH pop_next
