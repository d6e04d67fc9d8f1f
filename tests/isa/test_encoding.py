"""Binary encoding of instructions and micro-ops.

The golden bit ranges below are VTA 0.0.2's layout, as docs/isa.md's table gives it, written
out independently of `vdla.isa.layout`.
"""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vdla import AluOp, HardwareConfig
from vdla_testing import FLAG_FIELDS, instructions
from vdla.isa import (INSN_BYTES, Alu, DecodeError, EncodeError, Finish, Gemm, Load,
                      MemoryType, Opcode, Store, Uop, decode, decode_stream, decode_uop,
                      decode_uops, encode, encode_stream, encode_uop, encode_uops,
                      layouts_for, uop_layout)

DEFAULT = HardwareConfig()
MUL_OPS = ["MIN", "MAX", "ADD", "SHR", "MUL"]
#: batch 2, 32x32 blocks: narrower factor fields (acc/inp depth 512, wgt depth 256).
BIG = HardwareConfig(batch=2, block_in=32, block_out=32, alu_ops=MUL_OPS)
SMALL = HardwareConfig(uop_buff_size=4096, inp_buff_size=8192, wgt_buff_size=16384,
                       acc_buff_size=16384)
#: uop depth 16384: GEMM's and ALU's first group needs 65 bits, so the second starts at 65.
WIDE = HardwareConfig(uop_buff_size=65536, inp_buff_size=16384, acc_buff_size=65536)
#: dst 11 + src 11 + wgt 11 bits: micro-ops are 64-bit words.
UOP64 = HardwareConfig(inp_buff_size=16384, wgt_buff_size=524288, alu_ops=MUL_OPS)
CONFIGS = {"default": DEFAULT, "big": BIG, "small": SMALL, "wide": WIDE, "uop64": UOP64}

FLAGS = {"pop_prev": 3, "pop_next": 4, "push_prev": 5, "push_next": 6}
OPCODES = {"LOAD": 0, "STORE": 1, "GEMM": 2, "FINISH": 3, "ALU": 4}
MEMORY_TYPES = {"UOP": 0, "WGT": 1, "INP": 2, "ACC": 3, "OUT": 4}
ALU_OPS = {"MIN": 0, "MAX": 1, "ADD": 2, "SHR": 3, "MUL": 4}

# (msb, lsb) of each field for the default config (docs/isa.md, layout for the default config).
MEM_BITS = {"memory_type": (9, 7), "sram_base": (25, 10), "dram_base": (57, 26),
            "y_size": (79, 64), "x_size": (95, 80), "x_stride": (111, 96),
            "y_pad_0": (115, 112), "y_pad_1": (119, 116), "x_pad_0": (123, 120),
            "x_pad_1": (127, 124)}
LOOP_BITS = {"reset_reg": (7, 7), "uop_bgn": (20, 8), "uop_end": (34, 21),
             "iter_out": (48, 35), "iter_in": (62, 49), "dst_factor_out": (74, 64),
             "dst_factor_in": (85, 75), "src_factor_out": (96, 86), "src_factor_in": (107, 97)}
GEMM_BITS = {**LOOP_BITS, "wgt_factor_out": (117, 108), "wgt_factor_in": (127, 118)}
ALU_BITS = {**LOOP_BITS, "alu_opcode": (110, 108), "use_imm": (111, 111), "imm": (127, 112)}
GOLDEN = {"LOAD": MEM_BITS, "STORE": MEM_BITS, "GEMM": GEMM_BITS, "ALU": ALU_BITS,
          "FINISH": {}}
UOP_BITS = {"dst": (10, 0), "src": (21, 11), "wgt": (31, 22)}

INSN_CLASSES = {"LOAD": Load, "STORE": Store, "GEMM": Gemm, "ALU": Alu, "FINISH": Finish}


def ones(msb, lsb):
    return ((1 << (msb - lsb + 1)) - 1) << lsb


def make(kind, **fields):
    """An instruction of `kind` whose other fields encode as zero bits (Store: OUT)."""
    if kind == "LOAD":
        fields.setdefault("memory_type", MemoryType.UOP)
    return INSN_CLASSES[kind](**fields)


def base_word(kind):
    return OPCODES[kind] | (MEMORY_TYPES["OUT"] << 7 if kind == "STORE" else 0)


# --- golden layout -----------------------------------------------------------------------


def test_layout_bit_ranges_match_design():
    layouts = layouts_for(DEFAULT)
    for kind, bits in GOLDEN.items():
        expected = {"opcode": "2:0", **{flag: str(bit) for flag, bit in FLAGS.items()}}
        expected.update({name: f"{msb}:{lsb}" if msb != lsb else str(msb)
                         for name, (msb, lsb) in bits.items()})
        assert layouts[kind].bit_ranges() == expected, kind


@pytest.mark.parametrize("kind", sorted(OPCODES))
def test_golden_opcode_and_flags(kind):
    assert encode(make(kind), DEFAULT) == base_word(kind)
    for flag, bit in FLAGS.items():
        insn = make(kind, **{flag: True})
        assert encode(insn, DEFAULT) == base_word(kind) | 1 << bit
        assert decode(base_word(kind) | 1 << bit, DEFAULT) == insn


GOLDEN_FIELDS = [(kind, name, bits) for kind, table in GOLDEN.items()
                 for name, bits in table.items()
                 if name not in ("memory_type", "alu_opcode", "imm")
                 and not (kind == "STORE" and "pad" in name)]


@pytest.mark.parametrize("kind, name, bits", GOLDEN_FIELDS,
                         ids=[f"{k}-{n}" for k, n, _ in GOLDEN_FIELDS])
def test_golden_field_position(kind, name, bits):
    msb, lsb = bits
    value = True if name in FLAG_FIELDS else (1 << (msb - lsb + 1)) - 1
    insn = make(kind, **{name: value})
    word = base_word(kind) | ones(msb, lsb)
    assert encode(insn, DEFAULT) == word
    assert decode(word, DEFAULT) == insn
    # A distinctive, non-symmetric value too: only the lowest bit of the field.
    if not isinstance(value, bool):
        assert encode(make(kind, **{name: 1}), DEFAULT) == base_word(kind) | 1 << lsb


@pytest.mark.parametrize("name, code", sorted(MEMORY_TYPES.items()))
def test_golden_memory_type(name, code):
    kind = "STORE" if name == "OUT" else "LOAD"
    insn = INSN_CLASSES[kind](memory_type=name)
    word = OPCODES[kind] | code << 7
    assert encode(insn, DEFAULT) == word
    assert decode(word, DEFAULT).memory_type == MemoryType[name] == code


@pytest.mark.parametrize("name, code", sorted(ALU_OPS.items()))
def test_golden_alu_opcode(name, code):
    cfg = HardwareConfig(alu_ops=MUL_OPS)
    insn = Alu(alu_opcode=name)
    assert encode(insn, cfg) == OPCODES["ALU"] | code << 108
    assert decode(OPCODES["ALU"] | code << 108, cfg) == insn
    assert AluOp[name] == code


@pytest.mark.parametrize("imm, bits", [(-1, 0xFFFF), (-2, 0xFFFE), (-32768, 0x8000),
                                       (32767, 0x7FFF), (1, 0x0001), (-256, 0xFF00)])
def test_golden_imm_is_twos_complement(imm, bits):
    insn = Alu(imm=imm, use_imm=True)
    word = OPCODES["ALU"] | 1 << 111 | bits << 112
    assert encode(insn, DEFAULT) == word
    assert decode(word, DEFAULT).imm == imm


def test_golden_whole_words():
    load = Load(memory_type="INP", sram_base=1, dram_base=2, y_size=3, x_size=4, x_stride=5,
                y_pad_0=1, x_pad_1=2, push_next=True)
    word = 0x2001000500040003_0000000008000540
    assert encode(load, DEFAULT) == word
    assert decode(word, DEFAULT) == load

    gemm = Gemm(reset_reg=True, uop_bgn=0, uop_end=1, iter_out=16, iter_in=1,
                dst_factor_out=1, pop_prev=True)
    word = 0x0000000000000001_000200800020008A
    assert encode(gemm, DEFAULT) == word
    assert decode(word, DEFAULT) == gemm

    alu = Alu(alu_opcode="SHR", use_imm=True, imm=-2, uop_bgn=1, uop_end=2, iter_out=16,
              iter_in=1, dst_factor_out=1)
    word = 0xFFFEB00000000001_0002008000400104
    assert encode(alu, DEFAULT) == word
    assert decode(word, DEFAULT) == alu

    finish = Finish(pop_prev=True, push_next=True)
    assert encode(finish, DEFAULT) == 0x4B
    assert decode(0x4B, DEFAULT) == finish

    store = Store(sram_base=7, dram_base=9, y_size=1, x_size=16, x_stride=16, pop_prev=True)
    word = 0x0000001000100001_0000000024001E09
    assert encode(store, DEFAULT) == word
    assert decode(word, DEFAULT) == store


def test_golden_stream_bytes():
    data = encode_stream([Finish(pop_prev=True, push_next=True), Load(memory_type="INP",
                          sram_base=1, dram_base=2, y_size=3, x_size=4, x_stride=5,
                          y_pad_0=1, x_pad_1=2, push_next=True)], DEFAULT)
    assert len(data) == 2 * INSN_BYTES == 32
    assert data[:16] == bytes([0x4B] + [0] * 15)
    assert data[16:] == bytes.fromhex("40050008000000000300040005000120")


def test_golden_uop():
    layout = uop_layout(DEFAULT)
    assert {name: (lsb + width - 1, lsb) for name, (lsb, width) in layout.items()} == UOP_BITS
    for name, (msb, lsb) in UOP_BITS.items():
        uop = Uop(**{"dst": 0, "src": 0, name: (1 << (msb - lsb + 1)) - 1})
        assert encode_uop(uop, DEFAULT) == ones(msb, lsb)
        assert decode_uop(ones(msb, lsb), DEFAULT) == uop
    assert encode_uop(Uop(dst=1, src=2, wgt=3), DEFAULT) == 0x00C01001
    assert encode_uops([Uop(dst=1, src=2, wgt=3), Uop(dst=2047, src=0)], DEFAULT) == (
        bytes.fromhex("0110c000" "ff070000"))


# --- layouts of other configs -------------------------------------------------------------


def ranges(cfg, kind):
    return layouts_for(cfg)[kind].bit_ranges()


def test_big_config_layout():
    # Depths: uop 8192, acc 512, inp 512, wgt 256 -> factors 9, 9, 8 bits.
    gemm = ranges(BIG, "GEMM")
    assert gemm["uop_end"] == "34:21" and gemm["iter_in"] == "62:49"
    assert [gemm[n] for n in ("dst_factor_out", "dst_factor_in", "src_factor_out",
                              "src_factor_in", "wgt_factor_out", "wgt_factor_in")] == [
        "72:64", "81:73", "90:82", "99:91", "107:100", "115:108"]
    alu = ranges(BIG, "ALU")
    assert [alu[n] for n in ("src_factor_in", "alu_opcode", "use_imm", "imm")] == [
        "99:91", "102:100", "103", "119:104"]
    assert ranges(BIG, "LOAD") == ranges(DEFAULT, "LOAD")
    assert {n: (l + w - 1, l) for n, (l, w) in uop_layout(BIG).items()} == {
        "dst": (8, 0), "src": (17, 9), "wgt": (25, 18)}


def test_wide_config_first_group_exceeds_64_bits():
    first, _ = WIDE.insn_field_widths()["GEMM"]
    assert sum(width for _, width in first) == 65
    # uop depth 16384 (14/15-bit uop_bgn/uop_end); acc, inp, wgt depths 1024.
    gemm = ranges(WIDE, "GEMM")
    assert [gemm[n] for n in ("uop_bgn", "uop_end", "iter_out", "iter_in", "dst_factor_out",
                              "wgt_factor_in")] == [
        "21:8", "36:22", "50:37", "64:51", "74:65", "124:115"]
    assert ranges(WIDE, "ALU")["imm"] == "124:109"


def test_uop64_config_layout():
    assert (UOP64.uop_bits, UOP64.uop_bytes) == (64, 8)
    assert {n: (l + w - 1, l) for n, (l, w) in uop_layout(UOP64).items()} == {
        "dst": (10, 0), "src": (21, 11), "wgt": (32, 22)}
    uop = Uop(dst=5, src=6, wgt=2047)
    data = encode_uops([uop], UOP64)
    assert data == (5 | 6 << 11 | 2047 << 22).to_bytes(8, "little")
    assert decode_uops(data, UOP64) == [uop]


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
def test_layouts_pack_in_design_order(cfg):
    """Every config packs the default's fields in the same order, without overlap, in
    128 bits; the second group starts at bit 64 unless the first group passes it."""
    default = layouts_for(DEFAULT)
    for kind, layout in layouts_for(cfg).items():
        assert list(layout.fields) == list(default[kind].fields), kind
        spans = list(layout.fields.values())
        for (lsb, width), (next_lsb, _) in zip(spans, spans[1:]):
            assert next_lsb == lsb + width or (lsb + width <= 64 and next_lsb == 64), kind
        lsb, width = spans[-1]
        assert lsb + width <= 128
        assert layout.used_mask & layout.reserved_mask == 0
        assert layout.used_mask | layout.reserved_mask == (1 << 128) - 1


# --- round trips (hypothesis) -----------------------------------------------------------


def uop_strategy(cfg):
    return st.builds(Uop, **{name: st.integers(0, (1 << width) - 1)
                             for name, (_, width) in uop_layout(cfg).items()})


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_insn_round_trip(cfg, data):
    insn = data.draw(instructions(cfg))
    word = encode(insn, cfg)
    assert 0 <= word < 1 << 128
    assert word & 0b111 == OPCODES[insn.opcode.name]
    assert decode(word, cfg) == insn
    # Setting any one reserved bit makes the word invalid.
    reserved = layouts_for(cfg)[insn.opcode.name].reserved_mask
    if reserved:
        bit = data.draw(st.sampled_from([b for b in range(128) if reserved >> b & 1]))
        with pytest.raises(DecodeError, match="no field uses"):
            decode(word | 1 << bit, cfg)


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_decode_is_canonical(cfg, data):
    """Any word decodes to an instruction that encodes back to it, or raises DecodeError."""
    opcode = data.draw(st.integers(0, 7))
    kind = Opcode(opcode).name if opcode <= 4 else "FINISH"
    used = layouts_for(cfg)[kind].used_mask
    word = (data.draw(st.integers(0, (1 << 128) - 1)) & used & ~0b111) | opcode
    try:
        insn = decode(word, cfg)
    except DecodeError:
        return
    assert encode(insn, cfg) == word


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_stream_round_trip(cfg, data):
    insns = data.draw(st.lists(instructions(cfg), max_size=8))
    stream = encode_stream(insns, cfg)
    assert len(stream) == INSN_BYTES * len(insns)
    for index, insn in enumerate(insns):
        word = encode(insn, cfg)
        chunk = stream[index * 16:(index + 1) * 16]
        assert chunk[0] == word & 0xFF  # little-endian: low byte first
        assert chunk[15] == word >> 120
    assert decode_stream(stream, cfg) == insns
    assert decode_stream(bytearray(stream), cfg) == insns


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_uop_round_trip(cfg, data):
    uops = data.draw(st.lists(uop_strategy(cfg), max_size=8))
    table = encode_uops(uops, cfg)
    assert len(table) == len(uops) * cfg.uop_bytes
    for index, uop in enumerate(uops):
        word = encode_uop(uop, cfg)
        assert table[index * cfg.uop_bytes] == word & 0xFF
        assert decode_uop(word, cfg) == uop
    assert decode_uops(table, cfg) == uops


# --- bad values ---------------------------------------------------------------------------

INT_FIELDS = [(kind, name) for kind, layout in layouts_for(DEFAULT).items()
              for name in layout.fields
              if name not in FLAG_FIELDS | {"opcode", "memory_type", "alu_opcode"}
              and not (kind == "STORE" and "pad" in name)]


def test_int_fields_cover_design_table():
    assert {(kind, name) for kind, name in INT_FIELDS} == {
        (kind, name) for kind, table in GOLDEN.items() for name in table
        if name not in ("memory_type", "alu_opcode", "reset_reg", "use_imm")
        and not (kind == "STORE" and "pad" in name)}


@pytest.mark.parametrize("kind, name", INT_FIELDS, ids=[f"{k}-{n}" for k, n in INT_FIELDS])
def test_one_past_max_raises(kind, name):
    msb, lsb = GOLDEN[kind][name]
    width = msb - lsb + 1
    high = (1 << (width - 1)) - 1 if name == "imm" else (1 << width) - 1
    low = -(1 << (width - 1)) if name == "imm" else 0
    encode(make(kind, **{name: high}), DEFAULT)  # the maximum fits
    for bad in (high + 1, high * 4 + 3):
        with pytest.raises(EncodeError, match=rf"{kind} field {name}={bad} .*{width}-bit.*"
                                              rf"allowed {low}\.\.{high}"):
            encode(make(kind, **{name: bad}), DEFAULT)
    with pytest.raises(ValueError, match=rf"instruction 1: {kind} field {name}={high + 1}"):
        encode_stream([Finish(), make(kind, **{name: high + 1})], DEFAULT)


@pytest.mark.parametrize("cfg", [BIG, WIDE, UOP64], ids=["big", "wide", "uop64"])
def test_one_past_max_raises_other_configs(cfg):
    for kind, layout in layouts_for(cfg).items():
        for name, (_, width) in layout.fields.items():
            if name in FLAG_FIELDS | {"opcode", "memory_type", "alu_opcode", "imm"}:
                continue
            if kind == "STORE" and "pad" in name:
                continue
            encode(make(kind, **{name: (1 << width) - 1}), cfg)
            with pytest.raises(EncodeError, match=rf"{name}={1 << width} "):
                encode(make(kind, **{name: 1 << width}), cfg)


def test_imm_below_min_raises():
    encode(Alu(imm=-32768), DEFAULT)
    with pytest.raises(EncodeError, match=r"imm=-32769 .*allowed -32768\.\.32767"):
        encode(Alu(imm=-32769), DEFAULT)
    assert issubclass(EncodeError, ValueError)


@pytest.mark.parametrize("kind, name", [f for f in INT_FIELDS if f[1] != "imm"],
                         ids=[f"{k}-{n}" for k, n in INT_FIELDS if n != "imm"])
def test_negative_raises_at_construction(kind, name):
    with pytest.raises(ValueError, match=rf"{INSN_CLASSES[kind].__name__}\.{name} must be "
                                         r"non-negative, not -1"):
        make(kind, **{name: -1})


@pytest.mark.parametrize("kind, name", INT_FIELDS, ids=[f"{k}-{n}" for k, n in INT_FIELDS])
def test_wrong_types_raise_type_error(kind, name):
    for bad in (1.0, 2.5, "1", None, True):
        with pytest.raises(TypeError, match=rf"\.{name} must be an integer, not "
                                            rf"{re.escape(repr(bad))}"):
            make(kind, **{name: bad})


@pytest.mark.parametrize("kind", sorted(OPCODES))
def test_flags(kind):
    cls = INSN_CLASSES[kind]
    names = list(FLAGS) + [n for n in ("reset_reg", "use_imm") if n in GOLDEN[kind]]
    for name in names:
        assert getattr(make(kind, **{name: 1}), name) is True
        for bad in (2, -1):
            with pytest.raises(ValueError, match=rf"{cls.__name__}\.{name} is a flag.*{bad}"):
                make(kind, **{name: bad})
        for bad in (1.0, "1", None):
            with pytest.raises(TypeError, match=rf"{cls.__name__}\.{name} is a flag"):
                make(kind, **{name: bad})


def test_memory_types():
    with pytest.raises(ValueError, match=r"Load\.memory_type must be one of UOP \(0\), WGT "
                                         r"\(1\), INP \(2\), ACC \(3\), TAB \(5\), not <MemoryType\.OUT"):
        Load(memory_type=MemoryType.OUT)
    with pytest.raises(ValueError, match=r"Load\.memory_type .* not 'out'"):
        Load(memory_type="out")
    with pytest.raises(ValueError, match=r"Load\.memory_type .* not 9"):
        Load(memory_type=9)
    with pytest.raises(ValueError, match=r"Store\.memory_type must be one of OUT \(4\), not 'INP'"):
        Store(memory_type="INP")
    with pytest.raises(ValueError, match=r"Store\.memory_type .* not 2"):
        Store(memory_type=2)
    for bad in (2.0, True, None):
        with pytest.raises(TypeError, match=r"Load\.memory_type"):
            Load(memory_type=bad)
    assert Load(memory_type="acc").memory_type is MemoryType.ACC
    assert Load(memory_type=1).memory_type is MemoryType.WGT


def test_alu_opcodes():
    with pytest.raises(ValueError, match=r"Alu\.alu_opcode .* not 8"):
        Alu(alu_opcode=8)
    with pytest.raises(ValueError, match=r"Alu\.alu_opcode .* not 'XOR'"):
        Alu(alu_opcode="XOR")
    with pytest.raises(TypeError, match=r"Alu\.alu_opcode"):
        Alu(alu_opcode=3.0)
    assert Alu(alu_opcode="shr").alu_opcode is AluOp.SHR


def test_req_needs_a_config_with_req():
    """REQ (alu_opcode 5) is refused by the encoder and the decoder of a config without
    it, naming the op and what the config allows."""
    req = Alu(alu_opcode="REQ", use_imm=True, imm=3)
    with pytest.raises(EncodeError, match=r"alu_opcode=REQ .*allowed MIN, MAX, ADD, SHR"):
        encode(req, DEFAULT)
    with_req = HardwareConfig(alu_ops={"MIN", "MAX", "ADD", "SHR", "REQ"})
    word = encode(req, with_req)
    assert word >> 108 & 0b111 == 5 and decode(word, with_req) == req
    with pytest.raises(DecodeError, match=r"alu_opcode REQ.*does not implement"):
        decode(word, DEFAULT)


def test_mul_needs_a_config_with_mul():
    mul = Alu(alu_opcode="MUL", use_imm=True, imm=3)
    with pytest.raises(EncodeError, match=r"alu_opcode=MUL .*allowed MIN, MAX, ADD, SHR"):
        encode(mul, DEFAULT)
    word = encode(mul, BIG)
    assert word >> 100 & 0b111 == 4
    # The same ALU word in the default layout: MUL in bits 110:108.
    default_word = OPCODES["ALU"] | 4 << 108 | 1 << 111 | 3 << 112
    assert decode(default_word, HardwareConfig(alu_ops=MUL_OPS)) == mul
    with pytest.raises(DecodeError, match=r"alu_opcode MUL.*does not implement"):
        decode(default_word, DEFAULT)


def test_store_padding_must_be_zero():
    for name in ("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1"):
        with pytest.raises(ValueError, match=rf"Store\.{name} must be 0"):
            Store(**{name: 1})
    with pytest.raises(DecodeError, match=r"Store\.y_pad_0 must be 0"):
        decode(OPCODES["STORE"] | MEMORY_TYPES["OUT"] << 7 | 1 << 112, DEFAULT)


def test_encode_rejects_non_instructions():
    for bad in (Uop(dst=0, src=0), 3, None):
        with pytest.raises(TypeError, match=r"encode\(\) takes"):
            encode(bad, DEFAULT)


def test_uop_bad_values():
    with pytest.raises(EncodeError, match=r"Uop field dst=2048 .*allowed 0\.\.2047"):
        encode_uop(Uop(dst=2048, src=0), DEFAULT)
    with pytest.raises(EncodeError, match=r"Uop field src=2048 .*allowed 0\.\.2047"):
        encode_uop(Uop(dst=0, src=2048), DEFAULT)
    with pytest.raises(EncodeError, match=r"micro-op 1: Uop field wgt=1024 .*allowed 0\.\.1023"):
        encode_uops([Uop(dst=0, src=0), Uop(dst=0, src=0, wgt=1024)], DEFAULT)
    with pytest.raises(ValueError, match=r"Uop\.dst must be non-negative, not -1"):
        Uop(dst=-1, src=0)
    with pytest.raises(TypeError, match=r"Uop\.wgt must be an integer, not 1\.0"):
        Uop(dst=0, src=0, wgt=1.0)
    with pytest.raises(DecodeError, match=r"micro-op word 0x100000000 "):
        decode_uop(1 << 32, DEFAULT)
    with pytest.raises(DecodeError, match=r"sets bits above the 33"):
        decode_uop(1 << 33, UOP64)
    with pytest.raises(DecodeError, match=r"multiple of 4 bytes; got 6"):
        decode_uops(bytes(6), DEFAULT)
    with pytest.raises(DecodeError, match=r"multiple of 8 bytes; got 4"):
        decode_uops(bytes(4), UOP64)


# --- decode errors --------------------------------------------------------------------------


@pytest.mark.parametrize("opcode", [5, 6, 7])
def test_decode_unknown_opcode(opcode):
    with pytest.raises(DecodeError, match=rf"unknown opcode {opcode}; known: LOAD 0"):
        decode(opcode, DEFAULT)
    with pytest.raises(DecodeError, match=rf"instruction 1: .*unknown opcode {opcode}"):
        decode_stream(bytes([3] + [0] * 15 + [opcode] + [0] * 15), DEFAULT)


@pytest.mark.parametrize("kind", ["LOAD", "STORE"])
@pytest.mark.parametrize("code", [6, 7])
def test_decode_unknown_memory_type(kind, code):
    with pytest.raises(DecodeError, match=rf"unknown memory_type {code}"):
        decode(OPCODES[kind] | code << 7, DEFAULT)


def test_decode_table_load_needs_the_table():
    """Memory type 5 (TAB) is a LOAD's only on a config with the ALU's table."""
    with pytest.raises(DecodeError, match=r"uses memory_type TAB, which config \S+ does not "
                                          r"implement \(allowed ADD, MAX, MIN, SHR|"
                                          r"uses memory_type TAB, which config"):
        decode(OPCODES["LOAD"] | 5 << 7, DEFAULT)
    with pytest.raises(DecodeError, match=r"Store\.memory_type"):
        decode(OPCODES["STORE"] | 5 << 7, DEFAULT)
    table = HardwareConfig(alu_ops={"MIN", "MAX", "ADD", "SHR", "TAB"})
    assert decode(OPCODES["LOAD"] | 5 << 7, table).memory_type is MemoryType.TAB


def test_decode_memory_type_not_allowed():
    with pytest.raises(DecodeError, match=r"Load\.memory_type"):
        decode(OPCODES["LOAD"] | MEMORY_TYPES["OUT"] << 7, DEFAULT)
    with pytest.raises(DecodeError, match=r"Store\.memory_type"):
        decode(OPCODES["STORE"] | MEMORY_TYPES["INP"] << 7, DEFAULT)


def test_decode_an_alu_opcode_the_config_lacks():
    """Every 3-bit ALU opcode names an op (DIV is 7); one the config lacks is refused."""
    with pytest.raises(DecodeError, match=r"alu_opcode DIV, which config .* does not implement"):
        decode(OPCODES["ALU"] | 7 << 108, HardwareConfig(alu_ops=MUL_OPS))


@pytest.mark.parametrize("kind, bit", [("LOAD", 58), ("LOAD", 63), ("STORE", 60),
                                       ("GEMM", 63), ("ALU", 63), ("FINISH", 7),
                                       ("FINISH", 64), ("FINISH", 127)])
def test_decode_stray_reserved_bits(kind, bit):
    with pytest.raises(DecodeError, match=rf"{kind} instruction word .* sets bits "
                                          rf"{(1 << bit):#x} that no field uses"):
        decode(base_word(kind) | 1 << bit, DEFAULT)


def test_decode_out_of_range_words():
    for word in (-1, 1 << 128):
        with pytest.raises(DecodeError, match="not a 128-bit value"):
            decode(word, DEFAULT)


@pytest.mark.parametrize("length", [1, 15, 17, 31])
def test_decode_stream_length(length):
    with pytest.raises(DecodeError, match=rf"multiple of 16 bytes; got {length} bytes"):
        decode_stream(bytes([3]) * length, DEFAULT)


def test_decode_stream_empty():
    assert decode_stream(b"", DEFAULT) == []
    assert encode_stream([], DEFAULT) == b""
