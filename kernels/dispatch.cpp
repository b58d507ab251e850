// The one place where ops pick their backend. Every op of the table (kernels/op_table.def) gets
// its definition here from its entry: the entry's preconditions, then its operands' presence,
// dtypes and element counts (so every backend sees the same validated arguments), then the
// tensors' device selects the implementation: kernels/cpu/ or kernels/cuda/ (run_op below, here
// and nowhere else). It is also the one point where ops are timed by name when an op profile is
// active on the calling thread (log.profile: ops, kernels/op_profile.h): off, one null check.
//
// 16-bit storage (kernels/ops.h, "Precision"): on the CPU, an op whose storage operands are bf16
// or fp16 runs the same fp32 CPU kernel on fp32 copies of them (Widen below, the one place that
// does it): operands it reads are widened exactly into the per-thread scratch, the kernel runs, and
// operands it writes are rounded back once (nearest even). All-fp32 calls skip it entirely, so
// fp32 is bitwise as before. The CUDA kernels read and write 16-bit storage themselves.
#include <cmath>
#include <span>
#include <string>
#include <utility>

#include "common/error.h"
#include "kernels/buffer.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/stored.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/op_profile.h"
#include "kernels/ops.h"

namespace llmtrain::kernels {

namespace {

#if !LLMTRAIN_CUDA_BACKEND
[[noreturn]] void no_cuda(const char* op) {
  throw Error(fmt::format("not supported yet: {} on CUDA tensors in this build (it has no CUDA backend)", op),
              "use train.device: cpu");
}
#endif

bool is_float(DType d) { return d == DType::fp32 || d == DType::bf16 || d == DType::fp16; }

// ---- what the table's counts and conditions are written in ------------------------------------

constexpr int64_t kAny = -1;  // a count: any number of elements
int64_t numel(const Tensor& t) { return t.numel(); }
// Columns (the last dimension) and rows of a tensor viewed as [rows, last dim].
int64_t cols(const Tensor& t) { return t.shape.rank() == 0 ? 1 : t.shape[t.shape.rank() - 1]; }
int64_t rows(const Tensor& t) { return t.numel() / (cols(t) ? cols(t) : 1); }
// The dimension before the last: the heads W of a [..., W, D] tensor.
int64_t heads_of(const Tensor& t) { return t.shape.rank() < 2 ? 1 : t.shape[t.shape.rank() - 2]; }

// in [..., W, D] with heads [first_head, first_head + count) inside W.
bool head_range_ok(const Tensor& in, int64_t first_head, int64_t count) {
  LT_CHECK(in.shape.rank() >= 3, "head_rmsnorm: in {} (expected [..., W, D], rank >= 3)", in.shape.str());
  LT_CHECK(first_head >= 0 && count >= 1 && first_head + count <= heads_of(in),
           "head_rmsnorm: heads [{}, {}) (first_head {}, count {}) outside the {} heads of in {}", first_head,
           first_head + count, first_head, count, heads_of(in), in.shape.str());
  return true;
}

bool rope_layout_ok(const Tensor& x, const Tensor& table, int64_t rotary_heads, int64_t pos_begin) {
  LT_CHECK(x.shape.rank() == 4 && table.shape.rank() == 3 && table.shape[1] == 2 && x.shape[3] == 2 * table.shape[2],
           "rope: x {} (expected [B, T, heads, D]) with table {}", x.shape.str(), table.shape.str());
  LT_CHECK(rotary_heads >= 0 && rotary_heads <= x.shape[2], "rope: {} rotary heads of {}", rotary_heads, x.shape[2]);
  LT_CHECK(pos_begin >= 0 && pos_begin + x.shape[1] <= table.shape[0], "rope: positions [{}, {}) beyond the table's {}",
           pos_begin, pos_begin + x.shape[1], table.shape[0]);
  return true;
}

// The rotary frequencies' scaling (ops.h's RopeScaling) names a finite stretch.
bool rope_scaling_ok(double theta, const RopeScaling& s) {
  LT_CHECK(std::isfinite(theta) && theta > 0, "rope_table: theta {} (expected > 0)", theta);
  LT_CHECK(std::isfinite(s.factor) && s.factor > 0, "rope_table: scaling factor {} (expected > 0)", s.factor);
  if (s.type == RopeScaling::Type::llama3)
    LT_CHECK(std::isfinite(s.high_freq_factor) && s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor &&
                 std::isfinite(s.original_max_positions) && s.original_max_positions > 0,
             "rope_table: llama3 scaling with low_freq_factor {}, high_freq_factor {}, original_max_positions {} "
             "(expected high_freq_factor > low_freq_factor > 0 and original_max_positions > 0)",
             s.low_freq_factor, s.high_freq_factor, s.original_max_positions);
  if (s.type == RopeScaling::Type::yarn)
    LT_CHECK(std::isfinite(s.beta_fast) && std::isfinite(s.beta_slow) && s.beta_fast > 0 && s.beta_slow > 0 &&
                 std::isfinite(s.original_max_positions) && s.original_max_positions > 0 &&
                 std::isfinite(s.attention_factor) && s.attention_factor > 0,
             "rope_table: yarn scaling with beta_fast {}, beta_slow {}, original_max_positions {}, attention_factor {} "
             "(expected positive and finite)",
             s.beta_fast, s.beta_slow, s.original_max_positions, s.attention_factor);
  return true;
}

// q, k and v [B, T, *, D] with the spec's heads inside them; out and lse the sizes of q's rows.
bool attention_layout_ok(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionSpec& s) {
  LT_CHECK(s.heads >= 1 && s.kv_heads >= 1 && s.heads % s.kv_heads == 0, "attention: heads {} kv_heads {}", s.heads,
           s.kv_heads);
  LT_CHECK(q.shape.rank() == 4 && k.shape.rank() == 4 && v.shape.rank() == 4,
           "attention: q {} k {} v {} (expected "
           "[B, T, heads, D])",
           q.shape.str(), k.shape.str(), v.shape.str());
  LT_CHECK(k.shape[0] == q.shape[0] && v.shape[0] == q.shape[0] && k.shape[3] == q.shape[3] &&
               v.shape[3] == q.shape[3] && v.shape[1] == k.shape[1],
           "attention: q {} k {} v {} differ in batch, head dim or key rows", q.shape.str(), k.shape.str(),
           v.shape.str());
  for (auto [what, t, first, count] :
       {std::tuple{"q", &q, s.q_head, s.heads}, {"k", &k, s.k_head, s.kv_heads}, {"v", &v, s.v_head, s.kv_heads}})
    LT_CHECK(first >= 0 && first + count <= t->shape[2], "attention: {} heads [{}, {}) of {} {}", what, first,
             first + count, what, t->shape.str());
  const int64_t b = q.shape[0], tq = q.shape[1], d = q.shape[3];
  LT_CHECK(out.numel() == b * tq * s.heads * d, "attention: out {} for {} query rows of {} heads of {}",
           out.shape.str(), b * tq, s.heads, d);
  LT_CHECK(lse.numel() == b * s.heads * tq, "attention: lse {} for {} query rows of {} heads", lse.shape.str(), b * tq,
           s.heads);
  LT_CHECK(s.q_begin >= 0 && s.kv_begin >= 0 && s.window >= 0 && (s.window == 0 || s.causal),
           "attention: q_begin {} kv_begin {} window {} causal {} (a window needs the causal mask)", s.q_begin,
           s.kv_begin, s.window, s.causal);
  return true;
}

// The gradients have their inputs' shapes, and two of them in one tensor name disjoint heads.
bool attention_grads_ok(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& q, const Tensor& k,
                        const Tensor& v, const AttentionSpec& s) {
  LT_CHECK(dq.shape == q.shape && dk.shape == k.shape && dv.shape == v.shape,
           "attention_backward: dq {} dk {} dv {} "
           "for q {} k {} v {}",
           dq.shape.str(), dk.shape.str(), dv.shape.str(), q.shape.str(), k.shape.str(), v.shape.str());
  const std::tuple<const Tensor*, int64_t, int64_t> grads[] = {
      {&dq, s.q_head, s.heads}, {&dk, s.k_head, s.kv_heads}, {&dv, s.v_head, s.kv_heads}};
  for (int i = 0; i < 3; ++i)
    for (int j = i + 1; j < 3; ++j) {
      const auto& [a, a0, an] = grads[i];
      const auto& [b, b0, bn] = grads[j];
      LT_CHECK(a->data != b->data || a0 + an <= b0 || b0 + bn <= a0,
               "attention_backward: two gradients write heads [{}, {}) and [{}, {}) of one tensor", a0, a0 + an, b0,
               b0 + bn);
    }
  return true;
}

// The cache is [B, T_max, kv_heads, D] with the batch and head dim of qkv; rows [position,
// position + T) must fit.
bool kv_cache_layout_ok(const Tensor& k_cache, const Tensor& v_cache, const Tensor& qkv, int64_t heads,
                        int64_t kv_heads, int64_t position) {
  LT_CHECK(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0, "kv_cache_write: heads {} kv_heads {}", heads,
           kv_heads);
  LT_CHECK(qkv.shape.rank() == 4 && qkv.shape[2] == heads + 2 * kv_heads,
           "kv_cache_write: qkv {} is not [B, T, heads {} + 2·kv_heads {}, D]", qkv.shape.str(), heads, kv_heads);
  for (const Tensor* c : {&k_cache, &v_cache})
    LT_CHECK(
        c->shape.rank() == 4 && c->shape[0] == qkv.shape[0] && c->shape[2] == kv_heads && c->shape[3] == qkv.shape[3],
        "kv_cache_write: cache {} for qkv {} (expected [B, T_max, kv_heads {}, D])", c->shape.str(), qkv.shape.str(),
        kv_heads);
  LT_CHECK(k_cache.shape == v_cache.shape, "kv_cache_write: k cache {} v cache {}", k_cache.shape.str(),
           v_cache.shape.str());
  LT_CHECK(position >= 0 && position + qkv.shape[1] <= k_cache.shape[1],
           "kv_cache_write: positions [{}, {}) beyond the cache's {} rows", position, position + qkv.shape[1],
           k_cache.shape[1]);
  return true;
}

// ---- an op's operands, as its table entry describes them ---------------------------------------

enum class Use : uint8_t { read = 1, write = 2, read_write = 3 };
enum class Class : uint8_t { storage, f32, i32, i64, any };
enum class Need : uint8_t { required, optional };
struct Operand {
  const char* name;
  Tensor* t;
  Use use;
  Class cls;
  Need need;
  int64_t count;  // kAny or the element count the entry demands
};
bool reads(Use u) { return (uint8_t(u) & uint8_t(Use::read)) != 0; }
bool writes(Use u) { return (uint8_t(u) & uint8_t(Use::write)) != 0; }

void check_operand(const char* op, const Operand& o) {
  const Tensor& t = *o.t;
  if (!t.defined()) {
    LT_CHECK(o.need == Need::optional, "{}: {} is missing", op, o.name);
    return;
  }
  switch (o.cls) {
    case Class::storage:
      LT_CHECK(is_float(t.dtype), "{}: {} is {}, expected a float dtype", op, o.name, to_string(t.dtype));
      break;
    case Class::f32:
      LT_CHECK(t.dtype == DType::fp32, "{}: {} is {}, expected fp32", op, o.name, to_string(t.dtype));
      break;
    case Class::i64:
      LT_CHECK(t.dtype == DType::int64, "{}: {} is {}, expected int64", op, o.name, to_string(t.dtype));
      break;
    case Class::i32:
      LT_CHECK(t.dtype == DType::int32, "{}: {} is {}, expected int32", op, o.name, to_string(t.dtype));
      break;
    case Class::any:
      break;
  }
  LT_CHECK(o.count == kAny || t.numel() == o.count, "{}: {} has shape {} ({} elements), expected {} elements", op,
           o.name, t.shape.str(), t.numel(), o.count);
}

// The device every defined tensor of one call shares.
Device device_of(const char* op, std::span<const Operand> operands) {
  const Tensor* first = nullptr;
  for (const Operand& o : operands) {
    if (!o.t->defined()) continue;
    if (!first) first = o.t;
    LT_CHECK(o.t->device == first->device, "{}: tensors on {} and {}", op, to_string(first->device),
             to_string(o.t->device));
  }
  return first ? first->device : Device::cpu;
}

// The storage dtype of a call: fp32, or the one 16-bit dtype all its storage operands share.
// Mixing a 16-bit dtype with fp32 storage operands, or bf16 with fp16, is a broken invariant:
// only the table's fp32 operands (statistics, tables, master weights) may differ.
DType storage_dtype(const char* op, std::span<const Operand> operands) {
  DType half = DType::fp32;
  bool fp32 = false;
  for (const Operand& o : operands) {
    if (o.cls != Class::storage || !o.t->defined()) continue;
    if (o.t->dtype == DType::fp32) {
      fp32 = true;
      continue;
    }
    LT_CHECK(half == DType::fp32 || half == o.t->dtype, "{}: {} and {} operands in one call", op, to_string(half),
             to_string(o.t->dtype));
    half = o.t->dtype;
  }
  LT_CHECK(half == DType::fp32 || !fp32, "{}: {} and fp32 storage operands in one call", op, to_string(half));
  return half;
}

// Runs a CPU call with 16-bit storage operands in fp32: the constructor points each such operand at
// an fp32 copy in the calling thread's widening scratch (operands sharing memory share the copy, so
// the in-place forms of ops.h keep working), and the destructor rounds the written ones back. With
// fp32 storage it does nothing.
class Widen {
 public:
  Widen(const char* op, std::span<Operand> operands, DType storage) {
    if (storage == DType::fp32) return;
    // One entry per distinct memory; views of the same memory must be the same elements.
    int64_t total = 0;
    for (const Operand& o : operands) {
      if (o.cls != Class::storage || !o.t->defined()) continue;
      Entry* e = find(o.t->data);
      if (e) {
        LT_CHECK(e->orig.numel() == o.t->numel(), "{}: operands share memory with {} and {} elements", op,
                 e->orig.numel(), o.t->numel());
        e->use = Use(uint8_t(e->use) | uint8_t(o.use));
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
      if (reads(e.use)) cpu::convert(e.wide, e.orig);
    }
    for (const Operand& o : operands)
      if (o.cls == Class::storage && o.t->defined()) *o.t = Tensor(find(o.t->data)->wide.data, DType::fp32, o.t->shape);
  }
  ~Widen() {
    for (int i = 0; i < count_; ++i)
      if (writes(entries_[i].use)) cpu::convert(entries_[i].orig, entries_[i].wide);
  }
  Widen(const Widen&) = delete;
  Widen& operator=(const Widen&) = delete;

 private:
  static constexpr int kMaxOperands = 10;
  struct Entry {
    Tensor orig, wide;
    Use use = Use::read;
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
  Entry entries_[kMaxOperands];
  int count_ = 0;
};

// Checks a call's operands and runs it on their device: the CUDA backend's entry point, or the
// CPU's (with 16-bit storage widened). With an op profile active on this thread (log.profile: ops,
// kernels/op_profile.h) the call is timed under the op's name, widening included.
template <class R, class CpuCall, class CudaCall>
R run_op(const char* op, std::span<Operand> operands, CpuCall cpu_call, CudaCall cuda_call) {
  for (const Operand& o : operands) check_operand(op, o);
  const DType storage = storage_dtype(op, operands);
  const ProfileScope profiled(op);
  switch (device_of(op, operands)) {
    case Device::cpu:
      break;
    case Device::cuda:
      return cuda_call();
  }
  Widen widen(op, operands, storage);
  const cpu::CallStorage call_storage(storage);
  return cpu_call();
}

}  // namespace

// Every op of the table: its preconditions, then its operands (checked by run_op), then the call.
#if LLMTRAIN_CUDA_BACKEND
#define LT_OP_CUDA_CALL(ret, name, ...) [&] { return cuda::name(__VA_ARGS__); }
#else
#define LT_OP_CUDA_CALL(ret, name, ...) [&]() -> ret { no_cuda(#name); }
#endif
#define LT_OP(ret, name, ...)                                             \
  ret name(LT_OP_PARAMS(__VA_ARGS__)) {                                   \
    static constexpr const char* op = #name;                              \
    LT_OP_REQUIRES(__VA_ARGS__)                                           \
    Operand operands[] = {LT_OP_OPERANDS(__VA_ARGS__)};                   \
    return run_op<ret>(                                                   \
        op, operands, [&] { return cpu::name(LT_OP_ARGS(__VA_ARGS__)); }, \
        LT_OP_CUDA_CALL(ret, name, LT_OP_ARGS(__VA_ARGS__)));             \
  }
#include "kernels/op_table.def"
#undef LT_OP
#undef LT_OP_CUDA_CALL

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
  const ProfileScope profiled("copy");
  // The one op whose tensors may sit on different devices: host<->device copies land here.
  if (out.device == Device::cpu && in.device == Device::cpu) return cpu::copy(out, in);
#if LLMTRAIN_CUDA_BACKEND
  cuda::copy(out, in);
#else
  no_cuda("copy");
#endif
}

void copy_convert(Tensor out, Tensor in) {
  if (out.dtype == in.dtype) return copy(out, in);
  if (out.device == in.device) return convert(out, in);
  const bool to_host = out.device == Device::cpu;
  Buffer staged(to_host ? in.dtype : out.dtype, {in.numel()}, Device::cpu, MemoryKind::other);
  if (to_host) {
    copy(staged.tensor(), in);
    convert(out, staged.tensor());
  } else {
    convert(staged.tensor(), in);
    copy(out, staged.tensor());
  }
}

}  // namespace llmtrain::kernels
