// The bf16 tiles of the fused attention kernels: the two products of a tile with bf16 operands and
// fp32 accumulation, and the rounding of probabilities to bf16 between them.
//
// Layout. The products reduce over pairs of adjacent elements (AVX-512 BF16's vdpbf16ps computes,
// per fp32 lane, acc + a₀·b₀ + a₁·b₁), so both right-hand operands are packed as pairs, one pair
// per 32-bit word, and every left-hand row is read a pair (one 32-bit word) at a time:
//   S = Q·Kᵀ   Q rows [rows, pairs] words (head dim e = 2·e2, 2·e2 + 1), Kᵀ packed [pairs, ldk]
//              words: word (e2, c) = (k[c, 2·e2], k[c, 2·e2 + 1]);
//   O += P·V   P rows [rows, pairs] words (keys 2·c2, 2·c2 + 1), V packed [pairs, ldv] words:
//              word (c2, x) = (v[2·c2, x], v[2·c2 + 1, x]).
// Odd head dims and key counts are padded with zeros. The native path (vdpbf16ps, on CPUs with
// AVX-512 BF16, in flash_bf16_avx512.cc) and the portable path (every Highway target: each word
// widened to two floats by shifts, two FMAs; flash_bf16-inl.h) read the same layout and compute
// the same sums up to fp32 summation order. vdpbf16ps treats bf16 denormals (below 1.2·10⁻³⁸) as
// zero; the portable path keeps them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "headlight/core/bf16.h"

namespace headlight::attention::cpu::kernels {

// Whether the native path runs: the CPU has AVX-512 BF16 and HEADLIGHT_ISA does not restrict the
// targets (HEADLIGHT_ISA=avx3 keeps AVX-512 but takes the portable bf16 path).
bool bf16_native();

// s[rows, cols] = scale · q · Kᵀ: q [rows, pairs] words (leading dim ldq words), kt packed
// [pairs, ldk] words; cols a multiple of 16.
void qk_tile_bf16(const uint32_t* q, size_t ldq, size_t rows, const uint32_t* kt, size_t ldk,
                  size_t pairs, size_t cols, float scale, float* s, size_t lds);

// o[rows, width] = α ⊙ o + p · V: p [rows, pairs] words (leading dim ldp words), v packed
// [pairs, ldv] words; width a multiple of 16; α = 1 when null.
void pv_tile_bf16(const uint32_t* p, size_t ldp, size_t rows, size_t pairs, const uint32_t* v,
                  size_t ldv, size_t width, float* o, size_t ldo, const float* alpha);

// dst[r, c] = to_bf16(s[r, c]) for c < cols (a multiple of 16), round to nearest even.
void round_tile_bf16(const float* s, size_t lds, size_t rows, size_t cols, bf16* dst, size_t ldd);

// The native loops (flash_bf16_avx512.cc); only called when bf16_native().
namespace native {
void qk_tile_bf16(const uint32_t* q, size_t ldq, size_t rows, const uint32_t* kt, size_t ldk,
                  size_t pairs, size_t cols, float scale, float* s, size_t lds);
void pv_tile_bf16(const uint32_t* p, size_t ldp, size_t rows, size_t pairs, const uint32_t* v,
                  size_t ldv, size_t width, float* o, size_t ldo, const float* alpha);
void round_tile_bf16(const float* s, size_t lds, size_t rows, size_t cols, bf16* dst, size_t ldd);
// dst[r, c] = to_bf16(x[r, c] · scale[r]) for c < width, with to_bf16's exact bits (a block of
// 32 products that holds a denormal goes through the scalar definition, as core's to_bf16 does):
// the forward's bf16 output rows, scaled by 1 / l and rounded in one pass.
void scale_round_rows(const float* x, size_t ldx, size_t rows, size_t width, const float* scale,
                      bf16* dst, size_t ldd);
// The online softmax of both bf16 engines, AMX's and vdpbf16ps's (flash_kernels.h's softmax_rows
// with SoftmaxExtras{.scale, .pb} and no statistics; m, l [rows, 16] and α laid out alike), on
// AVX-512 with vreduceps, vscalefps and vcvtne2ps2bf16: about half the instructions of the portable
// loop. cols a multiple of 16. Needs AVX-512 BF16, which every CPU with AMX has. With row_cols, row
// r's scores at and past column row_cols[r] are taken as −inf without being read (a causal
// diagonal's structural mask: no mask pass, and no exponentials past the limit).
//
// The reference maximum is lazy (FlashAttention-4's conditional rescaling): a row keeps the
// maximum it has (m, α = 1) and takes one (that of its first kReferenceKeys keys) only when it
// has none yet, so no pass over the scores is spent on maxima, and O is rarely rescaled. P against
// a stale maximum may exceed 1; while every lane's sum stays within kLazyBound (so every P does,
// 2^16: scores up to 11 above the reference) nothing overflows, and past it the row is computed
// again against its true maximum. The result is the same softmax (m + ln l is the log-sum-exp
// either way); only where P is rounded to bf16 differs, by a factor that is not a power of two.
//
// With lr ([rows, 16], laid out as l), the sums of P as rounded to bf16 are kept beside l's: the
// output is then normalised by what P·V actually weighed (Σ rounded P), so that the weights it
// applies sum to 1 and a row's largest weight, whose rounding would otherwise pass into the
// output whole, keeps its rounding to itself; l still gives the log-sum-exp.
void softmax_rows(float* s, size_t rows, size_t cols, size_t lds, float* m, float* l, float* alpha,
                  float scale, bf16* pb, size_t ldpb, const int32_t* row_cols = nullptr,
                  float* lr = nullptr);
// out[r] = the sum of the 16 lanes of l's row r (l [rows, 16], as softmax_rows leaves l and lr),
// eight rows side by side (SumEight), every row's lanes added in the same order wherever it lies.
void lane_sums(const float* l, size_t rows, float* out);
constexpr float kLazyBound = 65536.0f;
// A row without a reference maximum takes the maximum of its first kReferenceKeys keys in the
// tile (of all its keys there when those are all masked): a 2 × 2 block of AMX tiles' worth, so
// that amx::qk_exp_tile can take it from the block it has just computed.
constexpr size_t kReferenceKeys = 32;
// After amx::qk_exp_tile: when every row r < rows has a sum (sums [rows, 16]) with no NaN and no
// lane past kLazyBound, l[r] += it, m[r] = m_new[r] and α[r] = 1, and with lr the sums of the rows
// of P as rounded (pb [rows, ldpb], cols a multiple of 16) added to lr[r], exactly as
// softmax_rows would leave them, and returns true; else changes nothing and returns false (the
// tile then goes through softmax_rows from its scores).
bool commit_tile_sums(const float* sums, const float* m_new, size_t rows, float* m, float* l,
                      float* alpha, const bf16* pb, size_t ldpb, size_t cols, float* lr);
// x [rows, cols] fp32 (leading dim ldx) rounded to bf16 (vcvtneps2bf16: nearest even, denormals
// to zero, as the products read them anyway) into row pairs dst [rows_pad / 2, ld] words: word
// (i, c) = (x[2i, c], x[2i + 1, c]); rows past `rows` are zero; cols a multiple of 16.
void row_pairs(const float* x, size_t ldx, size_t rows, size_t rows_pad, size_t cols, uint32_t* dst,
               size_t ld);
// kernels::exp_shift_rows (P from the saved log-sum-exp, the same rows, 0 and NaN rows) with the
// softmax's seven-instruction 2^t: relative error < 3.5·10⁻⁶, for the bf16 backward, whose every
// use of P is rounded to bf16 (2⁻⁹) after it. cols a multiple of 16.
// With row_cols, row r's scores at and past column row_cols[r] are taken as −inf (P = 0 there),
// as softmax_rows takes them.
void exp_shift_rows(float* s, size_t rows, size_t cols, size_t lds, const float* lse,
                    const int32_t* row_cols = nullptr);
// What decode's scores prefetch into L2 (v null: nothing): the key rows kDecodeAhead keys ahead
// and value row c (v + c·ldv, width elements) as they score key c. For rows that are not
// contiguous (a position-major cache: rows of every head interleaved), which the hardware
// prefetchers follow poorly; contiguous rows are read faster without (flash_dot-inl.h).
struct DecodeAhead {
  const bf16* v = nullptr;
  size_t ldv = 0, width = 0;
};
constexpr size_t kDecodeAhead = 32;
// The AMX decode's prefetches (amx::blocked_scores) touch one line a page and leave the page's
// other lines to the hardware prefetchers (which start a stream per 4 KB page): a software
// prefetch holds one of the core's line fill buffers until its line arrives, 16 lines in flight a
// core on Sapphire Rapids, about 10 GB/s at its latency. 32 heads over 8, D = 128, 4,096 keys:
// every key line and a quarter of the values' lines 0.87–0.92 ms (0.74–0.79 of the copies' read),
// a line a page of both 0.80–0.86 ms (0.80–0.86), 4 alternating rounds; then 0.83–0.88 against
// 0.76–0.80. The vdpbf16ps loops (one row a key/value head), with more arithmetic a line, keep
// every key line: 32 heads over 32, D = 128, 2.96–3.01 ms with them, 3.11–3.15 a line a page.
constexpr size_t kPageBytes = 4096;
// Decode's scores from a bf16 KV cache read in place: s[r, c] = scale · q[r] · k[c], r < rows,
// c < cols (any), with q's and k's rows read as pair words where they lie (a row's natural layout
// pairs elements 2·e2 and 2·e2 + 1, as vdpbf16ps multiplies them: no packing); leading dims ldq
// and ldk words; pairs (D / 2) a multiple of 16, at most 64 (D = 32, 64, 96, 128).
void decode_scores_bf16(const uint32_t* q, size_t ldq, size_t rows, const uint32_t* k, size_t ldk,
                        size_t pairs, size_t cols, float scale, float* s, size_t lds,
                        const DecodeAhead& ahead = {});
// Decode's P·V from a bf16 KV cache read in place: o[rows, width] = α ⊙ o + P · V, with P the
// rounded probabilities as pair words [rows, ldp words] (keys 2·c2 and 2·c2 + 1; a word past the
// last key holds 0 in its upper half) and V's rows where they lie (leading dim ldv elements); any
// cols; width (Dv) a multiple of 32, at most 128. α = 1 when
// null.
void decode_pv_bf16(const uint32_t* p, size_t ldp, size_t rows, size_t cols, const bf16* v,
                    size_t ldv, size_t width, float* o, size_t ldo, const float* alpha);
// Decode's scores from a blocked key region k (attention/kv_layout.h): s[r, c] = scale · q[r] ·
// k[j0 + c] for r < rows and c < cols rounded up to 16 (the lanes past cols are the group's other
// keys, to be masked), q as pair words (leading dim ldq words), pairs = D / 2 a multiple of 16;
// j0 a multiple of 16. With v (the head's blocked value region, width = Dv), the key lines
// kDecodeAhead keys on and the first quarter of the tile's value lines are prefetched into L2 as
// the keys are scored (Plan::prefetch_rows; amx::blocked_scores prefetches a line a page).
void blocked_scores_bf16(const uint32_t* q, size_t ldq, size_t rows, const uint32_t* k,
                         size_t pairs, size_t j0, size_t cols, float scale, float* s, size_t lds,
                         const uint32_t* v = nullptr, size_t width = 0);
// Decode's P·V from a blocked value region v: o[rows, width] = α ⊙ o + P · V[j0, j0 + cols), P as
// pair words [rows, ldp words] from column 0 = key j0 (a word past the last key holds 0 in its
// upper half); width a multiple of 32; j0 a multiple of 256. α = 1 when null.
void blocked_pv_bf16(const uint32_t* p, size_t ldp, size_t rows, size_t j0, size_t cols,
                     const uint32_t* v, size_t width, float* o, size_t ldo, const float* alpha);
}  // namespace native

// The AMX tiles (flash_bf16_amx.cc): rows a multiple of 16, pairs a multiple of 16 (32 elements
// of the reduction), cols and width multiples of 16; p's rows are bf16 (leading dim ldp elements).
// The calling thread must have configured its tiles (amx_configure_tiles in core/cpu_info.h).
namespace amx {
// AMX tiles usable here, and HEADLIGHT_ISA does not restrict the targets.
bool available();
void qk_tile(const uint32_t* q, size_t ldq, size_t rows, const uint32_t* kt, size_t ldk,
             size_t pairs, size_t cols, float scale, float* s, size_t lds);
void pv_tile(const bf16* p, size_t ldp, size_t rows, size_t pairs, const uint32_t* v, size_t ldv,
             size_t width, float* o, size_t ldo, const float* alpha);
// A tile's scores and their exponentials in one pass, for a tile without masks: each 2 × 2 block
// of scores (32 rows × 32 keys, qk_tile's raw scores) is stored into a buffer that stays in L1 and
// exponentiated at once, P = 2^(s·scale·log2 e − m·log2 e) rounded to bf16 into p [rows, ldp], and
// each row's sum of P per lane into sums [rows, 16]. m is each row's reference maximum
// (native::softmax_rows's); a row without one (−inf) takes the maximum of its first
// kReferenceKeys scores, its first block's, into m_new [rows] (the others copy m). The P, sums
// and maxima of native::softmax_rows, bit for bit, without the scores' round trip through L2
// (their tile stores into the 128 KiB score tile cost more than the products at D = 64).
// native::commit_tile_sums then adds the sums, or says that a row needs softmax_rows (a NaN, or a
// sum past kLazyBound). Rows at most kMaxQkExpRows, run as whole tiles
// of 16: q, p and sums hold rows up to `rows` rounded up to 16 (those past it are junk, never
// read; m is read only below `rows`). cols a multiple of 64.
void qk_exp_tile(const uint32_t* q, size_t ldq, size_t rows, const uint32_t* kt, size_t ldk,
                 size_t pairs, size_t cols, float scale, const float* m, float* m_new, bf16* p,
                 size_t ldp, float* sums);
constexpr size_t kMaxQkExpRows = 256;
// c[rows, cols] = (or += with accumulate) a · b: a bf16 rows [rows, 32·steps] (leading dim lda
// elements), b pair words [16·steps, ldb]; rows and cols multiples of 16.
void product(const bf16* a, size_t lda, size_t rows, const uint32_t* b, size_t ldb, size_t steps,
             size_t cols, float* c, size_t ldc, bool accumulate);
// Decode from a blocked cache (attention/kv_layout.h) on the tiles, native::blocked_scores_bf16
// and blocked_pv_bf16's contracts (prefetching a line a page, kPageBytes) with these differences:
// the tiles read and write whole blocks of 16 rows, so q, s, p and o hold rows up to `rows` rounded
// up to 16 (those past `rows` are junk, never read); p is bf16 rows (leading dim ldp elements),
// zero from key cols up to cols rounded up to 32; spare is kBlockedSpareWords of scratch.
void blocked_scores(const uint32_t* q, size_t ldq, size_t rows, const uint32_t* k, size_t pairs,
                    size_t j0, size_t cols, float scale, float* s, size_t lds,
                    const uint32_t* v = nullptr, size_t width = 0);
void blocked_pv(const bf16* p, size_t ldp, size_t rows, size_t j0, size_t cols, const uint32_t* v,
                size_t width, float* o, size_t ldo, const float* alpha, uint32_t* spare);
// blocked_pv's spare: one step's value pairs, 16 key pairs × at most 64 words.
constexpr size_t kBlockedSpareWords = 16 * 64;
// Decode from bf16 rows where they lie (a row-layout cache; native::decode_scores_bf16 and
// decode_pv_bf16 on vdpbf16ps), on the tiles: the scores as Sᵀ = K · Qᵀ with the key rows as A
// tiles, P·V with the value rows as B tiles (flash_bf16_amx.cc). rows_scores: s[r, c] = scale ·
// q[r] · k[c] for r < rows (any) and c < cols rounded up to 16 (the lanes past cols: 0, to be
// masked), q and k as pair words (leading dims ldq and ldk words), pairs = D / 2 a multiple of
// 16, at most 64. With ahead.v (the value rows of the same keys), the key rows kDecodeAhead keys
// on and the value rows are prefetched into L2 as the keys are scored: a line a page
// (kPageBytes), or with every_line each line of each row.
void rows_scores(const uint32_t* q, size_t ldq, size_t rows, const uint32_t* k, size_t ldk,
                 size_t pairs, size_t cols, float scale, float* s, size_t lds,
                 const native::DecodeAhead& ahead = {}, bool every_line = false);
// rows_pv: o = α ⊙ o + P · V[0, cols) for rows up to `rows` rounded up to 16 (those past `rows`
// are junk, never read), P bf16 rows [rows, ldp elements] (read up to cols), V's rows where they
// lie (leading dim ldv elements), width (Dv) 32, 64, 96 or 128. o holds each 32 outputs as their
// 16 even then their 16 odd ones, from zeros or earlier rows_pv calls; rows_order then puts each
// row's outputs in order.
void rows_pv(const bf16* p, size_t ldp, size_t rows, size_t cols, const bf16* v, size_t ldv,
             size_t width, float* o, size_t ldo, const float* alpha);
void rows_order(float* o, size_t ldo, size_t rows, size_t width);
// One tile of the bf16 backward on AMX, its scores in one pass (flash_backward_bf16_amx.cc), for
// a tile without dropout, soft-cap or element masks: P = exp(scale · q · ktᵀ − lse) (the bits of
// native::exp_shift_rows) for keys below the row's limit (limits[r] capped at cols, or `keys` for
// every row when limits is null), 0 past it, a row with lse −inf all 0 and one with lse NaN NaN
// below cols; dS = P ⊙ (dout · vtᵀ − dot[r]) (softmax_grad_tile's bits), 0 in rows past `rows`
// and keys past cols. Rows run in whole tiles of 16 (q and dout zero past `rows`), keys in blocks
// of 32 up to cols rounded up to 32 (kt and vt zero past their keys).
struct BackwardTile {
  const uint32_t* q;     // [rows, ldq] query pair words
  const uint32_t* dout;  // [rows, ldd] output-gradient pair words
  size_t ldq, ldd, rows;
  const uint32_t* kt;                 // Kᵀ pair words [q_pairs, ldk]
  const uint32_t* vt;                 // Vᵀ pair words [v_pairs, ldv]
  size_t ldk, ldv, q_pairs, v_pairs;  // pairs: multiples of 16
  size_t cols;                        // the tile's columns, padded to 16
  size_t keys;                        // every row's limit when limits is null
  const int32_t* limits;              // [rows] or null
  float scale;
  const float* lse;  // [rows]
  const float* dot;  // [rows] δ = rowsum(dO ⊙ O)
  // Out: P and dS rounded to bf16 as row pairs (native::row_pairs' words) [rows rounded to 32 /
  // 2, ldw], and dS as bf16 rows [rows rounded to 16, ldds], keys up to cols rounded to 32.
  uint32_t* p_pairs;
  uint32_t* ds_pairs;
  size_t ldw;
  bf16* ds;
  size_t ldds;
};
void backward_tile(const BackwardTile& t);
}  // namespace amx

}  // namespace headlight::attention::cpu::kernels
