#include "trainer/optim/muon.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "kernels/ops.h"

namespace llmtrain::trainer {

namespace k = kernels;

MuonSettings muon_settings(const MuonConfig& c) {
  MuonSettings s;
  s.momentum = c.momentum;
  s.nesterov = c.nesterov;
  s.ns_steps = int(c.ns_steps);
  s.ns_coefficients = c.ns_coefficients;
  s.ns_dtype = c.ns_dtype == StateDtype::bf16 ? k::DType::bf16 : k::DType::fp32;
  s.adjust_lr = c.adjust_lr;
  return s;
}

std::vector<MuonMatrix> muon_matrices(const std::vector<ModelParam>& params) {
  std::vector<MuonMatrix> out;
  for (const ModelParam& p : params) {
    switch (p.spec.role) {
      case ParamRole::qkv_weight:  // [3, d, d]: three matrices, split over tp along dimension 1 (rows)
        LT_CHECK(p.shape.size() == 3, "{}: qkv weight of rank {}", p.spec.name, p.shape.size());
        for (int64_t i = 0; i < p.shape[0]; ++i)
          out.push_back({p.offset + i * p.shape[1] * p.shape[2], p.shape[1], p.shape[2],
                         p.shape[1] != p.spec.shape[1] ? 0 : -1, p.spec.shape[1], p.spec.shape[2],
                         int(p.spec.shape[1] / p.shape[1])});
        break;
      case ParamRole::q_weight:
      case ParamRole::k_weight:
      case ParamRole::v_weight:
      case ParamRole::attn_out_weight:
      case ParamRole::mlp_in_weight:
      case ParamRole::mlp_gate_weight:
      case ParamRole::mlp_up_weight:
      case ParamRole::mlp_out_weight:
      case ParamRole::moe_gate_weight:
      case ParamRole::moe_up_weight:
      case ParamRole::moe_down_weight: {
        LT_CHECK(p.shape.size() == 2, "{}: a hidden matrix of rank {}", p.spec.name, p.shape.size());
        const int split = p.shape[0] != p.spec.shape[0] ? 0 : p.shape[1] != p.spec.shape[1] ? 1 : -1;
        out.push_back({p.offset, p.shape[0], p.shape[1], split, p.spec.shape[0], p.spec.shape[1],
                       split < 0 ? 1 : int(p.spec.shape[size_t(split)] / p.shape[size_t(split)])});
        break;
      }
      default:
        break;
    }
  }
  std::sort(out.begin(), out.end(), [](const MuonMatrix& a, const MuonMatrix& b) { return a.begin < b.begin; });
  return out;
}

double muon_adjusted_lr(double lr, int64_t rows, int64_t cols, MuonAdjustLr adjust) {
  const double m = double(rows), n = double(cols);
  if (adjust == MuonAdjustLr::match_rms_adamw) return lr * 0.2 * std::sqrt(std::max(m, n));
  return lr * std::sqrt(std::max(1.0, m / n));
}

size_t MuonWorkspace::bytes() const {
  size_t total = 0;
  for (const k::Buffer* b : {&f32_a_, &f32_b_, &f32_m_, &f32_c_, &x_, &product_, &gram_a_, &gram_b_, &poly_,
                             &f32_gram_a_, &f32_gram_b_, &norm_})
    total += b->bytes();
  return total;
}

int64_t MuonWorkspace::bytes_for(int64_t matrix, int64_t gram, k::DType ns_dtype, k::DType momentum_dtype,
                                 bool sharded) {
  const int64_t ns = int64_t(k::dtype_size(ns_dtype)), wide = ns_dtype == k::DType::fp32 ? 0 : 2;
  const int64_t f32 = 2 + (momentum_dtype == k::DType::fp32 ? 0 : 1) + (sharded ? 1 : 0);
  return matrix * (4 * f32 + 2 * ns) + gram * (3 * ns + 4 * wide) + 4;
}

namespace {
// The largest matrix and the largest Gram matrix (gram_side²) among `matrices`.
std::pair<int64_t, int64_t> largest(const std::vector<MuonMatrix>& matrices) {
  int64_t matrix = 0, gram = 0;
  for (const MuonMatrix& m : matrices) {
    matrix = std::max(matrix, m.numel());
    gram = std::max(gram, m.gram_side() * m.gram_side());
  }
  return {matrix, gram};
}
}  // namespace

void MuonWorkspace::reserve(const std::vector<MuonMatrix>& matrices, k::DType ns_dtype, k::DType momentum_dtype,
                            bool sharded) {
  const auto [matrix, gram] = largest(matrices);
  reserve(matrix, gram, ns_dtype, momentum_dtype, sharded);
}

int64_t muon_workspace_bytes(const std::vector<MuonMatrix>& matrices, k::DType ns_dtype, k::DType momentum_dtype,
                             bool sharded) {
  const auto [matrix, gram] = largest(matrices);
  return matrices.empty() ? 0 : MuonWorkspace::bytes_for(matrix, gram, ns_dtype, momentum_dtype, sharded);
}

void MuonWorkspace::reserve(int64_t matrix, int64_t gram, k::DType ns_dtype, k::DType momentum_dtype, bool sharded) {
  const bool widen_momentum = momentum_dtype != k::DType::fp32 || f32_m_.bytes() > 0;
  if (matrix <= matrix_ && gram <= gram_ && ns_dtype == ns_dtype_ && (!widen_momentum || f32_m_.bytes() > 0) &&
      (!sharded || sharded_))
    return;
  matrix_ = std::max(matrix, matrix_);
  gram_ = std::max(gram, gram_);
  ns_dtype_ = ns_dtype;
  sharded_ = sharded_ || sharded;
  // Released first, so that the peak is the new size (the memory account counts bytes_for).
  for (k::Buffer* b : {&f32_a_, &f32_b_, &f32_m_, &f32_c_, &x_, &product_, &gram_a_, &gram_b_, &poly_, &f32_gram_a_,
                       &f32_gram_b_, &norm_})
    *b = k::Buffer{};
  auto make = [&](k::DType dtype, int64_t n) { return k::Buffer(dtype, {n}, device_, k::MemoryKind::optimizer); };
  f32_a_ = make(k::DType::fp32, matrix_);
  f32_b_ = make(k::DType::fp32, matrix_);
  if (widen_momentum) f32_m_ = make(k::DType::fp32, matrix_);
  if (sharded_) f32_c_ = make(k::DType::fp32, matrix_);
  x_ = make(ns_dtype, matrix_);
  product_ = make(ns_dtype, matrix_);
  gram_a_ = make(ns_dtype, gram_);
  gram_b_ = make(ns_dtype, gram_);
  poly_ = make(ns_dtype, gram_);
  if (ns_dtype != k::DType::fp32) {
    f32_gram_a_ = make(k::DType::fp32, gram_);
    f32_gram_b_ = make(k::DType::fp32, gram_);
  }
  k::fill_zero(poly_.tensor());  // read (not used) as the unneeded weight of a tall matrix's Gram product
  norm_ = make(k::DType::fp32, 1);
}

void newton_schulz(k::Tensor x, const MuonSettings& s, MuonWorkspace& ws, int split, const MuonGroup& group,
                   int blocks) {
  LT_CHECK(x.shape.rank() == 2, "newton_schulz of a {}-D tensor", x.shape.rank());
  const bool shared = split >= 0 && group.tensors != nullptr && group.tensors->size() > 1;
  LT_CHECK(!shared || group.control != nullptr, "newton_schulz of a split matrix without its control group");
  const int size = shared ? group.tensors->size() : 1;
  if (blocks <= 0) blocks = size;
  LT_CHECK(!shared || (blocks <= size && size % blocks == 0), "newton_schulz: {} blocks over {} ranks", blocks, size);
  const float once = float(blocks) / float(size);  // a replicated block's share of each sum (a power of 2)
  const int64_t m = x.shape[0], n = x.shape[1], count = m * n;
  // A[k, k] over the unsplit side: X·Xᵀ (the wide form) when the columns are split or, whole, when
  // m ≤ n; else XᵀX (the tall form).
  const bool wide_form = shared ? split == 1 : m <= n;
  const int64_t side = wide_form ? m : n;
  ws.reserve(count, side * side, x.dtype, ws.f32_m_.bytes() > 0 ? k::DType::bf16 : k::DType::fp32, false);
  float norm = 0;
  k::sum_squares(ws.norm_.tensor(), x);
  k::copy(k::host_tensor(&norm, {1}), ws.norm_.tensor());
  if (shared) {
    group.control->all_reduce(k::host_tensor(&norm, {1}), parallel::ReduceOp::sum);
    norm *= once;
  }
  k::scale(x, float(1.0 / std::max(std::sqrt(double(norm)), s.eps)));
  const auto [a, b, c] = s.ns_coefficients;
  auto square_view = [&](const k::Buffer& buf) { return buf.tensor().flat(0, side * side).view({side, side}); };
  const k::Tensor gram = square_view(ws.gram_a_), square = square_view(ws.gram_b_), poly = square_view(ws.poly_);
  const k::Tensor product = ws.product_.tensor().flat(0, count).view({m, n});
  // The sums a·X + … and b·G + c·G² in fp32, rounded once into the iteration's dtype, as PyTorch's
  // addmm rounds them (in bf16 the products' outputs are bf16: the one rounding more). A split
  // matrix's Gram partials are summed in fp32 too.
  const bool fp32 = x.dtype == k::DType::fp32;
  const k::Tensor gram32 = fp32 ? gram : square_view(ws.f32_gram_a_),
                  square32 = fp32 ? square : square_view(ws.f32_gram_b_);
  const k::Tensor x32 = fp32 ? x.flat(0, count) : ws.f32_a_.tensor().flat(0, count),
                  product32 = fp32 ? product.flat(0, count) : ws.f32_b_.tensor().flat(0, count);
  for (int step = 0; step < s.ns_steps; ++step) {
    if (wide_form) {
      k::linear_forward(gram, x, x, k::Tensor{});  // X·Xᵀ [m, m]
    } else {
      k::fill_zero(gram);  // XᵀX [n, n]: the weight gradient of a linear whose input and output are X
      k::linear_backward(k::Tensor{}, gram, k::Tensor{}, x, x, poly);
    }
    if (shared) {
      if (!fp32) k::convert(gram32, gram);
      group.tensors->all_reduce(gram32, parallel::ReduceOp::sum);
      if (once != 1.0f) k::scale(gram32, once);
      if (!fp32) k::convert(gram, gram32);
    }
    k::linear_forward(square, gram, gram, k::Tensor{});  // the Gram matrix is symmetric: G·Gᵀ = G²
    if (!fp32) {
      k::convert(gram32, gram);
      k::convert(square32, square);
    }
    k::scale(gram32, float(b));
    k::scale(square32, float(c));
    k::residual_forward(fp32 ? poly : gram32, gram32, square32, k::Tensor{});  // b·G + c·G²
    if (!fp32) k::convert(poly, gram32);
    if (wide_form)
      k::linear_backward_input(product, poly, x);  // P·X
    else
      k::linear_forward(product, x, poly, k::Tensor{});  // X·Pᵀ = X·P
    if (!fp32) {
      k::convert(x32, x.flat(0, count));
      k::convert(product32, product.flat(0, count));
    }
    k::scale(x32, float(a));
    k::residual_forward(x32, x32, product32, k::Tensor{});
    if (!fp32) k::convert(x.flat(0, count), x32);
  }
}

// The parts of a step, on the workspace's buffers.
struct MuonSteps {
  static void check(const MuonMatrix& matrix, k::Tensor param, k::Tensor grad, k::Tensor momentum, int64_t piece,
                    const MuonWorkspace& ws) {
    LT_CHECK(param.numel() == piece && param.dtype == k::DType::fp32 &&
                 (momentum.dtype == k::DType::fp32 || momentum.dtype == k::DType::bf16) && grad.numel() == piece &&
                 momentum.numel() == piece,
             "Muon step of {} elements of a [{}, {}] matrix: param {} {}, grad {}, momentum {} {}", piece, matrix.rows,
             matrix.cols, k::to_string(param.dtype), param.numel(), grad.numel(), k::to_string(momentum.dtype),
             momentum.numel());
    LT_CHECK(param.device == ws.device() && grad.device == ws.device() && momentum.device == ws.device(),
             "Muon step: tensors and workspace on different devices");
  }
  // B = μ·B + (1 − μ)·g on a piece, and its update U into `u` (fp32, the piece's size).
  static void momentum(k::Tensor grad, k::Tensor momentum, k::Tensor u, float grad_scale, const MuonSettings& s,
                       MuonWorkspace& ws) {
    const int64_t n = u.numel();
    const float mu = float(s.momentum);
    const k::Tensor g = ws.f32_a_.tensor().flat(0, n);
    k::Tensor buf = momentum.flat(0, n);
    if (momentum.dtype != k::DType::fp32) {
      buf = ws.f32_m_.tensor().flat(0, n);
      k::convert(buf, momentum.flat(0, n));
    }
    k::convert(g, grad.flat(0, n));
    k::scale(g, grad_scale * (1.0f - mu));  // (1 − μ)·g
    k::scale(buf, mu);
    k::residual_forward(buf, buf, g, k::Tensor{});                               // B = μ·B + (1 − μ)·g
    if (momentum.dtype != k::DType::fp32) k::convert(momentum.flat(0, n), buf);  // rounded once
    k::copy(u, buf);
    if (s.nesterov) {
      k::scale(u, mu);
      k::residual_forward(u, u, g, k::Tensor{});  // (1 − μ)·g + μ·B
    }
  }
  // The whole matrix's update (the workspace's f32_b_) orthogonalized, back in place.
  static k::Tensor orthogonalize(const MuonMatrix& matrix, const MuonSettings& s, MuonWorkspace& ws,
                                 const MuonGroup& group) {
    const int64_t count = matrix.numel();
    const k::Tensor u = ws.f32_b_.tensor().flat(0, count), x = ws.x_.tensor().flat(0, count);
    k::convert(x, u);
    newton_schulz(x.view({matrix.rows, matrix.cols}), s, ws, matrix.split, group, matrix.blocks);
    k::convert(u, x);
    return u;
  }
  // W = W·(1 − lr·wd) − lr'·X on a piece; `step` (X's piece, fp32) is scaled in place.
  static void apply(const MuonMatrix& matrix, k::Tensor param, k::Tensor step, double lr, double weight_decay,
                    const MuonSettings& s) {
    const int64_t rows = matrix.global_rows > 0 ? matrix.global_rows : matrix.rows,
                  cols = matrix.global_cols > 0 ? matrix.global_cols : matrix.cols;
    k::scale(step, float(-muon_adjusted_lr(lr, rows, cols, s.adjust_lr)));
    const k::Tensor p = param.flat(0, step.numel());
    if (weight_decay != 0) k::scale(p, float(1.0 - lr * weight_decay));
    k::residual_forward(p, p, step, k::Tensor{});
  }
};

void muon_matrix_step(const MuonMatrix& matrix, k::Tensor param, k::Tensor grad, k::Tensor momentum, double lr,
                      double weight_decay, float grad_scale, const MuonSettings& s, MuonWorkspace& ws,
                      const MuonGroup& group) {
  const int64_t count = matrix.numel(), side = matrix.gram_side();
  MuonSteps::check(matrix, param, grad, momentum, count, ws);
  ws.reserve(count, side * side, s.ns_dtype, momentum.dtype, false);
  MuonSteps::momentum(grad, momentum, ws.f32_b_.tensor().flat(0, count), grad_scale, s, ws);
  MuonSteps::apply(matrix, param, MuonSteps::orthogonalize(matrix, s, ws, group), lr, weight_decay, s);
}

namespace {
constexpr int kMuonTag = 32001;  // the pieces' point-to-point transfers, clear of the group's others
}

void muon_sharded_step(const std::vector<MuonPiece>& batch, parallel::Comm& shards, double lr, double weight_decay,
                       float grad_scale, const MuonSettings& s, MuonWorkspace& ws, const MuonGroup& group) {
  const int me = shards.rank(), size = shards.size();
  LT_CHECK(int(batch.size()) <= size, "{} Muon matrices for a shard group of {}", batch.size(), size);
  for (const MuonPiece& b : batch) {
    LT_CHECK(b.matrix != nullptr && int(b.pieces.size()) == size, "a Muon piece of {} ranks' for a shard group of {}",
             b.pieces.size(), size);
    int64_t at = 0;
    for (const parallel::FlatRange& r : b.pieces) {
      LT_CHECK(r.numel() == 0 || r.begin == at, "Muon pieces of a [{}, {}] matrix out of order at {}", b.matrix->rows,
               b.matrix->cols, r.begin);
      at += r.numel();
    }
    LT_CHECK(at == b.matrix->numel(), "Muon pieces cover {} of a [{}, {}] matrix", at, b.matrix->rows, b.matrix->cols);
    const int64_t mine = b.pieces[size_t(me)].numel(), side = b.matrix->gram_side();
    if (mine > 0) MuonSteps::check(*b.matrix, b.param, b.grad, b.momentum, mine, ws);
    ws.reserve(b.matrix->numel(), side * side, s.ns_dtype, mine > 0 ? b.momentum.dtype : k::DType::fp32, true);
  }
  auto exchange = [&](std::vector<parallel::Transfer> transfers) {
    if (!transfers.empty()) shards.exchange_async(std::move(transfers))->wait();
  };
  using Kind = parallel::Transfer::Kind;
  // Each matrix's update gathered on its owner, one matrix after another (every rank in the same order).
  for (size_t j = 0; j < batch.size(); ++j) {
    const MuonPiece& b = batch[j];
    const parallel::FlatRange own = b.pieces[size_t(me)];
    if (int(j) == me) {
      const k::Tensor u = ws.f32_b_.tensor();
      if (own.numel() > 0) MuonSteps::momentum(b.grad, b.momentum, u.flat(own.begin, own.numel()), grad_scale, s, ws);
      std::vector<parallel::Transfer> from;
      for (int q = 0; q < size; ++q)
        if (q != me && b.pieces[size_t(q)].numel() > 0)
          from.push_back({Kind::recv, u.flat(b.pieces[size_t(q)].begin, b.pieces[size_t(q)].numel()), q, kMuonTag});
      exchange(std::move(from));
    } else if (own.numel() > 0) {
      const k::Tensor piece = ws.f32_c_.tensor().flat(0, own.numel());
      MuonSteps::momentum(b.grad, b.momentum, piece, grad_scale, s, ws);
      exchange({{Kind::send, piece, int(j), kMuonTag}});
    }
  }
  // Every owner's matrix at once (a tensor-parallel block with its tp peers, the same matrix's owners).
  if (me < int(batch.size())) MuonSteps::orthogonalize(*batch[size_t(me)].matrix, s, ws, group);
  // Each rank's piece of each result back from its owner, and applied.
  for (size_t j = 0; j < batch.size(); ++j) {
    const MuonPiece& b = batch[j];
    const parallel::FlatRange own = b.pieces[size_t(me)];
    if (int(j) == me) {
      const k::Tensor u = ws.f32_b_.tensor();
      std::vector<parallel::Transfer> to;
      for (int q = 0; q < size; ++q)
        if (q != me && b.pieces[size_t(q)].numel() > 0)
          to.push_back({Kind::send, u.flat(b.pieces[size_t(q)].begin, b.pieces[size_t(q)].numel()), q, kMuonTag});
      exchange(std::move(to));
      if (own.numel() > 0) MuonSteps::apply(*b.matrix, b.param, u.flat(own.begin, own.numel()), lr, weight_decay, s);
    } else if (own.numel() > 0) {
      const k::Tensor piece = ws.f32_c_.tensor().flat(0, own.numel());
      exchange({{Kind::recv, piece, int(j), kMuonTag}});
      MuonSteps::apply(*b.matrix, b.param, piece, lr, weight_decay, s);
    }
  }
}

}  // namespace llmtrain::trainer
