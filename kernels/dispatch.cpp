// The one place where ops pick their backend: shapes, dtypes and devices are checked here (so
// every backend sees the same validated arguments), then the tensors' device selects the
// implementation: kernels/cpu/ or kernels/cuda/ (LT_DISPATCH's `case Device::cuda:`, here and
// nowhere else).
//
// 16-bit storage (kernels/ops.h, "Precision"): on the CPU, an op whose storage operands are bf16
// or fp16 runs the same fp32 CPU kernel on fp32 copies of them (Widen below, the one place that
// does it): read operands are widened exactly into the per-thread scratch, the kernel runs, and
// written operands are rounded back once (nearest even). All-fp32 calls skip it entirely, so fp32
// is bitwise as before. The CUDA kernels read and write 16-bit storage themselves.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"

namespace llmtrain::kernels {

namespace {

#if !LLMTRAIN_CUDA_BACKEND
[[noreturn]] void no_cuda(const char* op) {
  throw Error(fmt::format("not supported yet: {} on CUDA tensors in this build (it has no CUDA backend)", op),
              "use train.device: cpu");
}
#endif

// The device every defined tensor of one call shares.
Device device_of(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!first) first = t;
    LT_CHECK(t->device == first->device, "{}: tensors on {} and {}", op, to_string(first->device),
             to_string(t->device));
  }
  return first ? first->device : Device::cpu;
}

void expect(const char* op, const char* what, const Tensor& t, DType dtype, int64_t numel) {
  LT_CHECK(t.defined(), "{}: {} is missing", op, what);
  LT_CHECK(t.dtype == dtype, "{}: {} is {}, expected {}", op, what, to_string(t.dtype), to_string(dtype));
  LT_CHECK(t.numel() == numel, "{}: {} has shape {} ({} elements), expected {} elements", op, what, t.shape.str(),
           t.numel(), numel);
}
void expect_f32(const char* op, const char* what, const Tensor& t, int64_t numel) {
  expect(op, what, t, DType::fp32, numel);
}
bool is_float(DType d) { return d == DType::fp32 || d == DType::bf16 || d == DType::fp16; }

// A storage operand: any float dtype (all of one call's storage operands share it).
void expect_float(const char* op, const char* what, const Tensor& t, int64_t numel) {
  LT_CHECK(t.defined(), "{}: {} is missing", op, what);
  LT_CHECK(is_float(t.dtype), "{}: {} is {}, expected a float dtype", op, what, to_string(t.dtype));
  LT_CHECK(t.numel() == numel, "{}: {} has shape {} ({} elements), expected {} elements", op, what, t.shape.str(),
           t.numel(), numel);
}

// How an op uses a storage operand: read, written (overwritten), or both (accumulated, in place).
enum Use : uint8_t { kRead = 1, kWrite = 2, kAccumulate = 3 };
struct Operand {
  Tensor* t;
  Use use;
};

// Runs a call with 16-bit storage operands in fp32: the constructor points each such operand at an
// fp32 copy in the calling thread's widening scratch (operands sharing memory share the copy, so
// the in-place forms of ops.h keep working), and the destructor rounds the written ones back. With
// only fp32 operands it does nothing. Mixing a 16-bit storage dtype with fp32 storage operands, or
// bf16 with fp16, in one call is a broken invariant: only the statistics (checked as fp32 by each
// op) and adamw_update's gradients may differ.
class Widen {
 public:
  Widen(const char* op, std::initializer_list<Operand> operands) {
    DType half = DType::fp32;
    bool fp32 = false;
    for (const Operand& o : operands) {
      if (!o.t->defined()) continue;
      LT_CHECK(is_float(o.t->dtype), "{}: a storage operand of {}", op, to_string(o.t->dtype));
      if (o.t->dtype == DType::fp32) {
        fp32 = true;
        continue;
      }
      LT_CHECK(half == DType::fp32 || half == o.t->dtype, "{}: {} and {} operands in one call", op, to_string(half),
               to_string(o.t->dtype));
      half = o.t->dtype;
    }
    if (half == DType::fp32) return;
    LT_CHECK(!fp32, "{}: {} and fp32 storage operands in one call", op, to_string(half));
    // The CUDA kernels read and write 16-bit storage themselves (fp32 arithmetic, one rounding).
    if (on_cuda(operands)) return;
    // One entry per distinct memory; views of the same memory must be the same elements.
    int64_t total = 0;
    for (const Operand& o : operands) {
      if (!o.t->defined()) continue;
      Entry* e = find(o.t->data);
      if (e) {
        LT_CHECK(e->orig.numel() == o.t->numel(), "{}: operands share memory with {} and {} elements", op,
                 e->orig.numel(), o.t->numel());
        e->use = Use(e->use | o.use);
        continue;
      }
      LT_CHECK(count_ < kMaxOperands, "{}: more than {} operands", op, kMaxOperands);
      entries_[count_++] = {*o.t, Tensor{}, o.use, total};
      total += (o.t->numel() + 15) / 16 * 16;  // 64-byte aligned copies
    }
    for (int i = 0; i < count_; ++i)
      for (int j = i + 1; j < count_; ++j)
        LT_CHECK(!overlap(entries_[i].orig, entries_[j].orig), "{}: operands overlap partially", op);
    float* base = cpu::thread_scratch(cpu::kWidenSlot, size_t(std::max<int64_t>(total, 1)));
    for (int i = 0; i < count_; ++i) {
      Entry& e = entries_[i];
      e.wide = Tensor(base + e.offset, DType::fp32, e.orig.shape);
      if (e.use & kRead) cpu::convert(e.wide, e.orig);
    }
    for (const Operand& o : operands)
      if (o.t->defined()) *o.t = Tensor(find(o.t->data)->wide.data, DType::fp32, o.t->shape);
  }
  ~Widen() {
    for (int i = 0; i < count_; ++i)
      if (entries_[i].use & kWrite) cpu::convert(entries_[i].orig, entries_[i].wide);
  }
  Widen(const Widen&) = delete;
  Widen& operator=(const Widen&) = delete;

 private:
  static constexpr int kMaxOperands = 10;
  struct Entry {
    Tensor orig, wide;
    Use use = kRead;
    int64_t offset = 0;
  };
  static bool overlap(const Tensor& a, const Tensor& b) {
    const auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
    return a.bytes() > 0 && b.bytes() > 0 && a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
  }
  Entry* find(const void* data) {
    for (int i = 0; i < count_; ++i)
      if (entries_[i].orig.data == data) return &entries_[i];
    return nullptr;
  }
  static bool on_cuda(std::initializer_list<Operand> operands) {
    for (const Operand& o : operands)
      if (o.t->defined()) return o.t->device == Device::cuda;
    return false;
  }
  Entry entries_[kMaxOperands];
  int count_ = 0;
};

// Rows and columns of a 2-D-or-more tensor viewed as [rows, last dim].
int64_t cols(const Tensor& t) { return t.shape.rank() == 0 ? 1 : t.shape[t.shape.rank() - 1]; }
int64_t rows(const Tensor& t) { return t.numel() / (cols(t) ? cols(t) : 1); }

// LLMTRAIN_OP_PROFILE=1: wall time per op, printed to stderr at exit (for finding what a step
// spends its time on; off by default, and then it costs one branch per op).
class OpProfile {
 public:
  static bool enabled() {
    static const bool on = std::getenv("LLMTRAIN_OP_PROFILE") != nullptr;
    return on;
  }
  struct Timer {
    const char* op;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    ~Timer() {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      instance().add(op, s);
    }
  };

 private:
  static OpProfile& instance() {
    static OpProfile p;
    return p;
  }
  void add(const char* op, double s) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& e = totals_[op];
    e.first += s;
    e.second += 1;
  }
  ~OpProfile() {
    double total = 0;
    for (auto& [op, e] : totals_) total += e.first;
    std::fprintf(stderr, "op profile (LLMTRAIN_OP_PROFILE): %.3f s in ops\n", total);
    for (auto& [op, e] : totals_)
      std::fprintf(stderr, "  %-30s %9.3f s  %5.1f%%  %8lld calls\n", op.c_str(), e.first, 100 * e.first / total,
                   e.second);
  }
  std::mutex mu_;
  std::map<std::string, std::pair<double, long long>> totals_;
};

// LT_DISPATCH: the CPU op (kernels/cpu/cpu_ops.h) or the CUDA one (kernels/cuda/cuda_ops.h) by the
// tensors' device; in a build without the CUDA backend a cuda tensor is a "not supported yet" error.
#if LLMTRAIN_CUDA_BACKEND
#define LT_CUDA_OP(op, call) return cuda::call
#else
#define LT_CUDA_OP(op, call) no_cuda(#op)
#endif
#define LT_DISPATCH(op, call, ...)            \
  switch (device_of(#op, {__VA_ARGS__})) {    \
    case Device::cpu:                         \
      if (OpProfile::enabled()) {             \
        OpProfile::Timer timer{#op};          \
        return cpu::call;                     \
      }                                       \
      return cpu::call;                       \
    case Device::cuda:                        \
      LT_CUDA_OP(op, call);                   \
  }                                           \
  LT_CHECK(false, "{}: unknown device", #op); \
  __builtin_unreachable()

}  // namespace

void fill_zero(Tensor x) { LT_DISPATCH(fill_zero, fill_zero(x), &x); }

void convert(Tensor out, Tensor in) {
  LT_CHECK(out.numel() == in.numel(), "convert: {} elements into {}", in.numel(), out.numel());
  LT_CHECK(out.dtype == in.dtype || (is_float(out.dtype) && is_float(in.dtype)), "convert: {} to {}",
           to_string(in.dtype), to_string(out.dtype));
  LT_DISPATCH(convert, convert(out, in), &out, &in);
}

void synchronize(Device device) {
  if (device == Device::cpu) return;
#if LLMTRAIN_CUDA_BACKEND
  cuda::synchronize();
#else
  no_cuda("synchronize");
#endif
}

void copy(Tensor out, Tensor in) {
  LT_CHECK(out.dtype == in.dtype && out.numel() == in.numel(), "copy: {} {} into {} {}", to_string(in.dtype),
           in.shape.str(), to_string(out.dtype), out.shape.str());
  LT_CHECK(out.defined() || out.numel() == 0, "copy: no destination");
  // The one op whose tensors may sit on different devices: host<->device copies land here.
  if (out.device == Device::cpu && in.device == Device::cpu) {
    if (OpProfile::enabled()) {
      OpProfile::Timer timer{"copy"};
      return cpu::copy(out, in);
    }
    return cpu::copy(out, in);
  }
  LT_CUDA_OP(copy, copy(out, in));
}

void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int64_t vocab_begin, int64_t vocab) {
  const int64_t n = tokens.numel(), c = cols(wte);
  expect("embedding_forward", "tokens", tokens, DType::int32, n);
  expect_float("embedding_forward", "out", out, n * c);
  expect_float("embedding_forward", "wte", wte, wte.numel());
  LT_CHECK(vocab >= 1 && vocab_begin >= 0, "embedding_forward: vocab {} vocab_begin {}", vocab, vocab_begin);
  Widen w("embedding_forward", {{&out, kWrite}, {&wte, kRead}});
  LT_DISPATCH(embedding_forward, embedding_forward(out, tokens, wte, vocab_begin, vocab), &out, &tokens, &wte);
}

void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int64_t vocab_begin, int64_t vocab) {
  const int64_t n = tokens.numel(), c = cols(dwte);
  expect("embedding_backward", "tokens", tokens, DType::int32, n);
  expect_float("embedding_backward", "dout", dout, n * c);
  expect_float("embedding_backward", "dwte", dwte, dwte.numel());
  LT_CHECK(vocab >= 1 && vocab_begin >= 0, "embedding_backward: vocab {} vocab_begin {}", vocab, vocab_begin);
  Widen w("embedding_backward", {{&dwte, kAccumulate}, {&dout, kRead}});
  LT_DISPATCH(embedding_backward, embedding_backward(dwte, dout, tokens, vocab_begin, vocab), &dwte, &dout, &tokens);
}

void position_embedding_forward(Tensor x, Tensor wpe, int64_t pos_begin) {
  LT_CHECK(x.shape.rank() == 3 && wpe.shape.rank() == 2 && x.shape[2] == wpe.shape[1],
           "position_embedding_forward: x {} wpe {}", x.shape.str(), wpe.shape.str());
  LT_CHECK(pos_begin >= 0 && pos_begin + x.shape[1] <= wpe.shape[0],
           "position_embedding_forward: positions [{}, {}) beyond the {} learned positions", pos_begin,
           pos_begin + x.shape[1], wpe.shape[0]);
  Widen w("position_embedding_forward", {{&x, kAccumulate}, {&wpe, kRead}});
  LT_DISPATCH(position_embedding_forward, position_embedding_forward(x, wpe, pos_begin), &x, &wpe);
}

void position_embedding_backward(Tensor dwpe, Tensor dx, int64_t pos_begin) {
  LT_CHECK(dx.shape.rank() == 3 && dwpe.shape.rank() == 2 && dx.shape[2] == dwpe.shape[1] &&
               pos_begin + dx.shape[1] <= dwpe.shape[0],
           "position_embedding_backward: dx {} dwpe {}", dx.shape.str(), dwpe.shape.str());
  Widen w("position_embedding_backward", {{&dwpe, kAccumulate}, {&dx, kRead}});
  LT_DISPATCH(position_embedding_backward, position_embedding_backward(dwpe, dx, pos_begin), &dwpe, &dx);
}

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor in, Tensor weight, Tensor bias, float eps) {
  const int64_t c = cols(in), n = rows(in);
  for (auto [what, t, numel] : {std::tuple{"out", &out, n * c}, {"weight", &weight, c}, {"bias", &bias, c}})
    expect_float("layernorm_forward", what, *t, numel);
  expect_f32("layernorm_forward", "mean", mean, n);
  expect_f32("layernorm_forward", "rstd", rstd, n);
  Widen w("layernorm_forward", {{&out, kWrite}, {&in, kRead}, {&weight, kRead}, {&bias, kRead}});
  LT_DISPATCH(layernorm_forward, layernorm_forward(out, mean, rstd, in, weight, bias, eps), &out, &mean, &rstd, &in,
              &weight, &bias);
}

void layernorm_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight, Tensor mean,
                        Tensor rstd, Tensor dresidual) {
  const int64_t c = cols(in), n = rows(in);
  for (auto [what, t, numel] : {std::tuple{"din", &din, n * c},
                                {"dweight", &dweight, c},
                                {"dbias", &dbias, c},
                                {"dout", &dout, n * c},
                                {"weight", &weight, c}})
    expect_float("layernorm_backward", what, *t, numel);
  expect_f32("layernorm_backward", "mean", mean, n);
  expect_f32("layernorm_backward", "rstd", rstd, n);
  if (dresidual.defined()) expect_float("layernorm_backward", "dresidual", dresidual, n * c);
  Widen w("layernorm_backward", {{&din, kWrite},
                                 {&dweight, kAccumulate},
                                 {&dbias, kAccumulate},
                                 {&dout, kRead},
                                 {&in, kRead},
                                 {&weight, kRead},
                                 {&dresidual, kRead}});
  LT_DISPATCH(layernorm_backward, layernorm_backward(din, dweight, dbias, dout, in, weight, mean, rstd, dresidual),
              &din, &dweight, &dbias, &dout, &in, &weight, &mean, &rstd, &dresidual);
}

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor in, Tensor weight, float eps) {
  const int64_t c = cols(in), n = rows(in);
  for (auto [what, t, numel] : {std::tuple{"out", &out, n * c}, {"weight", &weight, c}})
    expect_float("rmsnorm_forward", what, *t, numel);
  expect_f32("rmsnorm_forward", "rstd", rstd, n);
  Widen w("rmsnorm_forward", {{&out, kWrite}, {&in, kRead}, {&weight, kRead}});
  LT_DISPATCH(rmsnorm_forward, rmsnorm_forward(out, rstd, in, weight, eps), &out, &rstd, &in, &weight);
}

void rmsnorm_backward(Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight, Tensor rstd,
                      Tensor dresidual) {
  const int64_t c = cols(in), n = rows(in);
  for (auto [what, t, numel] :
       {std::tuple{"din", &din, n * c}, {"dweight", &dweight, c}, {"dout", &dout, n * c}, {"weight", &weight, c}})
    expect_float("rmsnorm_backward", what, *t, numel);
  expect_f32("rmsnorm_backward", "rstd", rstd, n);
  if (dresidual.defined()) expect_float("rmsnorm_backward", "dresidual", dresidual, n * c);
  Widen w(
      "rmsnorm_backward",
      {{&din, kWrite}, {&dweight, kAccumulate}, {&dout, kRead}, {&in, kRead}, {&weight, kRead}, {&dresidual, kRead}});
  LT_DISPATCH(rmsnorm_backward, rmsnorm_backward(din, dweight, dout, in, weight, rstd, dresidual), &din, &dweight,
              &dout, &in, &weight, &rstd, &dresidual);
}

void linear_forward(Tensor out, Tensor in, Tensor weight, Tensor bias) {
  const int64_t i = cols(in), n = rows(in), o = weight.numel() / (i ? i : 1);
  expect_float("linear_forward", "weight", weight, o * i);
  expect_float("linear_forward", "out", out, n * o);
  LT_CHECK(cols(out) == o || out.shape.rank() > 2, "linear_forward: out {} for weight [{}, {}]", out.shape.str(), o, i);
  if (bias.defined()) expect_float("linear_forward", "bias", bias, o);
  Widen w("linear_forward", {{&out, kWrite}, {&in, kRead}, {&weight, kRead}, {&bias, kRead}});
  LT_DISPATCH(linear_forward, linear_forward(out, in, weight, bias), &out, &in, &weight, &bias);
}

void linear_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight) {
  const int64_t i = cols(in), n = rows(in), o = weight.numel() / (i ? i : 1);
  expect_float("linear_backward", "weight", weight, o * i);
  expect_float("linear_backward", "dweight", dweight, o * i);
  expect_float("linear_backward", "dout", dout, n * o);
  if (din.defined()) expect_float("linear_backward", "din", din, n * i);
  if (dbias.defined()) expect_float("linear_backward", "dbias", dbias, o);
  Widen w(
      "linear_backward",
      {{&din, kWrite}, {&dweight, kAccumulate}, {&dbias, kAccumulate}, {&dout, kRead}, {&in, kRead}, {&weight, kRead}});
  LT_DISPATCH(linear_backward, linear_backward(din, dweight, dbias, dout, in, weight), &din, &dweight, &dbias, &dout,
              &in, &weight);
}

void gelu_forward(Tensor out, Tensor in) {
  expect_float("gelu_forward", "out", out, in.numel());
  Widen w("gelu_forward", {{&out, kWrite}, {&in, kRead}});
  LT_DISPATCH(gelu_forward, gelu_forward(out, in), &out, &in);
}

void gelu_backward(Tensor din, Tensor dout, Tensor in) {
  expect_float("gelu_backward", "din", din, in.numel());
  expect_float("gelu_backward", "dout", dout, in.numel());
  Widen w("gelu_backward", {{&din, kWrite}, {&dout, kRead}, {&in, kRead}});
  LT_DISPATCH(gelu_backward, gelu_backward(din, dout, in), &din, &dout, &in);
}

void swiglu_forward(Tensor out, Tensor in) {
  const int64_t f = cols(in) / 2, n = rows(in);
  LT_CHECK(cols(in) % 2 == 0, "swiglu_forward: input rows of {} are not [gate | up]", cols(in));
  expect_float("swiglu_forward", "out", out, n * f);
  Widen w("swiglu_forward", {{&out, kWrite}, {&in, kRead}});
  LT_DISPATCH(swiglu_forward, swiglu_forward(out, in), &out, &in);
}

void swiglu_backward(Tensor din, Tensor dout, Tensor in) {
  const int64_t f = cols(in) / 2, n = rows(in);
  expect_float("swiglu_backward", "din", din, n * 2 * f);
  expect_float("swiglu_backward", "dout", dout, n * f);
  Widen w("swiglu_backward", {{&din, kWrite}, {&dout, kRead}, {&in, kRead}});
  LT_DISPATCH(swiglu_backward, swiglu_backward(din, dout, in), &din, &dout, &in);
}

void rope_table(Tensor table, double theta) {
  LT_CHECK(table.shape.rank() == 3 && table.shape[1] == 2 && table.dtype == DType::fp32, "rope_table: table {}",
           table.shape.str());
  LT_DISPATCH(rope_table, rope_table(table, theta), &table);
}

static void check_rope(const char* op, const Tensor& x, const Tensor& table, int64_t rotary_heads, int64_t pos_begin) {
  LT_CHECK(x.shape.rank() == 4 && table.shape.rank() == 3 && table.shape[1] == 2 && x.shape[3] == 2 * table.shape[2],
           "{}: x {} (expected [B, T, heads, D]) with table {}", op, x.shape.str(), table.shape.str());
  LT_CHECK(rotary_heads >= 0 && rotary_heads <= x.shape[2], "{}: {} rotary heads of {}", op, rotary_heads, x.shape[2]);
  LT_CHECK(pos_begin >= 0 && pos_begin + x.shape[1] <= table.shape[0], "{}: positions [{}, {}) beyond the table's {}",
           op, pos_begin, pos_begin + x.shape[1], table.shape[0]);
  expect_f32(op, "table", table, table.numel());
  expect_float(op, "x", x, x.numel());
}

void rope_forward(Tensor x, Tensor table, int64_t rotary_heads, int64_t pos_begin) {
  check_rope("rope_forward", x, table, rotary_heads, pos_begin);
  Widen w("rope_forward", {{&x, kAccumulate}});
  LT_DISPATCH(rope_forward, rope_forward(x, table, rotary_heads, pos_begin), &x, &table);
}

void rope_backward(Tensor dx, Tensor table, int64_t rotary_heads, int64_t pos_begin) {
  check_rope("rope_backward", dx, table, rotary_heads, pos_begin);
  Widen w("rope_backward", {{&dx, kAccumulate}});
  LT_DISPATCH(rope_backward, rope_backward(dx, table, rotary_heads, pos_begin), &dx, &table);
}

static void check_attention(const char* op, const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t heads,
                            int64_t kv_heads) {
  LT_CHECK(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0, "{}: heads {} kv_heads {}", op, heads, kv_heads);
  LT_CHECK(qkv.shape.rank() == 4 && qkv.shape[2] == heads + 2 * kv_heads,
           "{}: qkv {} is not [B, T, heads {} + 2·kv_heads {}, D]", op, qkv.shape.str(), heads, kv_heads);
  const int64_t b = qkv.shape[0], t = qkv.shape[1], d = qkv.shape[3];
  expect_float(op, "qkv", qkv, qkv.numel());
  expect_float(op, "out", out, b * t * heads * d);
  expect_f32(op, "lse", lse, b * heads * t);
}

void attention_forward(Tensor out, Tensor lse, Tensor qkv, int64_t heads, int64_t kv_heads) {
  check_attention("attention_forward", qkv, out, lse, heads, kv_heads);
  Widen w("attention_forward", {{&out, kWrite}, {&qkv, kRead}});
  LT_DISPATCH(attention_forward, attention_forward(out, lse, qkv, heads, kv_heads), &out, &lse, &qkv);
}

void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int64_t heads, int64_t kv_heads) {
  check_attention("attention_backward", qkv, out, lse, heads, kv_heads);
  expect_float("attention_backward", "dqkv", dqkv, qkv.numel());
  expect_float("attention_backward", "dout", dout, out.numel());
  Widen w("attention_backward", {{&dqkv, kWrite}, {&dout, kRead}, {&qkv, kRead}, {&out, kRead}});
  LT_DISPATCH(attention_backward, attention_backward(dqkv, dout, qkv, out, lse, heads, kv_heads), &dqkv, &dout, &qkv,
              &out, &lse);
}

// The cache is [B, T_max, kv_heads, D] with the batch and head dim of qkv; rows [position,
// position + T) must fit.
static void check_kv_cache(const char* op, const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                           int64_t heads, int64_t kv_heads, int64_t position) {
  LT_CHECK(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0, "{}: heads {} kv_heads {}", op, heads, kv_heads);
  LT_CHECK(qkv.shape.rank() == 4 && qkv.shape[2] == heads + 2 * kv_heads && qkv.dtype == DType::fp32,
           "{}: qkv {} is not [B, T, heads {} + 2·kv_heads {}, D]", op, qkv.shape.str(), heads, kv_heads);
  for (const Tensor* c : {&k_cache, &v_cache})
    LT_CHECK(c->dtype == DType::fp32 && c->shape.rank() == 4 && c->shape[0] == qkv.shape[0] &&
                 c->shape[2] == kv_heads && c->shape[3] == qkv.shape[3],
             "{}: cache {} for qkv {} (expected [B, T_max, kv_heads {}, D])", op, c->shape.str(), qkv.shape.str(),
             kv_heads);
  LT_CHECK(k_cache.shape == v_cache.shape, "{}: k cache {} v cache {}", op, k_cache.shape.str(), v_cache.shape.str());
  LT_CHECK(position >= 0 && position + qkv.shape[1] <= k_cache.shape[1],
           "{}: positions [{}, {}) beyond the cache's {} rows", op, position, position + qkv.shape[1],
           k_cache.shape[1]);
}

void kv_cache_write(Tensor k_cache, Tensor v_cache, Tensor qkv, int64_t heads, int64_t kv_heads, int64_t position) {
  check_kv_cache("kv_cache_write", qkv, k_cache, v_cache, heads, kv_heads, position);
  LT_DISPATCH(kv_cache_write, kv_cache_write(k_cache, v_cache, qkv, heads, kv_heads, position), &k_cache, &v_cache,
              &qkv);
}

void attention_cached_forward(Tensor out, Tensor lse, Tensor qkv, Tensor k_cache, Tensor v_cache, int64_t heads,
                              int64_t kv_heads, int64_t position) {
  check_kv_cache("attention_cached_forward", qkv, k_cache, v_cache, heads, kv_heads, position);
  const int64_t b = qkv.shape[0], t = qkv.shape[1], d = qkv.shape[3];
  expect_f32("attention_cached_forward", "out", out, b * t * heads * d);
  expect_f32("attention_cached_forward", "lse", lse, b * heads * t);
  LT_DISPATCH(attention_cached_forward,
              attention_cached_forward(out, lse, qkv, k_cache, v_cache, heads, kv_heads, position), &out, &lse, &qkv,
              &k_cache, &v_cache);
}

void residual_forward(Tensor out, Tensor a, Tensor b, Tensor bias) {
  expect_float("residual_forward", "out", out, out.numel());
  expect_float("residual_forward", "a", a, out.numel());
  expect_float("residual_forward", "b", b, out.numel());
  if (bias.defined()) expect_float("residual_forward", "bias", bias, cols(out));
  Widen w("residual_forward", {{&out, kWrite}, {&a, kRead}, {&b, kRead}, {&bias, kRead}});
  LT_DISPATCH(residual_forward, residual_forward(out, a, b, bias), &out, &a, &b, &bias);
}

void residual_backward(Tensor dbias, Tensor dout) {
  expect_float("residual_backward", "dbias", dbias, cols(dout));
  expect_float("residual_backward", "dout", dout, dout.numel());
  Widen w("residual_backward", {{&dbias, kAccumulate}, {&dout, kRead}});
  LT_DISPATCH(residual_backward, residual_backward(dbias, dout), &dbias, &dout);
}

static void check_cross_entropy(const char* op, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                                int64_t vocab) {
  const int64_t n = rows(logits);
  LT_CHECK(vocab >= 1 && vocab <= cols(logits), "{}: vocab {} with logits {}", op, vocab, logits.shape.str());
  expect(op, "targets", targets, DType::int32, n);
  expect_f32(op, "lse", lse, n);
  expect_float(op, "logits", logits, n * cols(logits));
}

void cross_entropy_forward(Tensor losses, Tensor lse, Tensor logits, Tensor targets, int64_t vocab,
                           int32_t ignore_index) {
  check_cross_entropy("cross_entropy_forward", logits, lse, targets, vocab);
  expect_f32("cross_entropy_forward", "losses", losses, rows(logits));
  Widen w("cross_entropy_forward", {{&logits, kRead}});
  LT_DISPATCH(cross_entropy_forward, cross_entropy_forward(losses, lse, logits, targets, vocab, ignore_index), &losses,
              &lse, &logits, &targets);
}

void cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, int64_t vocab,
                            int32_t ignore_index, float loss_scale, Tensor count) {
  check_cross_entropy("cross_entropy_backward", logits, lse, targets, vocab);
  expect_float("cross_entropy_backward", "dlogits", dlogits, logits.numel());
  Widen w("cross_entropy_backward", {{&dlogits, kWrite}, {&logits, kRead}});
  expect("cross_entropy_backward", "count", count, DType::int32, 1);
  LT_DISPATCH(cross_entropy_backward,
              cross_entropy_backward(dlogits, logits, lse, targets, vocab, ignore_index, loss_scale, count), &dlogits,
              &logits, &lse, &targets, &count);
}

static void check_shard(const char* op, const Tensor& logits, int64_t col_begin, int64_t vocab) {
  LT_CHECK(col_begin >= 0 && vocab >= 1 && logits.shape.rank() >= 1, "{}: columns from {} of vocab {}, logits {}", op,
           col_begin, vocab, logits.shape.str());
  expect_float(op, "logits", logits, rows(logits) * cols(logits));
}

void cross_entropy_shard_max(Tensor row_max, Tensor logits, int64_t col_begin, int64_t vocab) {
  check_shard("cross_entropy_shard_max", logits, col_begin, vocab);
  expect_f32("cross_entropy_shard_max", "row_max", row_max, rows(logits));
  Widen w("cross_entropy_shard_max", {{&logits, kRead}});
  LT_DISPATCH(cross_entropy_shard_max, cross_entropy_shard_max(row_max, logits, col_begin, vocab), &row_max, &logits);
}

void cross_entropy_shard_sums(Tensor stats, Tensor logits, Tensor row_max, Tensor targets, int64_t col_begin,
                              int64_t vocab, int32_t ignore_index) {
  check_shard("cross_entropy_shard_sums", logits, col_begin, vocab);
  expect_f32("cross_entropy_shard_sums", "stats", stats, 2 * rows(logits));
  expect_f32("cross_entropy_shard_sums", "row_max", row_max, rows(logits));
  expect("cross_entropy_shard_sums", "targets", targets, DType::int32, rows(logits));
  Widen w("cross_entropy_shard_sums", {{&logits, kRead}});
  LT_DISPATCH(cross_entropy_shard_sums,
              cross_entropy_shard_sums(stats, logits, row_max, targets, col_begin, vocab, ignore_index), &stats,
              &logits, &row_max, &targets);
}

void cross_entropy_combine(Tensor losses, Tensor lse, Tensor row_max, Tensor stats, Tensor targets, int64_t vocab,
                           int32_t ignore_index) {
  const int64_t n = losses.numel();
  expect_f32("cross_entropy_combine", "losses", losses, n);
  expect_f32("cross_entropy_combine", "lse", lse, n);
  expect_f32("cross_entropy_combine", "row_max", row_max, n);
  expect_f32("cross_entropy_combine", "stats", stats, 2 * n);
  expect("cross_entropy_combine", "targets", targets, DType::int32, n);
  LT_DISPATCH(cross_entropy_combine, cross_entropy_combine(losses, lse, row_max, stats, targets, vocab, ignore_index),
              &losses, &lse, &row_max, &stats, &targets);
}

void cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, int64_t col_begin,
                                  int64_t vocab, int32_t ignore_index, float loss_scale, Tensor count) {
  check_shard("cross_entropy_shard_backward", logits, col_begin, vocab);
  expect_float("cross_entropy_shard_backward", "dlogits", dlogits, logits.numel());
  expect_f32("cross_entropy_shard_backward", "lse", lse, rows(logits));
  expect("cross_entropy_shard_backward", "targets", targets, DType::int32, rows(logits));
  expect("cross_entropy_shard_backward", "count", count, DType::int32, 1);
  Widen w("cross_entropy_shard_backward", {{&dlogits, kWrite}, {&logits, kRead}});
  LT_DISPATCH(
      cross_entropy_shard_backward,
      cross_entropy_shard_backward(dlogits, logits, lse, targets, col_begin, vocab, ignore_index, loss_scale, count),
      &dlogits, &logits, &lse, &targets, &count);
}

void loss_mean_forward(Tensor mean, Tensor count, Tensor losses, Tensor targets, int32_t ignore_index) {
  expect_f32("loss_mean_forward", "mean", mean, 1);
  expect("loss_mean_forward", "count", count, DType::int32, 1);
  expect_f32("loss_mean_forward", "losses", losses, losses.numel());
  expect("loss_mean_forward", "targets", targets, DType::int32, losses.numel());
  LT_DISPATCH(loss_mean_forward, loss_mean_forward(mean, count, losses, targets, ignore_index), &mean, &count, &losses,
              &targets);
}

void adamw_update(Tensor params, Tensor grads, Tensor m, Tensor v, const AdamWStep& s) {
  const int64_t n = params.numel();
  for (auto [what, t] : {std::pair{"params", &params}, {"m", &m}, {"v", &v}}) expect_f32("adamw_update", what, *t, n);
  expect_float("adamw_update", "grads", grads, n);  // 16-bit gradients update fp32 master weights
  Widen w("adamw_update", {{&grads, kRead}});
  LT_CHECK(s.step >= 1, "adamw_update: step {} (1-based)", s.step);
  LT_DISPATCH(adamw_update, adamw_update(params, grads, m, v, s), &params, &grads, &m, &v);
}

double sum_squares(Tensor x) {
  expect_float("sum_squares", "x", x, x.numel());
  Widen w("sum_squares", {{&x, kRead}});
  LT_DISPATCH(sum_squares, sum_squares(x), &x);
}

void scale(Tensor x, float s) {
  expect_float("scale", "x", x, x.numel());
  Widen w("scale", {{&x, kAccumulate}});
  LT_DISPATCH(scale, scale(x, s), &x);
}

void linear_backward_input(Tensor din, Tensor dout, Tensor weight) {
  const int64_t i = cols(din), n = rows(din), o = weight.numel() / (i ? i : 1);
  expect_float("linear_backward_input", "din", din, n * i);
  expect_float("linear_backward_input", "weight", weight, o * i);
  expect_float("linear_backward_input", "dout", dout, n * o);
  // 16-bit storage: din rounded once, as linear_backward's.
  Widen w("linear_backward_input", {{&din, kWrite}, {&dout, kRead}, {&weight, kRead}});
  LT_DISPATCH(linear_backward_input, linear_backward_input(din, dout, weight), &din, &dout, &weight);
}

}  // namespace llmtrain::kernels
