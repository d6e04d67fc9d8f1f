// vdla's Verilator harness: the accelerator's Verilated model with a DRAM model behind its
// AXI4 master and a host on its AXI4-Lite control port, behind a small C API for ctypes.
//
// Everything that depends on the hardware config (the top's ports, the bus width, the
// register map and the meaning of the STATE bits) comes from `vdla_harness_config.h`,
// which vdla.sim.verilator.build generates from vdla.hw for each build: one source of
// truth for those facts, in Python.
//
// A clock cycle (`tick`):
//   1. the DRAM model and the host drive their outputs from their state;
//   2. clk low, eval: the design's combinational outputs settle against those inputs;
//   3. every handshake is sampled (VALID and READY both high now means a transfer at the
//      coming edge);
//   4. clk high, eval: the rising edge;
//   5. the models update their state with the sampled transfers.
// A whole program runs inside `vdla_run`; Python never steps single cycles on a hot path.

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "verilated.h"
#include "vdla_harness_config.h"
#include VDLA_TOP_HEADER
#include VDLA_ROOT_HEADER
#if VM_TRACE
#include VDLA_TRACE_HEADER
#endif

#define VDLA_API extern "C" __attribute__((visibility("default")))

#ifdef VDLA_GEMM_NATIVE
// The NATIVE GEMM form (vdla.hw.gemm_forms.GemmArithmetic.NATIVE) leaves the GEMM's
// products and sums, and the wgt SRAM (and the inp SRAM without a dw window), to this
// harness. `tick` writes its copies of the SRAMs from the load module's write ports
// (native_M_write_*), as the SRAMs would at the clock edge. When native_gemm_read is
// high, the design's operand stage holds a micro-op, and `tick` copies the rows at
// native_gemm_inp_addr and native_gemm_wgt_addr, before the edge, as the SRAMs' read
// ports would (reading first: a row written at the same edge is read as it was).
// Two cycles later, with the micro-op in the reduce stage, `tick` drives
// native_gemm_sums from them, which the design registers. (With a dw window the x
// operand is every lane's own inputs, on native_gemm_x, from the reduce stage.)
// The same integers as the WIDE form's multipliers and adder trees: each lane's sum of
// its block_in products of signed inp and wgt elements, wrapped at the accumulator
// width (wrapping every partial sum, as the trees do, is wrapping the total). Vectors
// are little-endian bytes, element 0 at the bottom.
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
namespace native_gemm {
constexpr int GB = VDLA_GEMM_BATCH, GI = VDLA_GEMM_BLOCK_IN, GO = VDLA_GEMM_BLOCK_OUT;
constexpr int INP_BITS = VDLA_GEMM_INP_BITS, WGT_BITS = VDLA_GEMM_WGT_BITS,
              ACC_BITS = VDLA_GEMM_ACC_BITS;
// x: one inp row for every lane of a batch row, or (a dw window) every lane's own.
constexpr int X_LANE = VDLA_GEMM_PER_LANE ? GI : 0;
constexpr int X_ROW = VDLA_GEMM_PER_LANE ? GO * GI : GI;
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the ports' bytes");

// Bits [at, at + width) of a little-endian bit vector, as a signed value.
inline int64_t field(const uint8_t* v, int at, int width) {
    uint64_t bits = 0;
    for (int i = 0; i < width; ++i) bits |= uint64_t(v[(at + i) / 8] >> ((at + i) % 8) & 1) << i;
    return int64_t(bits << (64 - width)) >> (64 - width);
}
inline void put_field(uint8_t* v, int at, int width, int64_t value) {
    for (int i = 0; i < width; ++i) {
        uint8_t bit = uint8_t(1u << ((at + i) % 8));
        if (value >> i & 1) v[(at + i) / 8] |= bit; else v[(at + i) / 8] &= uint8_t(~bit);
    }
}

#if defined(__SSE2__)
// Four lanes' sums at once with SSE2 (every x86-64 has it): bytes sign-extended to 16
// bits, pmaddwd's pairwise products summed into 32-bit words, the four lanes' partial
// sums transposed and added. Exact: a pair of int8 products is at most 2 * 2^14.
inline __m128i widen_lo(__m128i v) { return _mm_srai_epi16(_mm_unpacklo_epi8(v, v), 8); }
inline __m128i widen_hi(__m128i v) { return _mm_srai_epi16(_mm_unpackhi_epi8(v, v), 8); }
inline __m128i dot4(const int8_t* x, const int8_t* w) {   // 4 lanes: w rows n..n+3
    __m128i part[4];
    for (int j = 0; j < 4; ++j) {
        __m128i acc = _mm_setzero_si128();
        for (int k = 0; k < GI; k += 16) {
            __m128i xv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + k));
            __m128i wv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + j * GI + k));
            acc = _mm_add_epi32(acc, _mm_add_epi32(_mm_madd_epi16(widen_lo(xv), widen_lo(wv)),
                                                   _mm_madd_epi16(widen_hi(xv), widen_hi(wv))));
        }
        part[j] = acc;
    }
    __m128i u01 = _mm_add_epi32(_mm_unpacklo_epi32(part[0], part[1]),
                                _mm_unpackhi_epi32(part[0], part[1]));
    __m128i u23 = _mm_add_epi32(_mm_unpacklo_epi32(part[2], part[3]),
                                _mm_unpackhi_epi32(part[2], part[3]));
    return _mm_add_epi32(_mm_unpacklo_epi64(u01, u23), _mm_unpackhi_epi64(u01, u23));
}
#endif

void sums(const uint8_t* __restrict x, const uint8_t* __restrict w, uint8_t* __restrict out) {
#if defined(__SSE2__)
    if constexpr (INP_BITS == 8 && WGT_BITS == 8 && ACC_BITS == 32 && GI % 16 == 0 &&
                  GO % 4 == 0 && !VDLA_GEMM_PER_LANE) {
        const auto* xb = reinterpret_cast<const int8_t*>(x);
        const auto* wb = reinterpret_cast<const int8_t*>(w);
        for (int b = 0; b < GB; ++b)
            for (int n = 0; n < GO; n += 4)
                _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 4 * (b * GO + n)),
                                 dot4(xb + b * X_ROW, wb + n * GI));
        return;
    }
#endif
    if constexpr (INP_BITS == 8 && WGT_BITS == 8 && ACC_BITS == 32) {
        const auto* xb = reinterpret_cast<const int8_t*>(x);
        const auto* wb = reinterpret_cast<const int8_t*>(w);
        for (int b = 0; b < GB; ++b)
            for (int n = 0; n < GO; ++n) {
                const int8_t* xv = xb + b * X_ROW + n * X_LANE;
                const int8_t* wv = wb + n * GI;
                int32_t acc = 0;
                for (int k = 0; k < GI; ++k) acc += int32_t(xv[k]) * int32_t(wv[k]);
                std::memcpy(out + 4 * (b * GO + n), &acc, 4);
            }
    } else {   // other widths: bit by bit (no shipped config)
        for (int b = 0; b < GB; ++b)
            for (int n = 0; n < GO; ++n) {
                int64_t acc = 0;
                for (int k = 0; k < GI; ++k)
                    acc += field(x, (b * X_ROW + n * X_LANE + k) * INP_BITS, INP_BITS) *
                           field(w, (n * GI + k) * WGT_BITS, WGT_BITS);
                put_field(out, (b * GO + n) * ACC_BITS, ACC_BITS, acc);
            }
    }
}

// An SRAM held by the harness: DEPTH rows of ROW_BYTES, written LANES words at a time.
template <uint32_t DEPTH, int ROW_BYTES_, int LANES>
struct Sram {
    static constexpr int ROW_BYTES = ROW_BYTES_;
    static constexpr int WORD_BYTES = ROW_BYTES / LANES;
    std::vector<uint8_t> rows = std::vector<uint8_t>(size_t(DEPTH) * ROW_BYTES);

    // Row `addr` into `dst` (zeros past the end, where the address is wider than the
    // depth needs).
    void read(uint32_t addr, uint8_t* dst) const {
        if (addr < DEPTH) std::memcpy(dst, &rows[size_t(addr) * ROW_BYTES], ROW_BYTES);
        else std::memset(dst, 0, ROW_BYTES);
    }
    // The write port: `word` into every lane of row `addr` whose bit in `en` is set
    // (little-endian bytes, lane 0 at bit 0).
    void write(uint32_t addr, const uint8_t* en, const uint8_t* word) {
        if (addr >= DEPTH) return;
        uint8_t* row = &rows[size_t(addr) * ROW_BYTES];
        for (int lane = 0; lane < LANES; ++lane)
            if (en[lane / 8] >> (lane % 8) & 1) std::memcpy(row + lane * WORD_BYTES, word, WORD_BYTES);
    }
};

// A port's storage as little-endian bytes, and whether any of its bits is set.
template <typename T>
inline const uint8_t* bytes_of(const T& port) { return reinterpret_cast<const uint8_t*>(&port); }
template <std::size_t N>
inline const uint8_t* bytes_of(const VlWide<N>& port) {
    return reinterpret_cast<const uint8_t*>(port.m_storage);
}
template <typename T>
inline bool any(const T& port) { return port != 0; }
template <std::size_t N>
inline bool any(const VlWide<N>& port) {
    for (std::size_t i = 0; i < N; ++i) if (port.m_storage[i]) return true;
    return false;
}

// The harness's part of the NATIVE form: its SRAMs and the operand rows of the
// micro-ops in flight (the one read this cycle, in the operand stage, and those of the
// multiply and reduce stages, read one and two cycles before).
struct Native {
    using WgtSram = Sram<VDLA_NATIVE_WGT>;
    WgtSram wgt;
#if !VDLA_GEMM_PER_LANE
    using InpSram = Sram<VDLA_NATIVE_INP>;
    InpSram inp;
    static constexpr int X_BYTES = InpSram::ROW_BYTES;
#else
    static constexpr int X_BYTES = 1;   // the x operand comes on native_gemm_x
#endif
    struct Slot {
        bool valid = false;
        alignas(16) uint8_t x[X_BYTES];
        alignas(16) uint8_t w[WgtSram::ROW_BYTES];
    } slots[3];

    // Before the edge of `cycle`, inputs not yet settled: drive the reduce stage's sums,
    // then read this cycle's operand rows (all from registers). The reduce stage's slot
    // is (cycle - 2) mod 3 = (cycle + 1) mod 3.
    template <typename Top>
    void operands(uint64_t cycle, Top& t) {
        const Slot& reduce = slots[(cycle + 1) % 3];
        if (reduce.valid) {
            uint8_t* out = reinterpret_cast<uint8_t*>(&t.native_gemm_sums);
#if VDLA_GEMM_PER_LANE
            sums(bytes_of(t.native_gemm_x), reduce.w, out);
#else
            sums(reduce.x, reduce.w, out);
#endif
        }
        Slot& operand = slots[cycle % 3];
        operand.valid = t.native_gemm_read;
        if (operand.valid) {
#if !VDLA_GEMM_PER_LANE
            inp.read(t.native_gemm_inp_addr, operand.x);
#endif
            wgt.read(t.native_gemm_wgt_addr, operand.w);
        }
    }
    // Settled, before the edge: the load module's writes of this cycle (after this
    // cycle's reads, as the SRAMs read first).
    template <typename Top>
    void writes(const Top& t) {
        if (any(t.native_wgt_write_en))
            wgt.write(t.native_wgt_write_addr, bytes_of(t.native_wgt_write_en),
                      bytes_of(t.native_wgt_write_word));
#if !VDLA_GEMM_PER_LANE
        if (any(t.native_inp_write_en))
            inp.write(t.native_inp_write_addr, bytes_of(t.native_inp_write_en),
                      bytes_of(t.native_inp_write_word));
#endif
    }
};
}  // namespace native_gemm
#endif

// The model's scheduler, which Verilator generates in the same library. `tick` calls it
// directly rather than through `eval()`: see `settle` and `edge` below. (Internal to
// Verilator; the build pins its version and hashes it into the cache key.)
void VDLA_ROOT_FN(eval)(VDLA_ROOT* root);
bool VDLA_ROOT_FN(eval_phase__act)(VDLA_ROOT* root);
bool VDLA_ROOT_FN(eval_phase__nba)(VDLA_ROOT* root);

namespace {

// --- port helpers: the same code for 8..1024-bit ports ----------------------------------

template <typename T>
inline void put_bytes(T& port, const uint8_t* src, size_t n) {
    T value = 0;
    std::memcpy(&value, src, std::min(n, sizeof(T)));
    port = value;
}
template <std::size_t N>
inline void put_bytes(VlWide<N>& port, const uint8_t* src, size_t n) {
    std::memset(port.m_storage, 0, sizeof(port.m_storage));
    std::memcpy(port.m_storage, src, std::min(n, sizeof(port.m_storage)));
}
template <typename T>
inline void get_bytes(const T& port, uint8_t* dst, size_t n) {
    std::memcpy(dst, &port, std::min(n, sizeof(T)));
}
template <std::size_t N>
inline void get_bytes(const VlWide<N>& port, uint8_t* dst, size_t n) {
    std::memcpy(dst, port.m_storage, std::min(n, sizeof(port.m_storage)));
}

// The top's AXI ports (Verilator spells the "__" of Amaranth's names as "___05F").
#define AXI(name) VDLA_M_AXI(name)
#define CTRL(name) VDLA_S_AXI(name)

constexpr unsigned BUS_BYTES = VDLA_BUS_BYTES;
inline unsigned long long ULL(uint64_t x) { return x; }
constexpr unsigned STRB_BYTES = (BUS_BYTES + 7) / 8;

// Status codes of vdla_run (mirrored in binding.py).
enum RunStatus { RUN_DONE = 0, RUN_TIMEOUT = 1, RUN_STALLED = 2, RUN_BUS_ERROR = 3, RUN_HOST_ERROR = 4 };

struct DramParams {
    uint64_t read_latency;     // cycles from an accepted AR to its first R beat
    uint64_t write_latency;    // cycles from a burst's last W beat to its B response
    double bytes_per_cycle;    // bandwidth of each direction (read and write channels)
    uint32_t max_reads;        // read bursts accepted and not yet answered
    uint32_t max_writes;       // write bursts accepted and not yet answered
};

struct Burst {
    uint64_t addr;      // byte address of the next beat
    uint32_t beats;     // beats left
    uint32_t size;      // bytes per beat (1 << AxSIZE)
    uint32_t id;
    uint64_t ready_at;  // first cycle the response may start
    bool error;         // outside DRAM: answered with SLVERR, memory untouched
};

struct RunResult {
    int32_t status;
    uint32_t state;             // STATE at the end
    uint64_t cycles;            // harness cycles from start to done (or to the stop)
    uint64_t counters[VDLA_N_COUNTERS];
};

// Ports for peek/poke: index -> name, width, direction, storage.
struct PortRef {
    const char* name;
    uint32_t width;
    int32_t input;
    void* ptr;
};
std::vector<PortRef> ports_of(VDLA_TOP* t) {
    std::vector<PortRef> ports;
#define VDLA_PORT(name, member, width, input) ports.push_back(PortRef{name, width, input, (void*)&t->member});
    VDLA_PORTS(VDLA_PORT)
#undef VDLA_PORT
    return ports;
}
uint32_t storage_bytes(uint32_t width) {
    return width <= 8 ? 1 : width <= 16 ? 2 : width <= 32 ? 4 : width <= 64 ? 8 : 4 * ((width + 31) / 32);
}

struct Model {
    std::unique_ptr<VerilatedContext> ctx;
    std::unique_ptr<VDLA_TOP> top;
    std::vector<PortRef> ports;   // the top's ports, for peek/poke
#if VM_TRACE
    std::unique_ptr<VDLA_TRACE_CLASS> trace;
#endif
    uint8_t* dram = nullptr;
    uint64_t dram_size = 0;
    DramParams p{};
    uint64_t cycle = 0;         // clock cycles since the model was created
#ifdef VDLA_GEMM_NATIVE
    native_gemm::Native native;   // the NATIVE form's SRAMs and operands
#endif

    // DRAM model state.
    std::deque<Burst> reads;    // accepted AR, in order
    std::deque<Burst> writes;   // accepted AW waiting for W data, in order
    std::deque<Burst> bresps;   // write bursts complete, waiting for B
    double read_credit = 0, write_credit = 0;
    uint64_t reads_served = 0, writes_served = 0;

    // Host (AXI4-Lite) drive state.
    bool h_awvalid = false, h_wvalid = false, h_bready = false, h_arvalid = false, h_rready = false;
    uint32_t h_awaddr = 0, h_wdata = 0, h_araddr = 0;

    // Watchdog and timeline.
    uint32_t last_state = 0;
    uint64_t last_change = 0;
    bool record = false;
    uint64_t record_base = 0;
    std::vector<uint64_t> timeline;   // (cycle, state) pairs

    std::string error;

    bool dram_idle() const { return reads.empty() && writes.empty() && bresps.empty(); }

    __attribute__((format(printf, 2, 3))) void fail(const char* fmt, ...) {
        if (!error.empty()) return;   // keep the first error
        char buf[512];
        va_list args;
        va_start(args, fmt);
        std::vsnprintf(buf, sizeof buf, fmt, args);
        va_end(args);
        error = buf;
    }

    // A burst from an AR or AW handshake: checked against the AXI rules the accelerator
    // promises (INCR, at most the bus width per beat, no 4 KiB crossing) and DRAM's size.
    Burst accept(uint64_t addr, uint32_t len, uint32_t size_log, uint32_t burst, uint32_t id,
                 bool is_read) {
        Burst b{addr, len + 1, 1u << size_log, id, 0, false};
        uint64_t start = addr & ~uint64_t(b.size - 1);
        uint64_t end = start + uint64_t(b.beats) * b.size;   // one past the last byte
        if (burst != 1) {
            fail("AXI protocol: a burst of type %u (only INCR, 1, is used) at %#llx, id %u", burst,
                 ULL(addr), id);
            b.error = true;
        } else if (b.size > BUS_BYTES) {
            fail("AXI protocol: %u bytes per beat on a %u-byte bus, id %u", b.size, BUS_BYTES, id);
            b.error = true;
        } else if ((start >> 12) != ((end - 1) >> 12)) {
            fail("AXI protocol: a burst at %#llx of %u beats crosses a 4 KiB boundary, id %u",
                 ULL(addr), b.beats, id);
            b.error = true;
        } else if (end > dram_size) {
            fail("DRAM %s of bytes %#llx..%#llx (AXI id %u) past the end of DRAM (%#llx bytes)",
                 is_read ? "read" : "write", ULL(start), ULL(end - 1), id, ULL(dram_size));
            b.error = true;
        }
        return b;
    }

    // --- evaluation ------------------------------------------------------------------------
    // `eval()` wraps the scheduler in bookkeeping this single-threaded harness does not
    // need (two mutexes per call), and its scheduler always re-runs the logic fed by the
    // top-level inputs first. The harness changes inputs only while the clock is low, so:
    // `settle` (clock low) runs the whole scheduler; `edge` (clock high, inputs as they
    // were at `settle`) skips the input logic, whose values cannot have changed, and runs
    // only the edge-triggered and dependent logic. Together about a tenth faster.
    VDLA_ROOT* root() { return top->rootp; }
    void settle() { VDLA_ROOT_FN(eval)(root()); }
    void edge() {
        VDLA_ROOT* r = root();
        do {
            r->__VactIterCount = 0;
            do {
                ++r->__VactIterCount;
                r->__VactPhaseResult = VDLA_ROOT_FN(eval_phase__act)(r);
            } while (r->__VactPhaseResult);
            r->__VnbaPhaseResult = VDLA_ROOT_FN(eval_phase__nba)(r);
        } while (r->__VnbaPhaseResult);
    }

    // --- one clock cycle ------------------------------------------------------------------
    // What `sample` saw, for `update`: the transfers of this cycle.
    struct Transfers {
        bool ar, r, aw, w, b, h_aw, h_w, h_b, h_ar, h_r;
        Burst new_read, new_write;
    };

    // The DRAM model's and the host's inputs to the design for cycle `cycle`.
    void drive() {
        VDLA_TOP& t = *top;
        const Burst* rb = nullptr;
        if (!reads.empty() && reads.front().ready_at <= cycle && read_credit >= BUS_BYTES)
            rb = &reads.front();
        t.AXI(rvalid) = rb != nullptr;
        if (rb) {
            uint8_t word[BUS_BYTES] = {0};
            if (!rb->error) {
                uint64_t lane = rb->addr & (BUS_BYTES - 1);
                uint64_t n = b_beat_bytes(*rb);
                std::memcpy(word + lane, dram + rb->addr, n);
            }
            put_bytes(t.AXI(rdata), word, BUS_BYTES);
            t.AXI(rid) = rb->id;
            t.AXI(rlast) = rb->beats == 1;
            t.AXI(rresp) = rb->error ? 2 : 0;
        }
        t.AXI(arready) = reads.size() < p.max_reads;
        t.AXI(awready) = writes.size() + bresps.size() < p.max_writes;
        t.AXI(wready) = !writes.empty() && write_credit >= BUS_BYTES;
        const Burst* bb = (!bresps.empty() && bresps.front().ready_at <= cycle) ? &bresps.front() : nullptr;
        t.AXI(bvalid) = bb != nullptr;
        if (bb) {
            t.AXI(bid) = bb->id;
            t.AXI(bresp) = bb->error ? 2 : 0;
        }
        t.CTRL(awvalid) = h_awvalid;
        t.CTRL(awaddr) = h_awaddr;
        t.CTRL(wvalid) = h_wvalid;
        t.CTRL(wdata) = h_wdata;
        t.CTRL(wstrb) = 0xF;
        t.CTRL(bready) = h_bready;
        t.CTRL(arvalid) = h_arvalid;
        t.CTRL(araddr) = h_araddr;
        t.CTRL(rready) = h_rready;
    }

    // The handshakes of this cycle, from the settled design and the inputs it sees (the
    // input ports hold them: both ways of ticking set them before the design settles).
    Transfers sample() {
        VDLA_TOP& t = *top;
        Transfers x{};
        x.ar = t.AXI(arvalid) && t.AXI(arready);
        x.r = t.AXI(rvalid) && t.AXI(rready);
        x.aw = t.AXI(awvalid) && t.AXI(awready);
        x.w = t.AXI(wvalid) && t.AXI(wready);
        x.b = t.AXI(bvalid) && t.AXI(bready);
        if (x.ar) x.new_read = accept(t.AXI(araddr), t.AXI(arlen), t.AXI(arsize), t.AXI(arburst),
                                      t.AXI(arid), true);
        if (x.aw) x.new_write = accept(t.AXI(awaddr), t.AXI(awlen), t.AXI(awsize), t.AXI(awburst),
                                       t.AXI(awid), false);
        if (x.w) write_beat();   // data and strobes are only valid now
        x.h_aw = t.CTRL(awvalid) && t.CTRL(awready);
        x.h_w = t.CTRL(wvalid) && t.CTRL(wready);
        x.h_b = t.CTRL(bready) && t.CTRL(bvalid);
        x.h_ar = t.CTRL(arvalid) && t.CTRL(arready);
        x.h_r = t.CTRL(rready) && t.CTRL(rvalid);
        if (x.h_r) host_rdata = t.CTRL(rdata);
        return x;
    }

    // The models after this cycle's transfers.
    void update(const Transfers& x) {
        if (x.r) {
            Burst& head = reads.front();
            head.addr = next_beat_addr(head);
            if (--head.beats == 0) {
                reads.pop_front();
                ++reads_served;
            }
            read_credit -= BUS_BYTES;
        }
        if (x.b) {
            bresps.pop_front();
            ++writes_served;
        }
        if (x.ar) {
            Burst read = x.new_read;
            read.ready_at = cycle + std::max<uint64_t>(1, p.read_latency);
            reads.push_back(read);
        }
        if (x.aw) writes.push_back(x.new_write);
        if (x.w) write_credit -= BUS_BYTES;
        if (x.h_aw) h_awvalid = false;
        if (x.h_w) h_wvalid = false;
        if (x.h_b) { h_bready = false; host_done = true; }
        if (x.h_ar) h_arvalid = false;
        if (x.h_r) { h_rready = false; host_done = true; }
        // Bandwidth: credit accrues each cycle; it cannot be saved up beyond one beat.
        read_credit = std::min(read_credit + p.bytes_per_cycle, double(BUS_BYTES) + p.bytes_per_cycle);
        write_credit = std::min(write_credit + p.bytes_per_cycle, double(BUS_BYTES) + p.bytes_per_cycle);
    }

#ifdef VDLA_GEMM_NATIVE
    // The NATIVE form's top latches every input but the sums and the reset, whose only
    // readers are registers, at the clock edge (vdla.hw.top._latched), so the design
    // depends on no input between two edges. The inputs for a cycle are therefore set
    // before the edge that starts it, and one evaluation a cycle, the edge's, settles
    // everything: the design's outputs of cycle t are ready when `tick` begins.
    // A host transfer asked for between two ticks is seen a cycle later than in the
    // other forms (`INPUT_DELAY`); the accelerator's cycles are the same.
    static constexpr uint64_t INPUT_DELAY = 1;
    void tick() {
        VDLA_TOP& t = *top;
#if VM_TRACE
        if (trace) { t.clk = 0; trace->dump(10 * cycle); }
#endif
        native.operands(cycle, t);
        native.writes(t);
        Transfers x = sample();
        update(x);
        ++cycle;
        drive();
        t.clk = 0;
        VDLA_ROOT_FN(eval_phase__act)(root());   // the clock is seen low: the next rise is an edge
        t.clk = 1;
        edge();
#if VM_TRACE
        if (trace) trace->dump(10 * cycle - 5);
#endif
        watch();
    }
#else
    static constexpr uint64_t INPUT_DELAY = 0;
    void tick() {
        VDLA_TOP& t = *top;
        // 1. drive.
        drive();
        // 2. settle.
        t.clk = 0;
        settle();
#if VM_TRACE
        if (trace) trace->dump(10 * cycle);
#endif
        // 3. sample.
        Transfers x = sample();
        // 4. edge.
        t.clk = 1;
        edge();
#if VM_TRACE
        if (trace) trace->dump(10 * cycle + 5);
#endif
        // 5. update.
        update(x);
        ++cycle;
        watch();
    }
#endif

    // The watchdog's and the timeline's record of STATE.
    void watch() {
        uint32_t state = top->state;
        if (state != last_state) {
            last_state = state;
            last_change = cycle;
            if (record) {
                timeline.push_back(cycle - record_base);
                timeline.push_back(state);
            }
        }
    }

    static uint64_t b_beat_bytes(const Burst& b) {
        // Bytes of this beat: from its address to the end of its size-aligned slot.
        return b.size - (b.addr & (b.size - 1));
    }
    static uint64_t next_beat_addr(const Burst& b) {
        return (b.addr & ~uint64_t(b.size - 1)) + b.size;
    }

    void write_beat() {
        VDLA_TOP& t = *top;
        if (writes.empty()) {
            fail("AXI protocol: a W beat with no write burst accepted (cycle %llu)", ULL(cycle));
            return;
        }
        Burst& head = writes.front();
        if (!head.error) {
            uint8_t data[BUS_BYTES], strb[STRB_BYTES];
            get_bytes(t.AXI(wdata), data, BUS_BYTES);
            get_bytes(t.AXI(wstrb), strb, STRB_BYTES);
            uint64_t base = head.addr & ~uint64_t(BUS_BYTES - 1);
            uint64_t lo = head.addr & (BUS_BYTES - 1), hi = lo + b_beat_bytes(head);
            for (uint64_t i = lo; i < hi; ++i)
                if (strb[i >> 3] >> (i & 7) & 1) dram[base + i] = data[i];
        }
        bool last = t.AXI(wlast);
        if (last != (head.beats == 1))
            fail("AXI protocol: WLAST %d on a beat with %u beats left in the burst (cycle %llu)",
                 int(last), head.beats, ULL(cycle));
        head.addr = next_beat_addr(head);
        if (--head.beats == 0) {
            head.ready_at = cycle + std::max<uint64_t>(1, p.write_latency);
            bresps.push_back(head);
            writes.pop_front();
        }
    }

    // --- host side: blocking AXI4-Lite transfers (the clock keeps running) -------------
    bool host_done = false;
    uint32_t host_rdata = 0;

    bool host_wait(uint64_t timeout) {
        for (uint64_t i = 0; i < timeout && !host_done; ++i) tick();
        return host_done;
    }

    bool ctrl_write(uint32_t offset, uint32_t value) {
        h_awaddr = offset;
        h_wdata = value;
        h_awvalid = h_wvalid = h_bready = true;
        host_done = false;
        if (!host_wait(1000)) {
            h_awvalid = h_wvalid = h_bready = false;
            fail("the control port did not answer a write to %#x within 1000 cycles", offset);
            return false;
        }
        return true;
    }

    bool ctrl_read(uint32_t offset, uint32_t* value) {
        h_araddr = offset;
        h_arvalid = h_rready = true;
        host_done = false;
        if (!host_wait(1000)) {
            h_arvalid = h_rready = false;
            fail("the control port did not answer a read of %#x within 1000 cycles", offset);
            return false;
        }
        *value = host_rdata;
        return true;
    }

    bool read_counters(uint64_t* out) {
        for (int i = 0; i < VDLA_N_COUNTERS; ++i) {
            uint32_t lo = 0, hi = 0;
            if (!ctrl_read(VDLA_COUNTER_OFFSETS[i], &lo) || !ctrl_read(VDLA_COUNTER_OFFSETS[i] + 4, &hi))
                return false;
            out[i] = uint64_t(hi) << 32 | lo;
        }
        return true;
    }

    void reset(unsigned cycles) {
        reads.clear();
        writes.clear();
        bresps.clear();
        h_awvalid = h_wvalid = h_bready = h_arvalid = h_rready = false;
        top->rst = 1;
        for (unsigned i = 0; i < cycles; ++i) tick();
        top->rst = 0;
        // Beats the design asked for during reset are forgotten with it.
        reads.clear();
        writes.clear();
        bresps.clear();
        error.clear();
        // Two: the Verilator build registers the reset (vdla.sim.verilator.build.
        // registered_reset), so the design leaves reset at the first edge and runs its
        // first cycle at the second, as a design with a raw reset does at the first.
        tick();
        tick();
    }

    // True when no unit can move: every unit with work waits on a token or on room in a
    // queue, and none is executing. (The caller also requires that STATE has not changed
    // for a while and that DRAM is idle, so a snapshot between two moves cannot pass.)
    static bool stuck(uint32_t s) {
        if ((s & VDLA_FETCH_BUSY) && !(s & VDLA_FETCH_WAITS)) return false;
        for (int i = 0; i < 3; ++i) {
            const auto& u = VDLA_MODULE_BITS[i];
            bool busy = s & u.busy, pending = s & u.pending;
            if (busy && !(s & u.wait_space)) return false;     // executing
            if (!busy && pending && !(s & u.wait_token)) return false;   // about to start
        }
        return true;
    }
};

}  // namespace

// --- C API ------------------------------------------------------------------------------

VDLA_API const char* vdla_build_info() { return VDLA_BUILD_INFO; }

VDLA_API void* vdla_create(uint64_t dram_size, uint64_t read_latency, uint64_t write_latency,
                           double bytes_per_cycle, uint32_t max_reads, uint32_t max_writes,
                           const char* wave_path) {
    auto* m = new Model;
    m->ctx.reset(new VerilatedContext);
    m->ctx->commandArgs(0, (const char**)nullptr);
#if VM_TRACE
    if (wave_path && *wave_path) m->ctx->traceEverOn(true);
#endif
    m->top.reset(new VDLA_TOP{m->ctx.get(), "top"});
    m->ports = ports_of(m->top.get());
    // calloc: the kernel hands out zero pages lazily, so a large DRAM costs nothing unused.
    m->dram = static_cast<uint8_t*>(std::calloc(dram_size, 1));
    if (!m->dram) {
        delete m;
        return nullptr;
    }
    m->dram_size = dram_size;
    m->p = DramParams{read_latency, write_latency, bytes_per_cycle, max_reads, max_writes};
#if VM_TRACE
    if (wave_path && *wave_path) {
        m->trace.reset(new VDLA_TRACE_CLASS);
        m->top->trace(m->trace.get(), 99);
        m->trace->open(wave_path);
    }
#else
    (void)wave_path;
#endif
    m->top->eval();   // the first eval runs the initial blocks; `tick` relies on it
    m->reset(8);
    return m;
}

VDLA_API void vdla_destroy(void* h) {
    auto* m = static_cast<Model*>(h);
    if (!m) return;
#if VM_TRACE
    if (m->trace) m->trace->close();
#endif
    m->top->final();
    std::free(m->dram);
    delete m;
}

VDLA_API uint8_t* vdla_dram(void* h) { return static_cast<Model*>(h)->dram; }
VDLA_API uint64_t vdla_cycle(void* h) { return static_cast<Model*>(h)->cycle; }
VDLA_API const char* vdla_error(void* h) { return static_cast<Model*>(h)->error.c_str(); }
VDLA_API void vdla_clear_error(void* h) { static_cast<Model*>(h)->error.clear(); }
VDLA_API void vdla_reset(void* h, uint32_t cycles) { static_cast<Model*>(h)->reset(cycles); }
VDLA_API uint32_t vdla_state(void* h) { return static_cast<Model*>(h)->top->state; }

VDLA_API void vdla_step(void* h, uint64_t cycles) {
    auto* m = static_cast<Model*>(h);
    for (uint64_t i = 0; i < cycles; ++i) m->tick();
}

VDLA_API void vdla_flush_wave(void* h) {
#if VM_TRACE
    auto* m = static_cast<Model*>(h);
    if (m->trace) m->trace->flush();
#else
    (void)h;
#endif
}

VDLA_API int32_t vdla_port_count(void* h) { return int32_t(static_cast<Model*>(h)->ports.size()); }

VDLA_API const char* vdla_port_name(void* h, int32_t i, uint32_t* width, int32_t* input) {
    const auto& ports = static_cast<Model*>(h)->ports;
    if (i < 0 || i >= int32_t(ports.size())) return nullptr;
    *width = ports[i].width;
    *input = ports[i].input;
    return ports[i].name;
}

// peek/poke copy the port's storage (little-endian, `storage_bytes(width)` bytes). A poke
// takes effect at the next eval: after `vdla_eval` or within the next step.
VDLA_API int32_t vdla_peek(void* h, int32_t i, uint8_t* out) {
    const auto& ports = static_cast<Model*>(h)->ports;
    if (i < 0 || i >= int32_t(ports.size())) return -1;
    std::memcpy(out, ports[i].ptr, storage_bytes(ports[i].width));
    return 0;
}
VDLA_API int32_t vdla_poke(void* h, int32_t i, const uint8_t* in) {
    const auto& ports = static_cast<Model*>(h)->ports;
    if (i < 0 || i >= int32_t(ports.size()) || !ports[i].input) return -1;
    std::memcpy(ports[i].ptr, in, storage_bytes(ports[i].width));
    return 0;
}
VDLA_API void vdla_eval(void* h) { static_cast<Model*>(h)->top->eval(); }

VDLA_API int32_t vdla_ctrl_write(void* h, uint32_t offset, uint32_t value) {
    return static_cast<Model*>(h)->ctrl_write(offset, value) ? 0 : -1;
}
VDLA_API int32_t vdla_ctrl_read(void* h, uint32_t offset, uint32_t* value) {
    return static_cast<Model*>(h)->ctrl_read(offset, value) ? 0 : -1;
}

// Runs `insn_count` instructions from `insn_addr` until the accelerator raises done, the
// cycle budget runs out, or the watchdog finds it stuck (STATE unchanged for
// `stall_cycles` with every unit waiting and DRAM idle). Fills `out`; the counters are
// read over the control port, as a driver would.
VDLA_API int32_t vdla_run(void* h, uint64_t insn_addr, uint64_t insn_count, uint64_t max_cycles,
                          uint64_t stall_cycles, int32_t record, RunResult* out) {
    auto* m = static_cast<Model*>(h);
    VDLA_TOP& t = *m->top;
    std::memset(out, 0, sizeof *out);
    m->error.clear();
    if (!m->ctrl_write(VDLA_REG_INSN_ADDR, uint32_t(insn_addr)) ||
        !m->ctrl_write(VDLA_REG_INSN_COUNT, uint32_t(insn_count))) {
        out->status = RUN_HOST_ERROR;
        return out->status;
    }
    // Cycle 0 of the run (and of its timeline) is the first cycle of the start write.
    uint64_t start = m->cycle + Model::INPUT_DELAY;
    m->record = record != 0;
    m->timeline.clear();
    m->record_base = start;
    if (m->record) {
        m->timeline.push_back(0);
        m->timeline.push_back(t.state);
    }
    if (!m->ctrl_write(VDLA_REG_CTRL, 1)) {
        m->record = false;
        out->status = RUN_HOST_ERROR;
        return out->status;
    }
    m->last_change = m->cycle;
    int32_t status = RUN_DONE;
    for (;;) {
        // The hot loop: check the slower conditions every 256 cycles only.
        for (int i = 0; i < 256 && !t.irq; ++i) m->tick();
        if (t.irq) break;
        if (!m->error.empty()) { status = RUN_BUS_ERROR; break; }
        if (m->cycle - start >= max_cycles) { status = RUN_TIMEOUT; break; }
        if (m->cycle - m->last_change >= stall_cycles && m->dram_idle() && Model::stuck(t.state)) {
            status = RUN_STALLED;
            break;
        }
    }
    if (status == RUN_DONE && !m->error.empty()) status = RUN_BUS_ERROR;
    out->cycles = m->cycle - start;
    out->state = t.state;
    m->record = false;
    // Counters count live, so they also say how far a stopped run got. A bus error may
    // have left the design waiting for beats that will not come; the control port still
    // answers. The run's first error is the one reported.
    std::string first_error = m->error;
    if (!m->read_counters(out->counters)) status = RUN_HOST_ERROR;
    if (!first_error.empty()) m->error = first_error;
    out->status = status;
    return status;
}

VDLA_API uint64_t vdla_timeline_size(void* h) { return static_cast<Model*>(h)->timeline.size() / 2; }
VDLA_API void vdla_timeline_copy(void* h, uint64_t* out) {
    auto* m = static_cast<Model*>(h);
    std::memcpy(out, m->timeline.data(), m->timeline.size() * sizeof(uint64_t));
}
VDLA_API uint64_t vdla_dram_pending(void* h) {
    auto* m = static_cast<Model*>(h);
    return m->reads.size() + m->writes.size() + m->bresps.size();
}
