// Fused optimizer math, per row and per column. The host backend runs apply_row; a CUDA warp
// runs the same pieces with lane l owning columns l, l+32, ... (see cuda/backend). Sums over
// a row (row-wise Adagrad) use one fixed order on both: 32 lane partials, then a butterfly.
#pragma once

#include <type_traits>

#include "cuda/row/hd.h"

namespace embstore::row {

enum class OptKind : uint32_t { kSgd = 0, kAdagrad = 1, kRowwiseAdagrad = 2, kAdam = 3 };

struct OptParams {
  OptKind kind;
  float lr, eps, beta1, beta2, weight_decay, initial_accumulator;
};

inline constexpr uint32_t kLanes = 32;

// State layout after the row's value:
//   Adagrad: acc[dim]; row-wise Adagrad: acc; Adam: m[dim], v[dim], beta1^t, beta2^t.
// Adam keeps the bias-correction powers per row (a sparse row's own step count) and updates
// them by multiplication, so no pow() is needed.
EMBSTORE_HD uint32_t state_dim(OptKind kind, uint32_t dim) {
  switch (kind) {
    case OptKind::kSgd:
      return 0;
    case OptKind::kAdagrad:
      return dim;
    case OptKind::kRowwiseAdagrad:
      return 1;
    case OptKind::kAdam:
      return 2 * dim + 2;
  }
  return 0;
}

// Initial value of state element i of a new row.
EMBSTORE_HD float initial_state(const OptParams& p, uint32_t dim, uint32_t i) {
  switch (p.kind) {
    case OptKind::kAdagrad:
    case OptKind::kRowwiseAdagrad:
      return p.initial_accumulator;
    case OptKind::kAdam:
      return i >= 2 * dim ? 1.0f : 0.0f;
    default:
      return 0.0f;
  }
}

// True when a new row's state is all zero bits (memory that is already zero needs no write).
EMBSTORE_HD bool initial_state_is_zero(const OptParams& p) {
  switch (p.kind) {
    case OptKind::kSgd:
      return true;
    case OptKind::kAdagrad:
    case OptKind::kRowwiseAdagrad:
      return bit_cast<uint32_t>(p.initial_accumulator) == 0;
    case OptKind::kAdam:
      return false;
  }
  return false;
}

// A new row's whole state; the layout is resolved once, outside the loops (host backend).
EMBSTORE_HD void init_state(const OptParams& p, uint32_t dim, float* state) {
  const uint32_t n = state_dim(p.kind, dim);
  const uint32_t zeros = p.kind == OptKind::kAdam ? 2 * dim : 0;
  for (uint32_t i = 0; i < zeros; ++i) state[i] = 0.0f;
  for (uint32_t i = zeros; i < n; ++i) state[i] = initial_state(p, dim, zeros);
}

// The gradient the optimizer sees: L2 weight decay folded in.
EMBSTORE_HD float effective_grad(const OptParams& p, float g, float w) {
  return p.weight_decay == 0.0f ? g : g + p.weight_decay * w;
}

// Row-level scalars, computed before any column of the row is written.
struct RowScalars {
  float a, b, c, d;
};

// sum_sq: the butterfly-reduced sum of effective_grad^2 over the row (row-wise Adagrad only).
EMBSTORE_HD RowScalars begin_row(const OptParams& p, uint32_t dim, const float* state,
                                 float sum_sq) {
  RowScalars rs{0.0f, 0.0f, 0.0f, 0.0f};
  if (p.kind == OptKind::kRowwiseAdagrad) {
    rs.a = state[0] + sum_sq / static_cast<float>(dim);  // new accumulator
    rs.b = sqrt_rn(rs.a) + p.eps;                        // shared denominator
  } else if (p.kind == OptKind::kAdam) {
    rs.a = state[2 * dim] * p.beta1;      // beta1^t
    rs.b = state[2 * dim + 1] * p.beta2;  // beta2^t
    rs.c = 1.0f - rs.a;
    rs.d = 1.0f - rs.b;
  }
  return rs;
}

// Updates column c of the row; g is the effective gradient. Templated on the optimizer so
// the per-column loops carry no branch; update_column dispatches at run time.
template <OptKind Kind>
EMBSTORE_HD void update_column_k(const OptParams& p, const RowScalars& rs, uint32_t dim, uint32_t c,
                                 float g, float* value, float* state) {
  if constexpr (Kind == OptKind::kSgd) {
    value[c] = value[c] - p.lr * g;
  } else if constexpr (Kind == OptKind::kAdagrad) {
    const float acc = state[c] + g * g;
    state[c] = acc;
    value[c] = value[c] - p.lr * g / (sqrt_rn(acc) + p.eps);
  } else if constexpr (Kind == OptKind::kRowwiseAdagrad) {
    value[c] = value[c] - p.lr * g / rs.b;
  } else {
    const float m = p.beta1 * state[c] + (1.0f - p.beta1) * g;
    const float v = p.beta2 * state[dim + c] + (1.0f - p.beta2) * (g * g);
    state[c] = m;
    state[dim + c] = v;
    const float m_hat = m / rs.c;
    const float v_hat = v / rs.d;
    value[c] = value[c] - p.lr * m_hat / (sqrt_rn(v_hat) + p.eps);
  }
}

EMBSTORE_HD void update_column(const OptParams& p, const RowScalars& rs, uint32_t dim, uint32_t c,
                               float g, float* value, float* state) {
  switch (p.kind) {
    case OptKind::kSgd:
      return update_column_k<OptKind::kSgd>(p, rs, dim, c, g, value, state);
    case OptKind::kAdagrad:
      return update_column_k<OptKind::kAdagrad>(p, rs, dim, c, g, value, state);
    case OptKind::kRowwiseAdagrad:
      return update_column_k<OptKind::kRowwiseAdagrad>(p, rs, dim, c, g, value, state);
    case OptKind::kAdam:
      return update_column_k<OptKind::kAdam>(p, rs, dim, c, g, value, state);
  }
}

// Writes the row-level state; after every column is done (lane 0 on CUDA).
EMBSTORE_HD void end_row(const OptParams& p, const RowScalars& rs, uint32_t dim, float* state) {
  if (p.kind == OptKind::kRowwiseAdagrad) {
    state[0] = rs.a;
  } else if (p.kind == OptKind::kAdam) {
    state[2 * dim] = rs.a;
    state[2 * dim + 1] = rs.b;
  }
}

// Lane l's share of sum(effective_grad^2): columns l, l+32, ... in increasing order. grad(c)
// gives column c of the row's summed gradient (the CUDA kernel sums duplicates on the fly).
template <typename GradAt>
EMBSTORE_HD float lane_sum_sq_at(const OptParams& p, uint32_t dim, uint32_t lane, GradAt grad,
                                 const float* value) {
  float s = 0.0f;
  for (uint32_t c = lane; c < dim; c += kLanes) {
    const float e = effective_grad(p, grad(c), value[c]);
    s = s + e * e;
  }
  return s;
}

EMBSTORE_HD float lane_sum_sq(const OptParams& p, uint32_t dim, uint32_t lane, const float* g,
                              const float* value) {
  return lane_sum_sq_at(
      p, dim, lane, [g](uint32_t c) { return g[c]; }, value);
}

// The host form of a warp's xor butterfly: the same additions in the same grouping, so every
// lane's result equals partial[0] here.
EMBSTORE_HD float butterfly_sum(float (&partial)[kLanes]) {
  for (uint32_t stride = kLanes / 2; stride > 0; stride /= 2) {
    for (uint32_t l = 0; l < stride; ++l) partial[l] = partial[l] + partial[l + stride];
  }
  return partial[0];
}

// Calls f(std::integral_constant<OptKind, K>{}) for the run-time kind, so callers pick a
// template instantiation once per batch (host loops, CUDA launches).
template <typename F>
decltype(auto) dispatch_opt(OptKind kind, F&& f) {
  switch (kind) {
    case OptKind::kSgd:
      return f(std::integral_constant<OptKind, OptKind::kSgd>{});
    case OptKind::kAdagrad:
      return f(std::integral_constant<OptKind, OptKind::kAdagrad>{});
    case OptKind::kRowwiseAdagrad:
      return f(std::integral_constant<OptKind, OptKind::kRowwiseAdagrad>{});
    case OptKind::kAdam:
      break;
  }
  return f(std::integral_constant<OptKind, OptKind::kAdam>{});
}

// One fused update of a row whose summed gradient is g (host backend).
template <OptKind Kind>
EMBSTORE_HD void apply_row(const OptParams& p, uint32_t dim, float* value, float* state,
                           const float* g) {
  float sum_sq = 0.0f;
  if constexpr (Kind == OptKind::kRowwiseAdagrad) {
    float partial[kLanes];
    for (uint32_t l = 0; l < kLanes; ++l) partial[l] = lane_sum_sq(p, dim, l, g, value);
    sum_sq = butterfly_sum(partial);
  }
  const RowScalars rs = begin_row(p, dim, state, sum_sq);
  for (uint32_t c = 0; c < dim; ++c) {
    update_column_k<Kind>(p, rs, dim, c, effective_grad(p, g[c], value[c]), value, state);
  }
  end_row(p, rs, dim, state);
}

}  // namespace embstore::row
