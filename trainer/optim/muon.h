// Muon's update of one whole 2-D matrix (Jordan et al. 2024; PyTorch's torch.optim.Muon): the
// momentum, the quintic Newton–Schulz orthogonalization and the shape-adjusted step, built from
// the kernel table's ops, so that the products run where the matrix lives (the CPU's GEMMs, or
// cuBLASLt on a device, the simulator's model of it included) and nothing here is backend code.
//
// One step of a matrix W [m, n] with gradient g, momentum buffer B (zero at the start), as
// torch.optim.Muon takes it:
//   B = μ·B + (1 − μ)·g                      (torch: B.lerp_(g, 1 − μ))
//   U = nesterov ? (1 − μ)·g + μ·B : B        (torch: g.lerp(B, μ))
//   X = U / max(‖U‖_F, eps)  in ns_dtype (bf16 as PyTorch, or fp32)
//   ns_steps times: A = X·Xᵀ;  X = a·X + (b·A + c·A²)·X
//   W = W·(1 − lr·wd) − lr'·X,   lr' = lr·√max(1, m / n) (adjust_lr original)
//                                    or lr·0.2·√max(m, n) (match_rms_adamw, Moonshot's)
// Rules a reader could get wrong:
//  - PyTorch transposes a tall matrix (m > n) so that the Gram matrix is the small one; here a tall
//    X iterates as X = a·X + X·(b·G + c·G²) with G = XᵀX, the same polynomial ((XXᵀ)ᵏX = X(XᵀX)ᵏ)
//    without a transpose.
//  - The decay uses the unadjusted lr, as PyTorch's does; only the orthogonalized step is scaled.
//  - The Frobenius norm is summed in double and read back to the host: one synchronization per
//    matrix and step on a device.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "common/recipe/recipe.h"
#include "kernels/buffer.h"
#include "kernels/tensor.h"
#include "parallel/comm/comm.h"
#include "trainer/model/model.h"

namespace llmtrain::trainer {

struct MuonSettings {
  double momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;
  std::array<double, 3> ns_coefficients = {3.4445, -4.7750, 2.0315};  // torch.optim.Muon's defaults
  kernels::DType ns_dtype = kernels::DType::bf16;                     // bf16 or fp32
  MuonAdjustLr adjust_lr = MuonAdjustLr::original;
  double eps = 1e-7;
};

MuonSettings muon_settings(const MuonConfig& config);

// A matrix Muon updates: [rows, cols] at flat offset `begin` of the parameter buffer.
// Under tensor parallelism (split 0: its rows over the tp group, 1: its columns) the local block
// of a [global_rows, global_cols] matrix.
struct MuonMatrix {
  int64_t begin = 0, rows = 0, cols = 0;
  int split = -1;
  int64_t global_rows = 0, global_cols = 0;
  // The distinct blocks along the split (tp, or fewer where blocks are replicated: key/value heads
  // when tp exceeds kv_heads, each held by tp / blocks ranks).
  int blocks = 1;
  int64_t numel() const { return rows * cols; }
  // The side of the Gram matrix its iteration forms: the unsplit dimension (the sums over the split
  // one are all-reduced), else the smaller one.
  int64_t gram_side() const { return split == 0 ? cols : split == 1 ? rows : std::min(rows, cols); }
};

// Where a split matrix's partial sums are reduced: its Gram matrices over `tensors` (the tp group's
// device communicator), its squared norm over `control` (the tp group's host one). Null: whole.
struct MuonGroup {
  parallel::Comm* tensors = nullptr;
  parallel::Comm* control = nullptr;
};
// The hidden matrices among `params` (this rank's shards; replicated key/value heads whole), in flat order: the
// attention's query, key, value and output weights (GPT-2's fused [3, d, d] c_attn as its three [d, d] matrices, as
// Megatron-Core's Muon splits QKV), the MLP's and every expert's weights, a shared expert's too. Embeddings, the output
// head, norms, biases, the router and the shared expert's gate stay AdamW's, as in PyTorch's,
// Megatron-Core's and Moonshot's recipes.
std::vector<MuonMatrix> muon_matrices(const std::vector<ModelParam>& params);

// The step size of an [rows, cols] matrix for the base learning rate `lr`.
double muon_adjusted_lr(double lr, int64_t rows, int64_t cols, MuonAdjustLr adjust);

struct MuonPiece;  // below: a matrix ZeRO cuts, as muon_sharded_step takes it

// The scratch one matrix's update needs, sized for the largest matrix (reserve, or grown on demand)
// and kept on `device` between steps.
class MuonWorkspace {
 public:
  explicit MuonWorkspace(kernels::Device device = kernels::Device::cpu) : device_(device) {}
  kernels::Device device() const { return device_; }
  // The bytes it holds now (MemoryKind::optimizer).
  size_t bytes() const;
  // Sized at once for the largest of `matrices` (optimizer.muon.ns_dtype, the momentum's dtype;
  // `sharded`: some matrix is cut by ZeRO, muon_sharded_step's): the bytes muon_workspace_bytes
  // counts, allocated before the first step.
  void reserve(const std::vector<MuonMatrix>& matrices, kernels::DType ns_dtype, kernels::DType momentum_dtype,
               bool sharded = false);
  // For a largest matrix of `matrix` elements and a largest Gram matrix of `gram`: two fp32 matrices
  // (the gradient, the update; three with a bf16 momentum, widened; one more `sharded`: a piece of
  // another rank's matrix on its way), X and its product in ns_dtype, three Gram-sized ns_dtype
  // arrays (two fp32 more in bf16: the polynomial's sum) and the norm.
  static int64_t bytes_for(int64_t matrix, int64_t gram, kernels::DType ns_dtype, kernels::DType momentum_dtype,
                           bool sharded = false);

 private:
  friend struct MuonSteps;
  friend void muon_matrix_step(const MuonMatrix&, kernels::Tensor, kernels::Tensor, kernels::Tensor, double, double,
                               float, const MuonSettings&, MuonWorkspace&, const MuonGroup&);
  friend void muon_sharded_step(const std::vector<MuonPiece>&, parallel::Comm&, double, double, float,
                                const MuonSettings&, MuonWorkspace&, const MuonGroup&);
  friend void newton_schulz(kernels::Tensor, const MuonSettings&, MuonWorkspace&, int, const MuonGroup&, int);
  void reserve(int64_t matrix, int64_t gram, kernels::DType ns_dtype, kernels::DType momentum_dtype, bool sharded);
  kernels::Device device_;
  int64_t matrix_ = 0, gram_ = 0;
  kernels::DType ns_dtype_ = kernels::DType::fp32;
  bool sharded_ = false;
  kernels::Buffer f32_a_, f32_b_, f32_m_;    // [m·n] fp32: the gradient, the update, bf16 momentum widened
  kernels::Buffer f32_c_;                    // [m·n] fp32, sharded: a piece sent to or received from its owner
  kernels::Buffer x_, product_;              // [m·n] in ns_dtype: X and its product with the polynomial
  kernels::Buffer gram_a_, gram_b_, poly_;   // [k·k] in ns_dtype, k = min(m, n)
  kernels::Buffer f32_gram_a_, f32_gram_b_;  // [k·k] fp32 (bf16 ns_dtype): the polynomial's sum
  kernels::Buffer norm_;                     // [1] fp32
};

// The workspace of a rank whose Muon matrices are `matrices` (0 without any): the memory account's.
int64_t muon_workspace_bytes(const std::vector<MuonMatrix>& matrices, kernels::DType ns_dtype,
                             kernels::DType momentum_dtype, bool sharded = false);

// X [m, n] (ns_dtype) orthogonalized in place: scaled to unit Frobenius norm, then the iteration.
// With split 0 or 1 and a group, x is this rank's rows or columns of the matrix: the norm and each
// Gram matrix (over the unsplit side) are summed over the group and the iteration's products stay
// local, so every rank ends with its block of the whole matrix's result (to rounding).
// `blocks`: the distinct blocks the group holds (MuonMatrix::blocks); each sum over the group counts
// a replicated block once.
void newton_schulz(kernels::Tensor x, const MuonSettings& s, MuonWorkspace& ws, int split = -1,
                   const MuonGroup& group = {}, int blocks = 0);

// One Muon step of `matrix` [rows, cols] held whole here (its split and global shape: a tensor-
// parallel block's partial sums are reduced over `group` and its step size is the whole matrix's):
// `param` (fp32, in place), its gradient `grad` (any float dtype, multiplied by grad_scale first:
// clipping, 1 / loss scale) and momentum `momentum` (fp32, or bf16: widened, updated in fp32 and
// stored rounded to nearest even), flat, at learning rate `lr` and decoupled weight decay
// `weight_decay`.
void muon_matrix_step(const MuonMatrix& matrix, kernels::Tensor param, kernels::Tensor grad, kernels::Tensor momentum,
                      double lr, double weight_decay, float grad_scale, const MuonSettings& s, MuonWorkspace& ws,
                      const MuonGroup& group = {});

// A matrix ZeRO cuts over a shard group: every rank's elements of it, and this rank's state there.
struct MuonPiece {
  const MuonMatrix* matrix = nullptr;
  // Rank q's elements of the matrix, [begin, end) in its row-major order (empty: none); in rank order
  // they are the whole matrix (ZeRO's chunks are consecutive).
  std::vector<parallel::FlatRange> pieces;
  kernels::Tensor param, grad, momentum;  // this rank's piece, as muon_matrix_step's (undefined: none)
};

// One Muon step of the matrices `batch` (at most shards.size()), cut over the shard group `shards`,
// matrix j computed on rank j of it: each rank updates its pieces' momentum and sends each piece of
// the update to the matrix's owner; each owner orthogonalizes its whole matrix (a tensor-parallel
// block's sums over `group`, its tp peers owning the same matrix) at the same time as the others, and
// sends every rank its piece of the result, which each applies. The values are muon_matrix_step's;
// the work is spread over the group (Megatron-Core's and TorchTitan's distributed Muon): each matrix
// crosses the group twice as fp32, once to its owner and once back. Every rank of the group calls it
// with the same matrices.
void muon_sharded_step(const std::vector<MuonPiece>& batch, parallel::Comm& shards, double lr, double weight_decay,
                       float grad_scale, const MuonSettings& s, MuonWorkspace& ws, const MuonGroup& group = {});

}  // namespace llmtrain::trainer
