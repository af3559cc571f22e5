// What this CPU offers for bf16 products, and the probes of their peaks: AVX-512 BF16's vdpbf16ps
// (16 lanes, a pair of products per lane) and AMX's tdpbf16ps (a 16×16 fp32 tile += a 16×32 bf16
// tile times a 32×16 one: 8,192 multiply-adds, 16,384 FLOP, per instruction). Each function
// carries its target attribute itself, so that nothing else in the build is compiled for these
// extensions.
//
// AMX needs the kernel's permission to use the 8 KB tile state: arch_prctl(ARCH_REQ_XCOMP_PERM,
// XFEATURE_XTILEDATA), once per process (a process-wide grant, as Highway's target choice is
// process-wide state); amx_available() asks for it on first use and says whether it was given.

#include <cstdint>
#include <cstring>
#include <mutex>

#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

// GCC 12's AVX-512 intrinsics pass an uninitialised _mm512_undefined_*() as the unused merge
// operand, which -W(maybe-)uninitialized reports wherever they are inlined: silenced for this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace headlight {

namespace {

// CPUID leaf 7 EDX bits 22 (AMX-BF16) and 24 (AMX-TILE), and the OS's XCR0 bits 17 and 18 (tile
// configuration and data state enabled).
bool cpu_has_amx_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!((d >> 22) & 1) || !((d >> 24) & 1)) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return false;  // OSXSAVE
  uint32_t lo = 0, hi = 0;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0x60000u) == 0x60000u;
}

}  // namespace

bool amx_available() {
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [] {
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    ok = cpu_has_amx_bf16() && syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  });
  return ok;
}

__attribute__((target("amx-tile,amx-bf16"))) void amx_configure_tiles() {
  // The 64-byte configuration: palette, start row, 14 reserved bytes, 16 column widths in bytes
  // (u16), 16 row counts (u8).
  alignas(64) uint8_t config[64];
  std::memset(config, 0, sizeof config);
  config[0] = 1;
  for (int t = 0; t < 8; ++t) {
    const uint16_t colsb = 64;
    std::memcpy(config + 16 + 2 * t, &colsb, 2);
    config[48 + t] = 16;
  }
  // GCC 12 drops the stores above before _tile_loadconfig (it sees only the first 16 bytes read),
  // so the instruction is written with the whole 64-byte block as its memory operand.
  __asm__ volatile("ldtilecfg %0" : : "m"(*reinterpret_cast<const uint8_t(*)[64]>(config)));
}

__attribute__((target("amx-tile,amx-bf16"))) void amx_release_tiles() {
  _tile_release();
}

__attribute__((target("amx-tile,amx-bf16"))) double amx_tile_chains(int64_t iterations,
                                                                    float* sink) {
  // Four independent accumulator tiles (each tdpbf16ps waits on its own tile only), operands in
  // tiles 4–7: products of 1.0 and 2⁻³² keep the sums finite.
  alignas(64) static const struct Operands {
    uint16_t one[16 * 32], tiny[16 * 32];
    Operands() {
      for (int i = 0; i < 16 * 32; ++i) one[i] = 0x3F80, tiny[i] = 0x2F80;
    }
  } operands;
  alignas(64) float c[16 * 16];
  amx_configure_tiles();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operands.one, 64);
  _tile_loadd(5, operands.one, 64);
  _tile_loadd(6, operands.tiny, 64);
  _tile_loadd(7, operands.tiny, 64);
  for (int64_t n = 0; n < iterations; ++n) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  amx_release_tiles();
  *sink += c[0];
  return 4.0 * 16 * 16 * 32 * 2 * static_cast<double>(iterations);
}

bool cpu_has_bf16_dot() {
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16"))) double bf16_dot_chains(
    int64_t iterations, float* sink) {
  constexpr int kChains = 20;
  // Products of 1.0 and a tiny bf16 keep the sums finite for any iteration count.
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3F80);  // 1.0
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x2F80);  // 2^-32
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  for (int64_t n = 0; n < iterations; ++n) {
#pragma GCC unroll 32
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  *sink += _mm512_reduce_add_ps(s);
  return 64.0 * kChains * static_cast<double>(iterations);
}

}  // namespace headlight

#else

namespace headlight {

bool cpu_has_bf16_dot() {
  return false;
}

bool amx_available() {
  return false;
}

void amx_configure_tiles() {
  fail("amx_configure_tiles: no AMX on this architecture");
}

void amx_release_tiles() {}

double amx_tile_chains(int64_t, float*) {
  fail("amx_tile_chains: no AMX on this architecture");
}

double bf16_dot_chains(int64_t, float*) {
  fail("bf16_dot_chains: no bf16 dot-product instruction on this architecture");
}

}  // namespace headlight

#endif
