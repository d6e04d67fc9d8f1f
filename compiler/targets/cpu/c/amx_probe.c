/* amx_probe.c: the AMX tile limits of this CPU, a program machine.py builds and runs only
 * where /proc/cpuinfo lists amx_tile (elsewhere the instructions it may run fault).
 *
 * It prints one line, "PALETTES MAX_ROWS BYTES_PER_ROW TILES TMUL_K TMUL_N USABLE":
 * CPUID leaf 0x1D (sub-leaf 0: the highest palette; sub-leaf 1: palette 1's tile
 * limits) and leaf 0x1E (the tile multiplier's K and N), then whether a tile runs here:
 * Linux hands a process the AMX tile state only when asked (arch_prctl
 * ARCH_REQ_XCOMP_PERM), so USABLE is 1 when the kernel grants it and a tile
 * configured with palette 1 can be zeroed and released. Built with -mamx-tile; without
 * it (__AMX_TILE__ undefined) the tile test is left out and USABLE is -1.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <cpuid.h>
#if defined(__linux__)
#include <unistd.h>
#include <sys/syscall.h>
#endif
#if defined(__AMX_TILE__)
#include <immintrin.h>
#endif

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int tile_runs(unsigned max_rows, unsigned bytes_per_row) {
#if defined(__AMX_TILE__) && defined(__linux__) && defined(SYS_arch_prctl)
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 0;
    /* The 64-byte tile configuration: palette 1, tile 0 max_rows x bytes_per_row. */
    unsigned char config[64];
    memset(config, 0, sizeof config);
    config[0] = 1;
    config[16] = (unsigned char)(bytes_per_row & 0xff);
    config[17] = (unsigned char)(bytes_per_row >> 8);
    config[48] = (unsigned char)max_rows;
    _tile_loadconfig(config);
    _tile_zero(0);
    _tile_release();
    return 1;
#else
    (void)max_rows;
    (void)bytes_per_row;
    return -1;
#endif
}

int main(void) {
    unsigned eax, ebx, ecx, edx;
    if (__get_cpuid_max(0, NULL) < 0x1e
        || !__get_cpuid_count(0x1d, 0, &eax, &ebx, &ecx, &edx)) {
        printf("0 0 0 0 0 0 0\n");
        return 0;
    }
    unsigned palettes = eax;
    __get_cpuid_count(0x1d, 1, &eax, &ebx, &ecx, &edx);
    unsigned bytes_per_row = ebx & 0xffff, tiles = ebx >> 16, max_rows = ecx & 0xffff;
    __get_cpuid_count(0x1e, 0, &eax, &ebx, &ecx, &edx);
    unsigned tmul_k = ebx & 0xff, tmul_n = (ebx >> 8) & 0xffff;
    int usable = palettes >= 1 ? tile_runs(max_rows, bytes_per_row) : 0;
    printf("%u %u %u %u %u %u %d\n", palettes, max_rows, bytes_per_row, tiles, tmul_k, tmul_n,
           usable);
    return 0;
}
