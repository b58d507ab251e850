#include "parallel/comm/comm_mpi.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <climits>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>

#include "common/error.h"
#include "common/strings.h"
#include "kernels/dtype_convert.h"
#include "parallel/comm/mpi_check.h"
#include "parallel/comm/wait_poll.h"

namespace llmtrain::parallel {

using kernels::DType;

// What an operation is: enough to name it in a timeout or failure message, formatted only then.
struct MpiComm::Op {
  explicit Op(const char* kind, int64_t count = 0, DType dtype = DType::fp32,
              std::optional<Reduction> reduce = std::nullopt, int peer = -1, int tag = 0)
      : kind(kind), count(count), dtype(dtype), reduce(reduce), peer(peer), tag(tag) {}
  const char* kind;  // "all_reduce", "send", ...
  int64_t count;     // elements (per rank for all-gather input / reduce-scatter output)
  DType dtype;
  std::optional<Reduction> reduce;
  int peer;  // send/recv: the other rank; broadcast: the root
  int tag;
};

namespace {

// True when a collective from `in` to `out` has nothing to send: no elements, or one rank, whose
// result is its input (copied into `out` when that is another buffer).
bool nothing_to_send(int64_t n, int size, const Tensor& in, const Tensor& out) {
  if (n == 0) return true;
  if (size != 1) return false;
  if (in.data != out.data) std::memmove(out.data, in.data, out.bytes());
  return true;
}

// Reductions of bf16/fp16 run in an fp32 scratch buffer, unless they sum in 16 bits.
bool widened(DType t, const Reduction& r) { return (t == DType::bf16 || t == DType::fp16) && !r.sums_in_16_bits(t); }

MPI_Datatype element_type(DType t) {
  switch (t) {
    case DType::fp32:
      return MPI_FLOAT;
    case DType::int32:
      return MPI_INT32_T;
    case DType::int64:
      return MPI_INT64_T;
    case DType::uint8:
      return MPI_UINT8_T;
    case DType::bf16:
    case DType::fp16:
    case DType::uint16:
      return MPI_UINT16_T;  // moved as 16-bit words; summed by sum16_op or after widening
  }
  return MPI_BYTE;
}

// Accumulate::in_dtype: MPI calls these on pairs of 16-bit buffers (`inout` += `in`), each
// addition widened to fp32 and rounded once (kernels/dtype_convert.h), as NCCL adds bf16.
void add_bf16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = kernels::fp32_to_bf16(kernels::bf16_to_fp32(a[i]) + kernels::bf16_to_fp32(b[i]));
}
void add_fp16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = kernels::fp32_to_fp16(kernels::fp16_to_fp32(a[i]) + kernels::fp16_to_fp32(b[i]));
}

// The user-defined (commutative) sums of 16-bit words, created on first use by the one thread that
// calls MPI (MPI_Op_create is local); MPI_Finalize frees them.
MPI_Op sum16_op(DType t) {
  static MPI_Op bf16 = MPI_OP_NULL, fp16 = MPI_OP_NULL;
  MPI_Op& op = t == DType::bf16 ? bf16 : fp16;
  if (op == MPI_OP_NULL) LT_MPI(MPI_Op_create(t == DType::bf16 ? add_bf16 : add_fp16, 1, &op));
  return op;
}

MPI_Op mpi_op(const Reduction& r, DType t) {
  if (r.op == ReduceOp::max) return MPI_MAX;
  return r.sums_in_16_bits(t) ? sum16_op(t) : MPI_SUM;
}

// avg's division, in the reduction's type: fp32 (the widened scratch, or an fp32 buffer) or, for
// a sum in 16 bits, the 16-bit words (each quotient rounded once).
void divide(void* p, DType t, int64_t n, int size) {
  const float div = static_cast<float>(size);
  if (t == DType::fp32) {
    float* f = static_cast<float*>(p);
    for (int64_t i = 0; i < n; ++i) f[i] /= div;
    return;
  }
  auto* h = static_cast<uint16_t*>(p);
  for (int64_t i = 0; i < n; ++i)
    h[i] = t == DType::bf16 ? kernels::fp32_to_bf16(kernels::bf16_to_fp32(h[i]) / div)
                            : kernels::fp32_to_fp16(kernels::fp16_to_fp32(h[i]) / div);
}

// 16-bit floats are reduced in fp32: widened, summed, narrowed (kernels/dtype_convert.h rounds).
void widen(const void* src, DType t, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  if (t == DType::bf16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = kernels::bf16_to_fp32(s[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = kernels::fp16_to_fp32(s[i]);
  }
}

void narrow(const float* src, DType t, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  if (t == DType::bf16) {
    for (int64_t i = 0; i < n; ++i) d[i] = kernels::fp32_to_bf16(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = kernels::fp32_to_fp16(src[i]);
  }
}

bool overlap(const Tensor& a, const Tensor& b) {
  auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  return a.bytes() > 0 && b.bytes() > 0 && a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

char* at(void* base, int64_t elements, size_t element_size) {
  return static_cast<char*>(base) + static_cast<size_t>(elements) * element_size;
}

// A committed datatype of `count` elements of `base` whose extent is `stride` elements, so that
// item r of a collective lands `r * stride` elements further: the piecewise all-gather and
// all-to-all use it to address one piece of every rank's block.
MPI_Datatype strided_block(MPI_Datatype base, int count, int64_t stride, size_t element_size) {
  MPI_Datatype block, resized;
  LT_MPI(MPI_Type_contiguous(count, base, &block));
  LT_MPI(
      MPI_Type_create_resized(block, 0, static_cast<MPI_Aint>(stride * static_cast<int64_t>(element_size)), &resized));
  LT_MPI(MPI_Type_commit(&resized));
  LT_MPI(MPI_Type_free(&block));
  return resized;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// MpiWork: the requests of one operation, its scratch buffers and its finishing step.

class MpiWork final : public Work {
 public:
  MpiWork(MpiComm* comm, const MpiComm::Op& op)
      : comm_(comm),
        op_(op),
        group_(comm->name_),
        group_size_(comm->size_),
        group_rank_(comm->rank_),
        timeout_s_(comm->timeout_s_),
        owner_(comm->owner_) {}

  ~MpiWork() override {
    if (comm_) comm_->forget(this);
    if (complete_) return;
    // Not complete: MPI may still write into the scratch buffers until the job ends, so they are
    // leaked rather than freed. Outside error unwinding this is a caller bug (a handle dropped
    // before wait()); a last test tells the two apart from an operation that is just done.
    bool done_now = false;
    if (std::uncaught_exceptions() == 0) {
      try {
        done_now = advance();
      } catch (...) {
      }
    }
    if (done_now) return;
    for (auto& s : scratch_) (void)s.release();
    LT_CHECK(std::uncaught_exceptions() > 0, "{} dropped before it completed: wait() for every handle", describe());
  }

  void wait() override {
    LT_CHECK(std::this_thread::get_id() == owner_,
             "wait() for {} on group '{}' from a thread other than the one that started it (MPI runs at "
             "MPI_THREAD_FUNNELED)",
             describe(), group_);
    if (advance()) return;
    const double waited = wait_poll(
        [this] {
          const size_t before = next_;
          if (advance()) return Poll::done;
          return next_ > before ? Poll::progressed : Poll::pending;
        },
        timeout_s_, eager_seconds_for(static_cast<double>(largest_request_bytes_)));
    if (waited >= 0) return;
    std::string where = fmt::format("on group '{}'", group_);
    if (std::string_view(op_.kind) == "send" || std::string_view(op_.kind) == "recv")
      where = fmt::format("{} rank {} (world rank {}) of group '{}'",
                          std::string_view(op_.kind) == "send" ? "to" : "from", op_.peer, peer_world_rank_, group_);
    throw environment_error(fmt::format("timed out after {} waiting for {} {} ({} ranks; this is its rank {})",
                                        format_duration(timeout_s_), describe(), where, group_size_, group_rank_),
                            fmt::format("the other ranks of group '{}' did not complete it within parallel.timeout: "
                                        "one is stuck, has crashed or called a different operation (its own output "
                                        "says which); if they are only slow, raise parallel.timeout",
                                        group_));
  }

  bool done() override { return advance(); }

  // Tests the requests in order; once all completed, runs the finishing step. Never blocks.
  bool advance() {
    if (complete_) return true;
    while (next_ < requests_.size()) {
      int flag = 0;
      MPI_Status status;
      try {
        LT_MPI(MPI_Test(&requests_[next_], &flag, &status));
      } catch (const Error& e) {
        throw environment_error(fmt::format("{} (during {} on group '{}')", e.what(), describe(), group_), e.hint());
      }
      if (!flag) return false;
      if (expect_bytes_[next_] >= 0) {
        int got = 0;
        LT_MPI(MPI_Get_count(&status, MPI_BYTE, &got));
        LT_CHECK(got == expect_bytes_[next_], "{} on group '{}': received {} bytes, expected {}", describe(), group_,
                 got, expect_bytes_[next_]);
      }
      ++next_;
    }
    complete_ = true;
    if (finish_) finish_();
    scratch_.clear();
    return true;
  }

  bool complete() const { return complete_; }

  // A request moving `bytes` (per rank, for the wait's estimate of transfer time); a receive
  // also says how many bytes it must bring (checked on completion).
  MPI_Request* add_request(int64_t bytes, int64_t expect_bytes = -1) {
    requests_.push_back(MPI_REQUEST_NULL);
    expect_bytes_.push_back(expect_bytes);
    largest_request_bytes_ = std::max(largest_request_bytes_, bytes);
    return &requests_.back();
  }
  template <typename T>
  T* scratch(int64_t n) {
    scratch_.emplace_back(new std::byte[std::max<size_t>(1, static_cast<size_t>(n) * sizeof(T))]);
    return reinterpret_cast<T*>(scratch_.back().get());
  }
  void set_finish(std::function<void()> f) { finish_ = std::move(f); }
  void set_peer_world_rank(int r) { peer_world_rank_ = r; }
  void detach() { comm_ = nullptr; }
  void reserve(size_t n) {
    requests_.reserve(n);
    expect_bytes_.reserve(n);
  }

  std::string describe() const {
    std::string what = op_.kind;
    std::vector<std::string> args;
    if (op_.reduce) args.push_back(to_string(*op_.reduce, op_.dtype));
    if (std::string_view(op_.kind) != "barrier")
      args.push_back(fmt::format("{} {}", op_.count, kernels::to_string(op_.dtype)));
    if (std::string_view(op_.kind) == "broadcast") args.push_back(fmt::format("root {}", op_.peer));
    if (std::string_view(op_.kind) == "send" || std::string_view(op_.kind) == "recv")
      args.push_back(fmt::format("tag {}", op_.tag));
    return what + "(" + join(args, ", ") + ")";
  }

 private:
  MpiComm* comm_;
  MpiComm::Op op_;
  std::string group_;
  int group_size_;
  int group_rank_;
  double timeout_s_;
  std::thread::id owner_;
  int peer_world_rank_ = -1;
  // A vector may reallocate while requests are added, but MPI keeps no pointer to a request
  // handle (MPI_Request is a value), so that is safe.
  std::vector<MPI_Request> requests_;
  std::vector<int64_t> expect_bytes_;  // per request: bytes a receive must bring, or -1
  int64_t largest_request_bytes_ = 0;
  size_t next_ = 0;
  bool complete_ = false;
  std::function<void()> finish_;
  std::vector<std::unique_ptr<std::byte[]>> scratch_;
};

// ---------------------------------------------------------------------------------------------
// MpiComm

MpiComm::MpiComm(MPI_Comm comm, std::string name, double timeout_s)
    : comm_(comm),
      name_(std::move(name)),
      timeout_s_(timeout_s),
      max_count_(INT_MAX),
      owner_(std::this_thread::get_id()) {
  LT_MPI(MPI_Comm_rank(comm_, &rank_));
  LT_MPI(MPI_Comm_size(comm_, &size_));
  // World ranks of the members, once, for messages naming a peer.
  std::vector<int> mine(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) mine[static_cast<size_t>(r)] = r;
  world_ranks_.assign(static_cast<size_t>(size_), -1);
  MPI_Group group, world;
  LT_MPI(MPI_Comm_group(comm_, &group));
  LT_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world));
  LT_MPI(MPI_Group_translate_ranks(group, size_, mine.data(), world, world_ranks_.data()));
  MPI_Group_free(&world);
  MPI_Group_free(&group);
}

MpiComm::~MpiComm() {
  for (MpiWork* w : pending_) w->detach();
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF)
    MPI_Comm_free(&comm_);  // nothing to do about a failure here
}

int MpiComm::world_rank_of(int rank) const {
  return rank >= 0 && rank < size_ ? world_ranks_[static_cast<size_t>(rank)] : -1;
}

void MpiComm::set_max_count(int64_t elements) {
  LT_CHECK(elements >= 1 && elements <= INT_MAX, "max_count {}", elements);
  max_count_ = elements;
}

void MpiComm::set_timeout(double seconds) {
  LT_CHECK(seconds > 0, "timeout {} s for group {}", seconds, name_);
  timeout_s_ = seconds;
}

void MpiComm::check_thread(const char* op) const {
  LT_CHECK(std::this_thread::get_id() == owner_,
           "{} on group '{}' from a thread other than the one that created it (MPI runs at MPI_THREAD_FUNNELED)", op,
           name_);
}

void MpiComm::check_peer(int peer, const char* op) const {
  LT_CHECK(peer >= 0 && peer < size_ && peer != rank_, "{} with peer {} in group '{}' of {} ranks (this is rank {})",
           op, peer, name_, size_, rank_);
}

void MpiComm::forget(MpiWork* work) { std::erase(pending_, work); }

int64_t MpiComm::piece_elements(size_t element_size) const {
  return std::min<int64_t>(max_count_, std::max<int64_t>(1, kPieceBytes / static_cast<int64_t>(element_size)));
}

void MpiComm::progress() {
  check_thread("progress");
  for (size_t i = 0; i < pending_.size(); ++i) pending_[i]->advance();
  std::erase_if(pending_, [](MpiWork* w) { return w->complete(); });
}

std::unique_ptr<MpiWork> MpiComm::begin(const Op& op) {
  check_thread(op.kind);
  return std::make_unique<MpiWork>(this, op);
}

WorkHandle MpiComm::launch(std::unique_ptr<MpiWork> work) {
  if (!work->advance()) pending_.push_back(work.get());
  return work;
}

std::unique_ptr<Comm> MpiComm::split(int color, int key, std::string name) {
  LT_CHECK(color >= 0, "split of group {} with color {}", name_, color);
  // MPI_Comm_split blocks without a bound; a barrier that does have one comes first, so that every
  // rank is known to be here and the split itself cannot wait on a missing rank.
  barrier();
  MPI_Comm out = MPI_COMM_NULL;
  LT_MPI(MPI_Comm_split(comm_, color, key, &out));
  auto c = std::make_unique<MpiComm>(out, std::move(name), timeout_s_);
  c->max_count_ = max_count_;
  return c;
}

// --- collectives ---------------------------------------------------------------------------

WorkHandle MpiComm::all_reduce_async(Tensor buf, Reduction op) {
  LT_CHECK(buf.device == kernels::Device::cpu, "MPI all_reduce on {} memory", kernels::to_string(buf.device));
  LT_CHECK(reduce_supported(buf.dtype, op.op), "{} of {} on group {}", to_string(op, buf.dtype),
           kernels::to_string(buf.dtype), name_);
  const int64_t n = buf.numel();
  auto w = begin(Op{"all_reduce", n, buf.dtype, op});
  if (n == 0 || size_ == 1) return launch(std::move(w));

  void* target = buf.data;
  size_t esz = kernels::dtype_size(buf.dtype);
  MPI_Datatype type = element_type(buf.dtype);
  const bool wide = widened(buf.dtype, op);
  if (wide) {
    float* w32 = w->scratch<float>(n);
    widen(buf.data, buf.dtype, w32, n);
    target = w32, esz = sizeof(float), type = MPI_FLOAT;
  }
  const MPI_Op mop = mpi_op(op, buf.dtype);
  const int64_t piece = piece_elements(esz);
  w->reserve(static_cast<size_t>((n + piece - 1) / piece));
  for (int64_t o = 0; o < n; o += piece) {
    const int k = static_cast<int>(std::min(piece, n - o));
    LT_MPI(MPI_Iallreduce(MPI_IN_PLACE, at(target, o, esz), k, type, mop, comm_,
                          w->add_request(int64_t(k) * int64_t(esz))));
  }
  if (op.op == ReduceOp::avg || wide) {
    w->set_finish([buf, target, n, op, wide, size = size_] {
      if (op.op == ReduceOp::avg) divide(target, wide ? DType::fp32 : buf.dtype, n, size);
      if (wide) narrow(static_cast<const float*>(target), buf.dtype, buf.data, n);
    });
  }
  return launch(std::move(w));
}

WorkHandle MpiComm::reduce_scatter_async(Tensor in, Tensor out, Reduction op) {
  LT_CHECK(in.device == kernels::Device::cpu && out.device == kernels::Device::cpu, "MPI reduce_scatter on {} memory",
           kernels::to_string(in.device));
  LT_CHECK(in.dtype == out.dtype && in.numel() == out.numel() * size_,
           "reduce_scatter of {} {} into {} {} on group '{}' of {} ranks", in.numel(), kernels::to_string(in.dtype),
           out.numel(), kernels::to_string(out.dtype), name_, size_);
  LT_CHECK(reduce_supported(in.dtype, op.op), "{} of {} on group {}", to_string(op, in.dtype),
           kernels::to_string(in.dtype), name_);
  const int64_t n = out.numel();
  auto w = begin(Op{"reduce_scatter", n, out.dtype, op});
  if (nothing_to_send(n, size_, in, out)) return launch(std::move(w));

  const bool wide = widened(in.dtype, op);
  const MPI_Op mop = mpi_op(op, in.dtype);
  size_t esz = wide ? sizeof(float) : kernels::dtype_size(in.dtype);
  MPI_Datatype type = wide ? MPI_FLOAT : element_type(in.dtype);
  void* src = in.data;
  if (wide) {
    float* s = w->scratch<float>(in.numel());
    widen(in.data, in.dtype, s, in.numel());
    src = s;
  }
  // MPI reduces in place (MPI_IN_PLACE: the input taken from, and the result left at the start of,
  // the receive buffer) where it may use the input as its scratch: the widened copy, or `in` itself
  // when `out` is this rank's block of it (NCCL's in-place form; ZeRO reduces a slot onto its own
  // chunk). That spares a scratch result, and MPI's own temporary shrinks too (Open MPI 4.1's
  // nonblocking reduce-scatter reduces to rank 0 in a temporary: measured at one 58 MiB input, 1.5
  // inputs there out of place, 1 in place; docs/benchmarks.md). Other overlaps go through a scratch
  // result, which MPI requires.
  const bool own_block = out.data == at(in.data, int64_t(rank_) * n, esz) && !wide;
  const bool in_place = n <= max_count_ && (wide || own_block);
  void* dst = out.data;
  if (in_place)
    dst = src;
  else if (wide)
    dst = w->scratch<float>(n);
  else if (overlap(in, out))
    dst = w->scratch<std::byte>(static_cast<int64_t>(out.bytes()));

  if (in_place) {
    LT_MPI(MPI_Ireduce_scatter_block(MPI_IN_PLACE, src, static_cast<int>(n), type, mop, comm_,
                                     w->add_request(n * size_ * int64_t(esz))));
  } else if (n <= max_count_) {
    LT_MPI(MPI_Ireduce_scatter_block(src, dst, static_cast<int>(n), type, mop, comm_,
                                     w->add_request(n * size_ * int64_t(esz))));
  } else {
    // Pieces of k elements of every rank's block: pack each piece's blocks side by side so that
    // one reduce-scatter of k elements per rank reduces it.
    char* packed = reinterpret_cast<char*>(w->scratch<std::byte>(static_cast<int64_t>(esz) * n * size_));
    for (int64_t o = 0; o < n; o += max_count_) {
      const int64_t k = std::min(max_count_, n - o);
      char* piece = at(packed, o * size_, esz);
      for (int r = 0; r < size_; ++r)
        std::memcpy(at(piece, r * k, esz), at(src, r * n + o, esz), static_cast<size_t>(k) * esz);
      LT_MPI(MPI_Ireduce_scatter_block(piece, at(dst, o, esz), static_cast<int>(k), type, mop, comm_,
                                       w->add_request(k * size_ * int64_t(esz))));
    }
  }
  if (op.op == ReduceOp::avg || dst != out.data) {
    w->set_finish([out, dst, n, op, wide, size = size_] {
      if (op.op == ReduceOp::avg) divide(dst, wide ? DType::fp32 : out.dtype, n, size);
      if (wide)
        narrow(static_cast<const float*>(dst), out.dtype, out.data, n);
      else if (dst != out.data)                   // in place on rank 0, `out` is where the result already is
        std::memcpy(out.data, dst, out.bytes());  // this rank's block never overlaps block 0 (or a scratch)
    });
  }
  return launch(std::move(w));
}

WorkHandle MpiComm::all_gather_async(Tensor in, Tensor out) {
  LT_CHECK(in.device == kernels::Device::cpu && out.device == kernels::Device::cpu, "MPI all_gather on {} memory",
           kernels::to_string(in.device));
  LT_CHECK(in.dtype == out.dtype && out.numel() == in.numel() * size_,
           "all_gather of {} {} into {} {} on group '{}' of {} ranks", in.numel(), kernels::to_string(in.dtype),
           out.numel(), kernels::to_string(out.dtype), name_, size_);
  const int64_t n = in.numel();
  const size_t esz = kernels::dtype_size(in.dtype);
  auto w = begin(Op{"all_gather", n, in.dtype});
  if (nothing_to_send(n, size_, in, out)) return launch(std::move(w));
  // In place when `in` is this rank's block of `out` (ZeRO gathers updated shards that way).
  const bool in_place = in.data == at(out.data, rank_ * n, esz);
  LT_CHECK(in_place || !overlap(in, out),
           "all_gather on group '{}': input overlaps the output but is not this "
           "rank's block of it",
           name_);
  const MPI_Datatype type = element_type(in.dtype);
  if (n <= max_count_) {
    LT_MPI(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.data, static_cast<int>(n), type, out.data, static_cast<int>(n),
                          type, comm_, w->add_request(n * size_ * int64_t(esz))));
  } else {
    for (int64_t o = 0; o < n; o += max_count_) {
      const int k = static_cast<int>(std::min(max_count_, n - o));
      MPI_Datatype block = strided_block(type, k, n, esz);
      LT_MPI(MPI_Iallgather(in_place ? MPI_IN_PLACE : at(in.data, o, esz), k, type, at(out.data, o, esz), 1, block,
                            comm_, w->add_request(int64_t(k) * size_ * int64_t(esz))));
      LT_MPI(MPI_Type_free(&block));  // pending operations keep what they need
    }
  }
  return launch(std::move(w));
}

WorkHandle MpiComm::broadcast_async(Tensor buf, int root) {
  LT_CHECK(buf.device == kernels::Device::cpu, "MPI broadcast on {} memory", kernels::to_string(buf.device));
  LT_CHECK(root >= 0 && root < size_, "broadcast from rank {} in group '{}' of {} ranks", root, name_, size_);
  const int64_t n = buf.numel();
  const size_t esz = kernels::dtype_size(buf.dtype);
  auto w = begin(Op{"broadcast", n, buf.dtype, std::nullopt, root});
  if (n == 0 || size_ == 1) return launch(std::move(w));
  const int64_t piece = piece_elements(esz);
  for (int64_t o = 0; o < n; o += piece) {
    const int k = static_cast<int>(std::min(piece, n - o));
    LT_MPI(MPI_Ibcast(at(buf.data, o, esz), k, element_type(buf.dtype), root, comm_,
                      w->add_request(int64_t(k) * int64_t(esz))));
  }
  return launch(std::move(w));
}

WorkHandle MpiComm::all_to_all_async(Tensor in, Tensor out) {
  LT_CHECK(in.device == kernels::Device::cpu && out.device == kernels::Device::cpu, "MPI all_to_all on {} memory",
           kernels::to_string(in.device));
  LT_CHECK(in.dtype == out.dtype && in.numel() == out.numel() && in.numel() % size_ == 0,
           "all_to_all of {} {} into {} {} on group '{}' of {} ranks", in.numel(), kernels::to_string(in.dtype),
           out.numel(), kernels::to_string(out.dtype), name_, size_);
  const int64_t n = in.numel() / size_;
  const size_t esz = kernels::dtype_size(in.dtype);
  auto w = begin(Op{"all_to_all", n, in.dtype});
  if (nothing_to_send(n, size_, in, out)) return launch(std::move(w));
  void* src = in.data;
  if (overlap(in, out)) {
    src = w->scratch<std::byte>(static_cast<int64_t>(in.bytes()));
    std::memcpy(src, in.data, in.bytes());
  }
  const MPI_Datatype type = element_type(in.dtype);
  if (n <= max_count_) {
    LT_MPI(MPI_Ialltoall(src, static_cast<int>(n), type, out.data, static_cast<int>(n), type, comm_,
                         w->add_request(n * size_ * int64_t(esz))));
  } else {
    for (int64_t o = 0; o < n; o += max_count_) {
      const int k = static_cast<int>(std::min(max_count_, n - o));
      MPI_Datatype block = strided_block(type, k, n, esz);
      LT_MPI(MPI_Ialltoall(at(src, o, esz), 1, block, at(out.data, o, esz), 1, block, comm_,
                           w->add_request(int64_t(k) * size_ * int64_t(esz))));
      LT_MPI(MPI_Type_free(&block));
    }
  }
  return launch(std::move(w));
}

WorkHandle MpiComm::barrier_async() {
  auto w = begin(Op{"barrier"});
  if (size_ > 1) LT_MPI(MPI_Ibarrier(comm_, w->add_request(0)));
  return launch(std::move(w));
}

// --- point-to-point ------------------------------------------------------------------------

WorkHandle MpiComm::send_async(Tensor buf, int peer, int tag) { return transfer(true, buf, peer, tag); }
WorkHandle MpiComm::recv_async(Tensor buf, int peer, int tag) { return transfer(false, buf, peer, tag); }

WorkHandle MpiComm::transfer(bool send, Tensor buf, int peer, int tag) {
  const char* op = send ? "send" : "recv";
  LT_CHECK(buf.device == kernels::Device::cpu, "MPI {} on {} memory", op, kernels::to_string(buf.device));
  check_peer(peer, op);
  const int64_t n = buf.numel();
  const size_t esz = kernels::dtype_size(buf.dtype);
  auto w = begin(Op{op, n, buf.dtype, std::nullopt, peer, tag});
  w->set_peer_world_rank(world_rank_of(peer));
  // Pieces between the same two ranks with the same tag arrive in order (MPI's non-overtaking rule).
  const int64_t piece = piece_elements(esz);
  for (int64_t o = 0; o < n; o += piece) {
    const int k = static_cast<int>(std::min(piece, n - o));
    const int64_t bytes = int64_t(k) * int64_t(esz);
    if (send)
      LT_MPI(MPI_Isend(at(buf.data, o, esz), k, element_type(buf.dtype), peer, tag, comm_,
                       w->add_request(int64_t(k) * int64_t(esz))));
    else
      LT_MPI(
          MPI_Irecv(at(buf.data, o, esz), k, element_type(buf.dtype), peer, tag, comm_, w->add_request(bytes, bytes)));
  }
  return launch(std::move(w));
}

std::unique_ptr<MpiComm> make_mpi_world_comm(double timeout_s, std::string name) {
  // MPI_Comm_idup, so that even the duplication is a bounded wait.
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  LT_MPI(MPI_Comm_idup(MPI_COMM_WORLD, &dup, &req));
  const double waited = wait_poll(
      [&] {
        int flag = 0;
        LT_MPI(MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
        return flag ? Poll::done : Poll::pending;
      },
      timeout_s);
  if (waited < 0)
    throw environment_error(
        fmt::format("timed out after {} waiting for every rank to create the '{}' communicator (MPI_Comm_idup of "
                    "MPI_COMM_WORLD)",
                    format_duration(timeout_s), name),
        "a rank did not start or is stuck before communication began; check its output");
  return std::make_unique<MpiComm>(dup, std::move(name), timeout_s);
}

}  // namespace llmtrain::parallel
