// Per-target SIMD inner loops of the fused attention kernels (flash_kernels.cc dispatches to them;
// flash_forward.cc and flash_backward.cc have the tiling).
//
// Three loops do all the arithmetic of one (query block × key block) tile:
//   QkTile        S[r, c]  = Σ_e Q[r, e] · Kᵀ[e, c]      register tile of R rows × NV vectors of
//   keys;
//                 Q is broadcast one element at a time, Kᵀ (packed [D, Bc]) is loaded as vectors.
//   SoftmaxRows   the online softmax of each row: m' = max(m, max_c S), α = exp(m − m'),
//                 P = exp(S − m'), l' = α·l + Σ_c P, in place of S.
//   PvTile        O[r, :] = α_r · O[r, :] + Σ_c P[r, c] · V[c, :]   register tile of R rows × NV
//                 vectors of the value dim; P is broadcast, V (packed [Bc, Dv]) loaded as vectors.
// Decode's scores from key rows read in place (DotTile) are in flash_dot-inl.h.
// Widths are padded to whole vectors by the packing in flash_forward.cc (padded keys are −inf in S
// and zero in V), so the loops have no tails.

#if defined(HEADLIGHT_ATTENTION_FLASH_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADLIGHT_ATTENTION_FLASH_KERNELS_INL_H_
#undef HEADLIGHT_ATTENTION_FLASH_KERNELS_INL_H_
#else
#define HEADLIGHT_ATTENTION_FLASH_KERNELS_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>

#include "headlight/core/bf16.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "src/attention/cpu/flash_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace headlight {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Loads of the decode path's key and value rows, which are float32 or (a bf16 cache) bf16: a
// vector of floats from `p` (bf16 widened exactly), and one element.
template <class T>
HWY_INLINE VF LoadKV(DF d, const T* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(d, p);
  } else {
    const hn::Rebind<hwy::bfloat16_t, DF> db;
    return hn::PromoteTo(d, hn::LoadU(db, reinterpret_cast<const hwy::bfloat16_t*>(p)));
  }
}
template <class T>
HWY_INLINE float ElementKV(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return *p;
  } else {
    return to_float(*p);
  }
}
// The first n < lanes elements of p as a vector, zero beyond.
template <class T>
HWY_INLINE VF LoadKVTail(DF d, const T* HWY_RESTRICT p, size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::MaskedLoad(hn::FirstN(d, n), d, p);
  } else {
    HWY_ALIGN float buf[hn::MaxLanes(DF())] = {};
    for (size_t i = 0; i < n; ++i) buf[i] = to_float(p[i]);
    return hn::Load(d, buf);
  }
}

// Calls f.template operator()<R>(r) over blocks of output rows: R = 6 (the register tile's height)
// while six rows remain, then once with the remainder (1..5).
template <class F>
HWY_INLINE void ForRowBlocks(size_t rows, F&& f) {
  size_t r = 0;
  for (; r + 6 <= rows; r += 6) f.template operator()<6>(r);
  switch (rows - r) {
    case 5:
      f.template operator()<5>(r);
      break;
    case 4:
      f.template operator()<4>(r);
      break;
    case 3:
      f.template operator()<3>(r);
      break;
    case 2:
      f.template operator()<2>(r);
      break;
    case 1:
      f.template operator()<1>(r);
      break;
    default:
      break;
  }
}

// S[R rows, NV vectors] for rows q[0..R) (leading dim ldq) against kt[:, c0 .. c0 + NV·L).
template <size_t R, size_t NV>
HWY_INLINE void QkMicro(const float* HWY_RESTRICT q, size_t ldq, const float* HWY_RESTRICT kt,
                        size_t ldk, size_t dim, float* HWY_RESTRICT s, size_t lds) {
#if HWY_HAVE_SCALABLE
  // Sizeless (SVE/RVV) vectors cannot live in arrays: one accumulator at a time.
  const DF d;
  const size_t L = hn::Lanes(d);
  for (size_t r = 0; r < R; ++r)
    for (size_t v = 0; v < NV; ++v) {
      VF acc = hn::Zero(d);
      for (size_t e = 0; e < dim; ++e)
        acc = hn::MulAdd(hn::Set(d, q[r * ldq + e]), hn::LoadU(d, kt + e * ldk + v * L), acc);
      hn::StoreU(acc, d, s + r * lds + v * L);
    }
#else
  const DF d;
  const size_t L = hn::Lanes(d);
  VF acc[R][NV];
  for (size_t r = 0; r < R; ++r)
    for (size_t v = 0; v < NV; ++v) acc[r][v] = hn::Zero(d);
  for (size_t e = 0; e < dim; ++e) {
    VF k[NV];
    for (size_t v = 0; v < NV; ++v) k[v] = hn::LoadU(d, kt + e * ldk + v * L);
    for (size_t r = 0; r < R; ++r) {
      const VF qv = hn::Set(d, q[r * ldq + e]);
      for (size_t v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(qv, k[v], acc[r][v]);
    }
  }
  for (size_t r = 0; r < R; ++r)
    for (size_t v = 0; v < NV; ++v) hn::StoreU(acc[r][v], d, s + r * lds + v * L);
#endif
}

template <size_t R>
HWY_INLINE void QkRows(const float* q, size_t ldq, const float* kt, size_t ldk, size_t dim,
                       size_t cols, float* s, size_t lds) {
  const size_t L = hn::Lanes(DF());
  size_t c = 0;
  for (; c + 4 * L <= cols; c += 4 * L) QkMicro<R, 4>(q, ldq, kt + c, ldk, dim, s + c, lds);
  for (; c < cols; c += L) QkMicro<R, 1>(q, ldq, kt + c, ldk, dim, s + c, lds);
}

// s[rows, cols] = q[rows, dim] · kt[dim, cols]; cols is a multiple of the vector length.
void QkTile(const float* q, size_t ldq, size_t rows, const float* kt, size_t ldk, size_t dim,
            size_t cols, float* s, size_t lds) {
  ForRowBlocks(rows, [&]<size_t R>(size_t r) {
    QkRows<R>(q + r * ldq, ldq, kt, ldk, dim, cols, s + r * lds, lds);
  });
}

// s ← cap · tanh(s / cap) over rows × cols.
void SoftcapTile(float* s, size_t rows, size_t cols, size_t lds, float cap) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const VF vcap = hn::Set(d, cap), inv = hn::Set(d, 1.0f / cap);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; c += L) {
      const VF x = hn::LoadU(d, s + r * lds + c);
      hn::StoreU(hn::Mul(vcap, hn::Tanh(d, hn::Mul(x, inv))), d, s + r * lds + c);
    }
}

// exp(x) for probabilities recomputed from a saved log-sum-exp (ExpShiftRows: probabilities()
// and the backward), x ≤ 0 (scores minus the lse): Cody–Waite reduction
// x = n·ln 2 + r, |r| ≤ ln2 / 2, a degree-7 Taylor polynomial for e^r (truncation error
// < 5e-9 relative), and 2^n added to the exponent bits. Below −87 (and for −inf) the result is
// exactly 0 (x ≥ −87 keeps 2^n and the result normal). About 14 operations against hn::Exp's ~20,
// which matters because the exponential is the one per-score cost the products do not amortise.
// A NaN input gives 0 (ExpShiftRows handles NaN and −inf lse rows before it exponentiates).
HWY_INLINE VF ExpNonPositive(DF d, VF x) {
  using DI = hn::RebindToSigned<DF>;
  const DI di;
  const VF n = hn::Round(hn::Mul(x, hn::Set(d, 1.44269504088896341f)));
  VF r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), x);  // ln 2, high part (exact product)
  r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);  // ln 2, low part
  VF p = hn::Set(d, 1.0f / 5040.0f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f / 720.0f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f / 120.0f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f / 24.0f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f / 6.0f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.5f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
  const auto scale = hn::ShiftLeft<23>(hn::ConvertTo(di, n));
  const VF y = hn::BitCast(d, hn::Add(hn::BitCast(di, p), scale));
  return hn::IfThenElseZero(hn::Ge(x, hn::Set(d, -87.0f)), y);
}

// 2^x for the online softmax, x ≤ 0 up to rounding (scores times log2 e minus the running
// maximum times log2 e, one FMA): x = n + f with n = round(x), f ∈ [−½, ½] exact, and 2^f from a
// degree-6 polynomial (Chebyshev fit, truncation error < 3e-9 relative; float Horner ≈ 1e-7), 2^n
// added to the exponent bits. Below −125 (and for −inf) exactly 0. Against ExpNonPositive it
// drops the multiplication by log2 e (folded into the FMA that subtracts the maximum), the two
// Cody–Waite steps (one exact subtraction instead) and one polynomial term: 7 operations on the
// FMA ports instead of 10, which is most of the softmax's cost beside the products.
HWY_INLINE VF Exp2Softmax(DF d, VF x) {
  using DI = hn::RebindToSigned<DF>;
  const DI di;
  const VF n = hn::Round(x);
  const VF f = hn::Sub(x, n);
  VF p = hn::Set(d, 1.5469732170e-4f);
  p = hn::MulAdd(p, f, hn::Set(d, 1.3400432654e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 9.6180252731e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.5503271520e-2f));
  p = hn::MulAdd(p, f, hn::Set(d, 2.4022650719e-1f));
  p = hn::MulAdd(p, f, hn::Set(d, 6.9314718246e-1f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.0f));
  const auto scale = hn::ShiftLeft<23>(hn::ConvertTo(di, n));
  const VF y = hn::BitCast(d, hn::Add(hn::BitCast(di, p), scale));
  return hn::IfThenElseZero(hn::Ge(x, hn::Set(d, -125.0f)), y);
}

constexpr float kLog2e = 1.44269504088896341f;

// Most rows SoftmaxRows handles in one call (softmax_rows splits larger tiles).
constexpr size_t kMaxSoftmaxRows = attention::cpu::kernels::kSoftmaxRowsPerCall;

// The online softmax over `cols` columns of each row (cols a multiple of the vector length, the
// columns past the valid keys already −inf). In three passes, so that no row waits on another:
//   A  per row: the tile maximum (one horizontal reduction), and whether a NaN is present;
//   B  over rows, a vector at a time: m' = max(m, tile max), α = exp(m − m');
//   C  per row: P = exp(S − m') in place, and the running sum kept per lane,
//      l[r, :] = α·l[r, :] + Σ_c P[r, c·L .. c·L + L)  (l is [rows, L]; its lanes are added once,
//      at the end of the item, so a tile costs no second horizontal reduction).
// A row that saw a NaN score gets m = α = NaN, so its sum and output become NaN (hn::Exp alone
// would turn a NaN score into 0).
// Statistics, when `ent` and `argmax` are non-null (else skipped):
//   argmax[r] = the first column holding the tile maximum when it beats the running maximum
//               (a new best key), −1 otherwise;
//   ent[r]    = Σ_j p̃_j (s_j − m) over the keys so far, with p̃ = exp(s − m) and m the running
//               maximum, kept current as m changes: ent' = α·(ent + (m − m')·l) + Σ_tile p̃ (s −
//               m'). The row's entropy is then log l − ent / l.
// With extras.scale ≠ 1 the tile holds raw scores and every score above is scale · s (the tile
// maximum is scaled after it is found, P = 2^(s·scale·log2 e − m'·log2 e)); with extras.pb, P is
// rounded to bf16 (nearest even: add 0x7FFF plus the lowest kept bit, keep the upper 16 bits) and
// stored there, and S is left as it was; with extras.lr as well (no statistics), the sums of P as
// rounded are kept there as l's are.
void SoftmaxRows(float* s, size_t rows, size_t cols, size_t lds, float* m, float* l, float* alpha,
                 const attention::cpu::kernels::SoftmaxExtras& extras) {
  const DF d;
  const size_t L = hn::Lanes(d);
  float* ent = extras.ent;
  int32_t* argmax = extras.argmax;
  const float scale = extras.scale;
  const float ninf = -std::numeric_limits<float>::infinity();
  HWY_ALIGN float tile_max[kMaxSoftmaxRows], m_new[kMaxSoftmaxRows], a[kMaxSoftmaxRows];
  // A.
  for (size_t r = 0; r < rows; ++r) {
    const float* row = s + r * lds;
    VF vmax0 = hn::Set(d, ninf), vmax1 = vmax0;
    VF nan = hn::Zero(d);
    size_t c = 0;
    for (; c + 2 * L <= cols; c += 2 * L) {
      const VF x0 = hn::LoadU(d, row + c), x1 = hn::LoadU(d, row + c + L);
      vmax0 = hn::Max(vmax0, x0);
      vmax1 = hn::Max(vmax1, x1);
      nan = hn::Or(nan, hn::VecFromMask(d, hn::IsNaN(hn::Add(x0, x1))));
    }
    if (c < cols) {
      const VF x = hn::LoadU(d, row + c);
      vmax0 = hn::Max(vmax0, x);
      nan = hn::Or(nan, hn::VecFromMask(d, hn::IsNaN(x)));
    }
    const float raw_max = hn::AllFalse(d, hn::MaskFromVec(nan))
                              ? hn::GetLane(hn::MaxOfLanes(d, hn::Max(vmax0, vmax1)))
                              : std::numeric_limits<float>::quiet_NaN();
    tile_max[r] = raw_max * scale;
    if (argmax) {
      argmax[r] = -1;
      if (tile_max[r] > m[r]) {
        const VF t = hn::Set(d, raw_max);
        for (size_t c2 = 0; c2 < cols; c2 += L) {
          const intptr_t at = hn::FindFirstTrue(d, hn::Eq(hn::LoadU(d, row + c2), t));
          if (at >= 0) {
            argmax[r] = static_cast<int32_t>(c2 + static_cast<size_t>(at));
            break;
          }
        }
      }
    }
  }
  // B.
  const size_t padded = (rows + L - 1) / L * L;
  for (size_t r = 0; r < padded; ++r) {
    m_new[r] = r < rows ? m[r] : ninf;
    if (r >= rows) tile_max[r] = ninf;
  }
  const VF vninf = hn::Set(d, ninf), one = hn::Set(d, 1.0f);
  const VF qnan = hn::Set(d, std::numeric_limits<float>::quiet_NaN());
  for (size_t r = 0; r < padded; r += L) {
    const VF mo = hn::Load(d, m_new + r), tm = hn::Load(d, tile_max + r);
    const auto is_nan = hn::Or(hn::IsNaN(mo), hn::IsNaN(tm));
    const VF mn = hn::IfThenElse(is_nan, qnan, hn::Max(mo, tm));
    // exp(−inf − m') = 0 when nothing was allowed before; α = 1 while nothing is allowed at all.
    // α = 2^(mo·log2 e − mn·log2 e), with the products rounded as pass C rounds them, so that
    // every tile's P is scaled by the same 2^(−round(m·log2 e)).
    const VF l2e = hn::Set(d, kLog2e);
    VF al = hn::IfThenElse(hn::Eq(mn, vninf), one,
                           Exp2Softmax(d, hn::Sub(hn::Mul(mo, l2e), hn::Mul(mn, l2e))));
    al = hn::IfThenElse(is_nan, qnan, al);
    hn::Store(mn, d, m_new + r);
    hn::Store(al, d, a + r);
  }
  // C.
  for (size_t r = 0; r < rows; ++r) {
    float* row = s + r * lds;
    const float m_prev = m[r];
    m[r] = m_new[r];
    alpha[r] = a[r];
    const VF vm = hn::Set(d, m_new[r]), vscale = hn::Set(d, scale);
    // P = 2^(s·log2 e − round(m'·log2 e)): one FMA, then Exp2Softmax.
    const VF l2e = hn::Set(d, kLog2e * scale), vml = hn::Set(d, m_new[r] * kLog2e);
    bf16* pb_row = extras.pb ? extras.pb + r * extras.ldpb : nullptr;
    float* lr_row = pb_row && extras.lr && !ent ? extras.lr + r * L : nullptr;
    VF rsum = hn::Zero(d);  // Σ P as rounded, with lr_row
    // Stores P: fp32 into the tile, or rounded to bf16 into pb.
    auto store = [&](VF p, size_t at) {
      if (!pb_row) return hn::StoreU(p, d, row + at);
      using DI = hn::RebindToSigned<DF>;
      const DI di;
      const auto bits = hn::BitCast(di, p);
      const auto bump =
          hn::Add(hn::Set(di, 0x7FFF), hn::And(hn::ShiftRight<16>(bits), hn::Set(di, 1)));
      const auto upper = hn::ShiftRight<16>(hn::Add(bits, bump));
      const hn::Rebind<uint16_t, DI> d16;
      hn::StoreU(hn::DemoteTo(d16, upper), d16, reinterpret_cast<uint16_t*>(pb_row + at));
      if (lr_row) rsum = hn::Add(rsum, hn::BitCast(d, hn::ShiftLeft<16>(upper)));
    };
    const bool none = m_new[r] == ninf;  // no allowed key yet: P = 0 (exp(−inf − −inf) is NaN)
    VF sum0 = hn::Zero(d), sum1 = sum0;
    size_t c = 0;
    if (ent) {
      // With statistics: the same P, plus Σ p̃·(s − m'); t is clamped so that p̃ = 0 gives 0.
      const VF floor = hn::Set(d, -1e30f);
      VF e = hn::Zero(d);
      for (; c < cols; c += L) {
        const VF x = hn::LoadU(d, row + c);
        const VF t = hn::MulSub(x, vscale, vm);  // natural units, for the entropy term
        const VF p0 = none ? hn::Zero(d) : Exp2Softmax(d, hn::MulSub(x, l2e, vml));
        sum0 = hn::Add(sum0, p0);
        e = hn::MulAdd(p0, hn::Max(t, floor), e);
        store(p0, c);
      }
      float* lr = l + r * L;
      const float l_old = hn::GetLane(hn::SumOfLanes(d, hn::LoadU(d, lr)));
      const float shift = l_old > 0 ? (m_prev - m_new[r]) * l_old : 0.0f;
      ent[r] = none ? 0.0f : a[r] * (ent[r] + shift) + hn::GetLane(hn::SumOfLanes(d, e));
      hn::StoreU(hn::MulAdd(hn::Set(d, a[r]), hn::LoadU(d, lr), sum0), d, lr);
      continue;
    }
    for (; c + 2 * L <= cols; c += 2 * L) {
      const VF p0 =
          none ? hn::Zero(d) : Exp2Softmax(d, hn::MulSub(hn::LoadU(d, row + c), l2e, vml));
      const VF p1 =
          none ? hn::Zero(d) : Exp2Softmax(d, hn::MulSub(hn::LoadU(d, row + c + L), l2e, vml));
      sum0 = hn::Add(sum0, p0);
      sum1 = hn::Add(sum1, p1);
      store(p0, c);
      store(p1, c + L);
    }
    if (c < cols) {
      const VF p0 =
          none ? hn::Zero(d) : Exp2Softmax(d, hn::MulSub(hn::LoadU(d, row + c), l2e, vml));
      sum0 = hn::Add(sum0, p0);
      store(p0, c);
    }
    float* lr = l + r * L;
    hn::StoreU(hn::MulAdd(hn::Set(d, a[r]), hn::LoadU(d, lr), hn::Add(sum0, sum1)), d, lr);
    if (lr_row) hn::StoreU(hn::MulAdd(hn::Set(d, a[r]), hn::LoadU(d, lr_row), rsum), d, lr_row);
  }
}

// c[R rows, NV vectors] = α ⊙ c + Σ_k A(r, k) · b[k, NV vectors], the register tile of the
// products with a broadcast left operand: A(r, k) = a[r·lda + k] (PvTile: O += P·V, dQ += dS·K) or,
// with kTransposedA, a[k·lda + r] (AccumulateTransposed: dV += P'ᵀ·dO, dK += dSᵀ·Q). b is loaded
// as vectors; α = 1 when null.
template <size_t R, size_t NV, bool kTransposedA, class TB>
HWY_INLINE void AccumulateMicro(const float* HWY_RESTRICT a, size_t lda, size_t inner,
                                const TB* HWY_RESTRICT b, size_t ldb, float* HWY_RESTRICT c,
                                size_t ldc, const float* HWY_RESTRICT alpha) {
  const DF d;
  const size_t L = hn::Lanes(d);
  auto a_at = [&](size_t r, size_t k) { return kTransposedA ? a[k * lda + r] : a[r * lda + k]; };
#if HWY_HAVE_SCALABLE
  // Sizeless (SVE/RVV) vectors cannot live in arrays: one accumulator at a time.
  for (size_t r = 0; r < R; ++r)
    for (size_t x = 0; x < NV; ++x) {
      VF acc = hn::Mul(hn::Set(d, alpha ? alpha[r] : 1.0f), hn::LoadU(d, c + r * ldc + x * L));
      for (size_t k = 0; k < inner; ++k)
        acc = hn::MulAdd(hn::Set(d, a_at(r, k)), LoadKV(d, b + k * ldb + x * L), acc);
      hn::StoreU(acc, d, c + r * ldc + x * L);
    }
#else
  VF acc[R][NV];
  for (size_t r = 0; r < R; ++r) {
    const VF al = hn::Set(d, alpha ? alpha[r] : 1.0f);
    for (size_t x = 0; x < NV; ++x) acc[r][x] = hn::Mul(al, hn::LoadU(d, c + r * ldc + x * L));
  }
  for (size_t k = 0; k < inner; ++k) {
    VF bv[NV];
    for (size_t x = 0; x < NV; ++x) bv[x] = LoadKV(d, b + k * ldb + x * L);
    for (size_t r = 0; r < R; ++r) {
      const VF av = hn::Set(d, a_at(r, k));
      for (size_t x = 0; x < NV; ++x) acc[r][x] = hn::MulAdd(av, bv[x], acc[r][x]);
    }
  }
  for (size_t r = 0; r < R; ++r)
    for (size_t x = 0; x < NV; ++x) hn::StoreU(acc[r][x], d, c + r * ldc + x * L);
#endif
}

// The tile over the whole width, four vectors at a time, then one.
template <size_t R, bool kTransposedA, class TB>
HWY_INLINE void AccumulateRows(const float* a, size_t lda, size_t inner, const TB* b, size_t ldb,
                               size_t width, float* c, size_t ldc, const float* alpha) {
  const size_t L = hn::Lanes(DF());
  size_t x = 0;
  for (; x + 4 * L <= width; x += 4 * L)
    AccumulateMicro<R, 4, kTransposedA>(a, lda, inner, b + x, ldb, c + x, ldc, alpha);
  for (; x < width; x += L)
    AccumulateMicro<R, 1, kTransposedA>(a, lda, inner, b + x, ldb, c + x, ldc, alpha);
}

// o[rows, width] = alpha ⊙ o + p[rows, cols] · v[cols, width]; width a multiple of the vector
// length.
template <class TB>
void PvTileT(const float* p, size_t ldp, size_t rows, size_t cols, const TB* v, size_t ldv,
             size_t width, float* o, size_t ldo, const float* alpha) {
  ForRowBlocks(rows, [&]<size_t R>(size_t r) {
    AccumulateRows<R, false>(p + r * ldp, ldp, cols, v, ldv, width, o + r * ldo, ldo,
                             alpha ? alpha + r : nullptr);
  });
}

void PvTile(const float* p, size_t ldp, size_t rows, size_t cols, const float* v, size_t ldv,
            size_t width, float* o, size_t ldo, const float* alpha) {
  PvTileT(p, ldp, rows, cols, v, ldv, width, o, ldo, alpha);
}

// PvTile for decode, whose value rows are read where they lie, from memory: fp32, or bf16 (a bf16
// KV cache) widened as they are loaded. On AVX-512, rows of 8 vectors (D = 128) go two query rows
// at a time over the whole width (16 accumulators), so that each pass reads every value row
// whole, in address order, as the hardware prefetchers follow a stream (decode does not prefetch
// long rows itself: flash_dot-inl.h); PvTileT's 4-vector column blocks would read each row in two
// strided halves. The arithmetic is PvTileT's, element for element: the same bits.
template <class TB>
void PvInPlaceT(const float* p, size_t ldp, size_t rows, size_t cols, const TB* v, size_t ldv,
                size_t width, float* o, size_t ldo, const float* alpha) {
#if HWY_MAX_BYTES == 64 && !HWY_HAVE_SCALABLE  // 32 vector registers (AVX-512)
  if (width == 8 * hn::Lanes(DF())) {
    size_t r = 0;
    for (; r + 2 <= rows; r += 2)
      AccumulateMicro<2, 8, false>(p + r * ldp, ldp, cols, v, ldv, o + r * ldo, ldo,
                                   alpha ? alpha + r : nullptr);
    if (r < rows)
      AccumulateMicro<1, 8, false>(p + r * ldp, ldp, cols, v, ldv, o + r * ldo, ldo,
                                   alpha ? alpha + r : nullptr);
    return;
  }
#endif
  PvTileT(p, ldp, rows, cols, v, ldv, width, o, ldo, alpha);
}

void PvInPlace(const float* p, size_t ldp, size_t rows, size_t cols, const float* v, size_t ldv,
               size_t width, float* o, size_t ldo, const float* alpha) {
  PvInPlaceT(p, ldp, rows, cols, v, ldv, width, o, ldo, alpha);
}

void PvInPlaceBf16(const float* p, size_t ldp, size_t rows, size_t cols, const bf16* v, size_t ldv,
                   size_t width, float* o, size_t ldo, const float* alpha) {
  PvInPlaceT(p, ldp, rows, cols, v, ldv, width, o, ldo, alpha);
}

// s[r, c] ← exp(s[r, c] − lse[r]): exact probabilities from the saved log-sum-exp. Rows whose lse
// is −inf (no allowed key) become 0, rows whose lse is NaN become NaN.
void ExpShiftRows(float* s, size_t rows, size_t cols, size_t lds, const float* lse) {
  const DF d;
  const size_t L = hn::Lanes(d);
  for (size_t r = 0; r < rows; ++r) {
    float* row = s + r * lds;
    if (!(lse[r] > -std::numeric_limits<float>::infinity())) {
      const VF fill = hn::Set(d, std::isnan(lse[r]) ? lse[r] : 0.0f);
      for (size_t c = 0; c < cols; c += L) hn::StoreU(fill, d, row + c);
      continue;
    }
    const VF shift = hn::Set(d, lse[r]);
    for (size_t c = 0; c < cols; c += L)
      hn::StoreU(ExpNonPositive(d, hn::Sub(hn::LoadU(d, row + c), shift)), d, row + c);
  }
}

// c[cols, width] += a[rows, cols]ᵀ · b[rows, width]; width a multiple of the vector length.
void AccumulateTransposed(const float* a, size_t lda, size_t rows, size_t cols, const float* b,
                          size_t ldb, size_t width, float* c, size_t ldc) {
  ForRowBlocks(cols, [&]<size_t R>(size_t r) {
    AccumulateRows<R, true>(a + r, lda, rows, b, ldb, width, c + r * ldc, ldc, nullptr);
  });
}

// The softmax gradient of a tile, in place of dp: ds[r, c] = p[r, c] · (dp[r, c] − dot[r]).
void SoftmaxGradTile(const float* p, float* dp, size_t rows, size_t cols, size_t lds,
                     const float* dot) {
  const DF d;
  const size_t L = hn::Lanes(d);
  for (size_t r = 0; r < rows; ++r) {
    const VF dr = hn::Set(d, dot[r]);
    for (size_t c = 0; c < cols; c += L) {
      const VF pv = hn::LoadU(d, p + r * lds + c);
      hn::StoreU(hn::Mul(pv, hn::Sub(hn::LoadU(d, dp + r * lds + c), dr)), d, dp + r * lds + c);
    }
  }
}

// inv[r] = 1 / l[r], or 1 / norm[r] with norm (0 where l ≤ 0, as the scalar division gives it),
// and lse[r] = m[r] + log l[r] by Highway's vector logarithm (within a few ulp of logf; −inf where
// l = 0, NaN where l is NaN).
void FinishRows(const float* m, const float* l, size_t n, float* inv, float* lse,
                const float* norm) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const VF zero = hn::Zero(d), one = hn::Set(d, 1.0f);
  const VF ninf = hn::Set(d, -std::numeric_limits<float>::infinity());
  size_t r = 0;
  auto one_vector = [&](VF vm, VF vl, VF vn, auto store) {
    const auto pos = hn::Gt(vl, zero);
    // The logarithm of 1 where l is not positive (its lanes are replaced below).
    const VF log = hn::Log(d, hn::IfThenElse(pos, vl, one));
    const VF nan_or_ninf = hn::IfThenElse(hn::IsNaN(vl), vl, ninf);
    store(hn::IfThenElseZero(pos, hn::Div(one, vn)),
          hn::IfThenElse(pos, hn::Add(vm, log), nan_or_ninf));
  };
  const float* by = norm ? norm : l;
  for (; r + L <= n; r += L)
    one_vector(hn::LoadU(d, m + r), hn::LoadU(d, l + r), hn::LoadU(d, by + r), [&](VF vi, VF vs) {
      hn::StoreU(vi, d, inv + r);
      hn::StoreU(vs, d, lse + r);
    });
  if (r < n) {
    HWY_ALIGN float bm[hn::MaxLanes(DF())] = {}, bl[hn::MaxLanes(DF())] = {},
                    bn[hn::MaxLanes(DF())] = {}, bi[hn::MaxLanes(DF())], bs[hn::MaxLanes(DF())];
    std::copy(m + r, m + n, bm);
    std::copy(l + r, l + n, bl);
    std::copy(by + r, by + n, bn);
    one_vector(hn::Load(d, bm), hn::Load(d, bl), hn::Load(d, bn), [&](VF vi, VF vs) {
      hn::Store(vi, d, bi);
      hn::Store(vs, d, bs);
    });
    std::copy(bi, bi + (n - r), inv + r);
    std::copy(bs, bs + (n - r), lse + r);
  }
}

// out[r] = Σ_x a[r, x] · b[r, x] over `width` elements of fp32 or bf16 rows (widened exactly):
// one running sum per vector lane (fused multiply-adds), the lanes added at the end.
template <class TA, class TB>
void RowDotsT(const TA* a, size_t lda, const TB* b, size_t ldb, size_t rows, size_t width,
              float* out) {
  const DF d;
  const size_t L = hn::Lanes(d);
  for (size_t r = 0; r < rows; ++r) {
    const TA* x = a + r * lda;
    const TB* y = b + r * ldb;
    VF acc = hn::Zero(d);
    size_t c = 0;
    for (; c + L <= width; c += L) acc = hn::MulAdd(LoadKV(d, x + c), LoadKV(d, y + c), acc);
    if (c < width)
      acc = hn::MulAdd(LoadKVTail(d, x + c, width - c), LoadKVTail(d, y + c, width - c), acc);
    out[r] = hn::GetLane(hn::SumOfLanes(d, acc));
  }
}

void RowDots(const float* a32, const bf16* a16, size_t lda, const float* b32, const bf16* b16,
             size_t ldb, size_t rows, size_t width, float* out) {
  if (a16 && b16) return RowDotsT(a16, lda, b16, ldb, rows, width, out);
  if (a16) return RowDotsT(a16, lda, b32, ldb, rows, width, out);
  if (b16) return RowDotsT(a32, lda, b16, ldb, rows, width, out);
  RowDotsT(a32, lda, b32, ldb, rows, width, out);
}

// a[r, c] ← a[r, c] · b[r, c]  (b holds dropout factors or soft-cap derivatives).
void MulTile(float* a, const float* b, size_t rows, size_t cols, size_t lds) {
  const DF d;
  const size_t L = hn::Lanes(d);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; c += L)
      hn::StoreU(hn::Mul(hn::LoadU(d, a + r * lds + c), hn::LoadU(d, b + r * lds + c)), d,
                 a + r * lds + c);
}

// dst[r, c] = x[r, c] · scale[r] over rows × cols (dst may be x); the last partial vector of a
// row by a scalar loop.
void ScaleRows(const float* x, size_t ldx, size_t rows, size_t cols, const float* scale, float* dst,
               size_t ldd) {
  const DF d;
  const size_t L = hn::Lanes(d);
  for (size_t r = 0; r < rows; ++r) {
    const VF f = hn::Set(d, scale[r]);
    const float* src = x + r * ldx;
    float* out = dst + r * ldd;
    size_t c = 0;
    for (; c + L <= cols; c += L) hn::StoreU(hn::Mul(hn::LoadU(d, src + c), f), d, out + c);
    for (; c < cols; ++c) out[c] = src[c] * scale[r];
  }
}

// s ← 1 − (s / cap)²: the derivative of cap·tanh(x / cap), from its value s.
void SoftcapGradTile(float* s, size_t rows, size_t cols, size_t lds, float cap) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const VF inv = hn::Set(d, 1.0f / cap), one = hn::Set(d, 1.0f);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; c += L) {
      const VF t = hn::Mul(hn::LoadU(d, s + r * lds + c), inv);
      hn::StoreU(hn::NegMulAdd(t, t, one), d, s + r * lds + c);
    }
}

// dst[e·ld_dst + c] = scale · src[c·ld_src + e] for c < rows, e < width: rows of keys or values
// transposed for packing (callers pass 16 rows at a time, so that each 4 columns of the source
// fill a cache line of each of 4 rows of dst). Blocks of 4 × 4 go through four 128-bit loads,
// eight shuffles and four stores instead of sixteen scalar loads and stores; the edges are
// scalar. Pure data movement and one multiplication per element, as the scalar loop: the same
// bits. T = uint32_t (bf16 pair words) moves the words unchanged: no multiplication.
template <class T>
void TransposeRowsT(const T* src, size_t ld_src, size_t rows, size_t width, float scale, T* dst,
                    size_t ld_dst) {
  constexpr bool kScale = std::is_same_v<T, float>;
  auto element = [&](T x) -> T {
    if constexpr (kScale) {
      return x * scale;
    } else {
      return x;
    }
  };
  size_t scalar_rows = 0;  // rows from here on are transposed one element at a time
#if !HWY_HAVE_SCALABLE && HWY_TARGET != HWY_SCALAR
  const size_t rows4 = rows / 4 * 4;
  size_t e = 0;
  const hn::FixedTag<T, 4> d4;
  auto scaled = [&](auto v) {
    if constexpr (kScale) {
      return hn::Mul(v, hn::Set(d4, scale));
    } else {
      return v;
    }
  };
  for (; e + 4 <= width; e += 4)
    for (size_t c = 0; c < rows4; c += 4) {
      const T* r = src + c * ld_src + e;
      const auto r0 = hn::LoadU(d4, r), r1 = hn::LoadU(d4, r + ld_src);
      const auto r2 = hn::LoadU(d4, r + 2 * ld_src), r3 = hn::LoadU(d4, r + 3 * ld_src);
      const auto t0 = hn::InterleaveLower(d4, r0, r1), t1 = hn::InterleaveLower(d4, r2, r3);
      const auto t2 = hn::InterleaveUpper(d4, r0, r1), t3 = hn::InterleaveUpper(d4, r2, r3);
      T* o = dst + e * ld_dst + c;
      hn::StoreU(scaled(hn::ConcatLowerLower(d4, t1, t0)), d4, o);
      hn::StoreU(scaled(hn::ConcatUpperUpper(d4, t1, t0)), d4, o + ld_dst);
      hn::StoreU(scaled(hn::ConcatLowerLower(d4, t3, t2)), d4, o + 2 * ld_dst);
      hn::StoreU(scaled(hn::ConcatUpperUpper(d4, t3, t2)), d4, o + 3 * ld_dst);
    }
  for (size_t x = e; x < width; ++x)  // the columns left over, in the rows of whole blocks
    for (size_t c = 0; c < rows4; ++c) dst[x * ld_dst + c] = element(src[c * ld_src + x]);
  scalar_rows = rows4;
#endif
  for (size_t c = scalar_rows; c < rows; ++c)
    for (size_t x = 0; x < width; ++x) dst[x * ld_dst + c] = element(src[c * ld_src + x]);
}

void TransposeRows(const float* src, size_t ld_src, size_t rows, size_t width, float scale,
                   float* dst, size_t ld_dst) {
  TransposeRowsT(src, ld_src, rows, width, scale, dst, ld_dst);
}

void TransposeWords(const uint32_t* src, size_t ld_src, size_t rows, size_t width, uint32_t* dst,
                    size_t ld_dst) {
  TransposeRowsT(src, ld_src, rows, width, 1.0f, dst, ld_dst);
}

// dst[e] = lo[e] | hi[e] << 16 for e < width: two rows of bf16 bits as pair words (the
// reduction's pairs for the tile products, flash_bf16.h). A vector of each row's halfwords is
// widened (vpmovzxwd on AVX-512: 16 words a store of 64 bytes; the loop as written compiled to
// SSE2 shuffles, 8 words and two 16-byte stores a step), the second shifted up and or-ed in. The
// same bits.
void PairRows(const uint16_t* lo, const uint16_t* hi, size_t width, uint32_t* dst) {
  const hn::ScalableTag<uint32_t> d32;
  const hn::Rebind<uint16_t, decltype(d32)> d16;
  const size_t L = hn::Lanes(d32);
  size_t e = 0;
  for (; e + L <= width; e += L) {
    const auto a = hn::PromoteTo(d32, hn::LoadU(d16, lo + e));
    const auto b = hn::PromoteTo(d32, hn::LoadU(d16, hi + e));
    hn::StoreU(hn::Or(a, hn::ShiftLeft<16>(b)), d32, dst + e);
  }
  for (; e < width; ++e) dst[e] = static_cast<uint32_t>(lo[e]) | static_cast<uint32_t>(hi[e]) << 16;
}

size_t FloatLanes() {
  return hn::Lanes(DF());
}

}  // namespace HWY_NAMESPACE
}  // namespace headlight
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
