// MpiComm under mpirun (2, 3 and 4 ranks): every operation, on sizes 0, 1, a prime and a few MB,
// for every dtype it supports, against a naive computation of what each rank must end with. Every
// rank generates every rank's input from a hash (mpi_test_env.h), so the expected result needs
// no communication. Values are small integers so that sums are exact in every dtype, and the
// expected value of avg is an exact multiple; the one test with arbitrary floats compares by
// relative norm and checks that every rank got bitwise the same result.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common/error.h"
#include "kernels/dtype_convert.h"
#include "tests/parallel/mpi_test_env.h"

namespace llmtrain::parallel {
namespace {

using kernels::host_tensor;

using kernels::DType;
using mpitest::small_int;
using mpitest::world;

constexpr int64_t kLarge = (1 << 20) + 7;      // ~4 MB of fp32: an all-reduce / broadcast / send buffer
constexpr int64_t kLargeEach = (1 << 18) + 3;  // per rank, for gathers and scatters (~1 MB each)
constexpr int64_t kPrime = 1009;

// A host buffer of any dtype, read and written as doubles (exact for the values used here).
class Buffer {
 public:
  Buffer(DType dtype, int64_t n)
      : dtype_(dtype), n_(n), bytes_(static_cast<size_t>(n) * kernels::dtype_size(dtype) + 1) {}
  Tensor tensor() { return Tensor(bytes_.data(), dtype_, {n_}); }
  Tensor flat(int64_t offset, int64_t count) { return tensor().flat(offset, count); }
  int64_t size() const { return n_; }

  void set(int64_t i, double v) {
    void* p = bytes_.data() + static_cast<size_t>(i) * kernels::dtype_size(dtype_);
    switch (dtype_) {
      case DType::fp32:
        *static_cast<float*>(p) = static_cast<float>(v);
        break;
      case DType::int32:
        *static_cast<int32_t*>(p) = static_cast<int32_t>(v);
        break;
      case DType::int64:
        *static_cast<int64_t*>(p) = static_cast<int64_t>(v);
        break;
      case DType::uint8:
        *static_cast<uint8_t*>(p) = static_cast<uint8_t>(v);
        break;
      case DType::uint16:
        *static_cast<uint16_t*>(p) = static_cast<uint16_t>(v);
        break;
      // bf16 is the top half of an fp32; the values used have at most 8 significant bits.
      case DType::bf16:
        *static_cast<uint16_t*>(p) = static_cast<uint16_t>(std::bit_cast<uint32_t>(float(v)) >> 16);
        break;
      case DType::fp16:
        *static_cast<_Float16*>(p) = static_cast<_Float16>(v);
        break;
    }
  }
  double get(int64_t i) const {
    const void* p = bytes_.data() + static_cast<size_t>(i) * kernels::dtype_size(dtype_);
    switch (dtype_) {
      case DType::fp32:
        return *static_cast<const float*>(p);
      case DType::int32:
        return *static_cast<const int32_t*>(p);
      case DType::int64:
        return static_cast<double>(*static_cast<const int64_t*>(p));
      case DType::uint8:
        return *static_cast<const uint8_t*>(p);
      case DType::uint16:
        return *static_cast<const uint16_t*>(p);
      case DType::bf16:
        return std::bit_cast<float>(uint32_t(*static_cast<const uint16_t*>(p)) << 16);
      case DType::fp16:
        return static_cast<double>(*static_cast<const _Float16*>(p));
    }
    return 0;
  }

 private:
  DType dtype_;
  int64_t n_;
  std::vector<std::byte> bytes_;
};

// Rank r's i-th input value for a dtype: small enough that a sum over 4 ranks is exact.
double value(DType t, uint64_t seed, int r, int64_t i) {
  switch (t) {
    case DType::fp32:
      return double(small_int(seed, r, i, -1000, 1000));
    case DType::int32:
      return double(small_int(seed, r, i, -1000000, 1000000));
    case DType::int64:
      return double(small_int(seed, r, i, -(int64_t(1) << 40), int64_t(1) << 40));  // > 32 bits
    case DType::uint8:
      return double(small_int(seed, r, i, 0, 60));
    case DType::uint16:
      return double(small_int(seed, r, i, 0, 16000));
    case DType::bf16:
      return double(small_int(seed, r, i, -32, 32));
    case DType::fp16:
      return double(small_int(seed, r, i, -100, 100));
  }
  return 0;
}

double reduce_naive(DType t, ReduceOp op, uint64_t seed, int size, int64_t i, double scale) {
  double acc = op == ReduceOp::max ? -INFINITY : 0;
  for (int r = 0; r < size; ++r) {
    double v = value(t, seed, r, i) * scale;
    acc = op == ReduceOp::max ? std::max(acc, v) : acc + v;
  }
  return op == ReduceOp::avg ? acc / size : acc;
}

// Counts mismatches of `got` against `want(i)`, and reports the first one.
template <typename Want>
void expect_all(const Buffer& got, int64_t count, Want want, const std::string& what, int64_t offset = 0) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < count; ++i)
    if (got.get(offset + i) != want(i)) {
      if (first < 0) first = i;
      ++bad;
    }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << count << " elements wrong on rank " << world().rank()
                    << "; first at " << first << ": got " << (first >= 0 ? got.get(offset + first) : 0) << ", want "
                    << (first >= 0 ? want(first) : 0);
}

std::string label(const char* op, DType t, int64_t n) { return fmt::format("{} {} x{}", op, kernels::to_string(t), n); }

bool is_float(DType t) { return t == DType::fp32 || t == DType::bf16 || t == DType::fp16; }

const std::vector<int64_t>& sizes_for(DType t, bool per_rank) {
  static const std::vector<int64_t> full{0, 1, kPrime, kLarge}, full_each{0, 1, kPrime, kLargeEach},
      small{0, 1, kPrime, 4099};
  bool large = t == DType::fp32 || t == DType::int64 || t == DType::bf16;
  return large ? (per_rank ? full_each : full) : small;
}

const DType kAllDtypes[] = {DType::fp32,  DType::bf16,  DType::fp16,  DType::int32,
                            DType::int64, DType::uint8, DType::uint16};

// ---------------------------------------------------------------------------------------------

void check_all_reduce(Comm& c, DType t, Reduction op, int64_t n, uint64_t seed) {
  const double scale = op.op == ReduceOp::avg ? c.size() : 1;  // avg of multiples of the size is exact
  Buffer b(t, n);
  for (int64_t i = 0; i < n; ++i) b.set(i, value(t, seed, c.rank(), i) * scale);
  c.all_reduce(b.tensor(), op);
  expect_all(
      b, n, [&](int64_t i) { return reduce_naive(t, op.op, seed, c.size(), i, scale); },
      label("all_reduce", t, n) + " " + to_string(op, t));
}

TEST(MpiComm, AllReduceEveryDtypeOpAndSize) {
  for (DType t : kAllDtypes)
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
      if (op == ReduceOp::avg && !is_float(t)) continue;
      for (int64_t n : sizes_for(t, false)) check_all_reduce(world(), t, op, n, 11);
    }
}

void check_reduce_scatter(Comm& c, DType t, Reduction op, int64_t n, uint64_t seed, bool in_place) {
  const int p = c.size();
  const double scale = op.op == ReduceOp::avg ? p : 1;
  Buffer in(t, n * p), separate(t, n);
  for (int64_t i = 0; i < n * p; ++i) in.set(i, value(t, seed, c.rank(), i) * scale);
  // In place: the result lands on this rank's own block of the input (as ZeRO does).
  Tensor out = in_place ? in.flat(c.rank() * n, n) : separate.tensor();
  c.reduce_scatter(in.tensor(), out, op);
  const Buffer& got = in_place ? in : separate;
  expect_all(
      got, n, [&](int64_t i) { return reduce_naive(t, op.op, seed, p, c.rank() * n + i, scale); },
      label("reduce_scatter", t, n) + " " + to_string(op, t) + (in_place ? " in place" : ""),
      in_place ? c.rank() * n : 0);
}

TEST(MpiComm, ReduceScatter) {
  for (DType t : {DType::fp32, DType::bf16, DType::int64, DType::uint8})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
      if (op == ReduceOp::avg && !is_float(t)) continue;
      for (int64_t n : sizes_for(t, true)) check_reduce_scatter(world(), t, op, n, 12, false);
    }
  // In place (MPI_IN_PLACE on `in` itself; bf16 widened in place in its fp32 copy), blocks larger
  // than a piece (kPieceBytes) too.
  for (DType t : {DType::fp32, DType::bf16, DType::int64})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
      if (op == ReduceOp::avg && !is_float(t)) continue;
      for (int64_t n : {int64_t(1), kPrime, kLargeEach}) check_reduce_scatter(world(), t, op, n, 13, true);
    }
}

// Accumulate::in_dtype (parallel.grad_reduce_dtype: bf16): the 16-bit words go through the user-
// defined MPI sum. The small integers above sum exactly at every partial sum, so the naive result
// holds at every size (the large ones go in pieces). Not bf16's avg: its inputs, scaled by the
// group size, sum past 256, where bf16 holds only even integers (SixteenBitSumsRoundEveryAddition
// checks its division).
TEST(MpiComm, SixteenBitSumsInSixteenBitsAtEverySize) {
  for (DType t : {DType::bf16, DType::fp16})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      if (t == DType::bf16 && op == ReduceOp::avg) continue;
      const Reduction r(op, Accumulate::in_dtype);
      for (int64_t n : sizes_for(t, false)) check_all_reduce(world(), t, r, n, 41);
      for (int64_t n : sizes_for(t, true)) check_reduce_scatter(world(), t, r, n, 42, false);
      check_reduce_scatter(world(), t, r, kPrime, 43, true);
    }
}

// Values whose partial sums round: in 16 bits every order of additions gives one result, and it
// differs from the fp32 sum rounded once (found by trying every order). bf16 has 8 significant bits.
TEST(MpiComm, SixteenBitSumsRoundEveryAddition) {
  const int p = world().size();
  // Per group size: each rank's value, the sum in bf16 (any order), the fp32 sum rounded once.
  struct Case {
    float values[4];
    float in_bf16, once;
  };
  const Case cases[] = {{{1.0f, 2.0f}, 3.0f, 3.0f},  // two ranks: one addition, one rounding either way
                        {{1.0f, 0x1p-8f, 256.0f}, 256.0f, 258.0f},
                        {{1.0f, 1.0f, 1.0078125f, 0x1p-9f}, 3.0f, 3.015625f}};
  ASSERT_GE(p, 2);
  ASSERT_LE(p, 4);
  const Case& c = cases[p - 2];
  const uint16_t mine = kernels::fp32_to_bf16(c.values[world().rank()]);
  for (Accumulate a : {Accumulate::in_dtype, Accumulate::fp32}) {
    SCOPED_TRACE(to_string(a));
    const float want = a == Accumulate::in_dtype ? c.in_bf16 : c.once;
    std::vector<uint16_t> buf(5, mine), in(size_t(p) * 3, mine), out(3);
    world().all_reduce(Tensor(buf.data(), DType::bf16, {5}), Reduction(ReduceOp::sum, a));
    for (uint16_t x : buf) EXPECT_EQ(kernels::bf16_to_fp32(x), want);
    world().reduce_scatter(Tensor(in.data(), DType::bf16, {p * 3}), Tensor(out.data(), DType::bf16, {3}),
                           Reduction(ReduceOp::sum, a));
    for (uint16_t x : out) EXPECT_EQ(kernels::bf16_to_fp32(x), want);
    // avg: the 16-bit sum divided, rounded again.
    std::vector<uint16_t> avg(2, mine);
    world().all_reduce(Tensor(avg.data(), DType::bf16, {2}), Reduction(ReduceOp::avg, a));
    const float want_avg = a == Accumulate::in_dtype
                               ? kernels::bf16_to_fp32(kernels::fp32_to_bf16(want / float(p)))
                               : kernels::bf16_to_fp32(kernels::fp32_to_bf16(
                                     (c.values[0] + c.values[1] + c.values[2] + c.values[3]) / float(p)));
    for (uint16_t x : avg) EXPECT_EQ(kernels::bf16_to_fp32(x), want_avg);
  }
}

void check_all_gather(Comm& c, DType t, int64_t n, uint64_t seed, bool in_place) {
  const int p = c.size();
  Buffer in(t, n), out(t, n * p);
  Tensor src = in.tensor();
  if (in_place) src = out.flat(c.rank() * n, n);  // this rank's block of the output
  for (int64_t i = 0; i < n; ++i)
    (in_place ? out : in).set((in_place ? c.rank() * n : 0) + i, value(t, seed, c.rank(), i));
  c.all_gather(src, out.tensor());
  expect_all(
      out, n * p,
      [&](int64_t i) { return value(t, seed, int(i / std::max<int64_t>(n, 1)), i % std::max<int64_t>(n, 1)); },
      label("all_gather", t, n) + (in_place ? " in place" : ""));
}

TEST(MpiComm, AllGather) {
  for (DType t : {DType::fp32, DType::bf16, DType::int64, DType::uint8})
    for (int64_t n : sizes_for(t, true)) check_all_gather(world(), t, n, 14, false);
  for (int64_t n : {int64_t(1), kPrime}) check_all_gather(world(), DType::fp32, n, 15, true);
}

void check_broadcast(Comm& c, DType t, int64_t n, int root, uint64_t seed) {
  Buffer b(t, n);
  for (int64_t i = 0; i < n; ++i) b.set(i, value(t, seed, c.rank(), i));
  c.broadcast(b.tensor(), root);
  expect_all(
      b, n, [&](int64_t i) { return value(t, seed, root, i); },
      label("broadcast", t, n) + fmt::format(" root {}", root));
}

TEST(MpiComm, Broadcast) {
  for (DType t : {DType::fp32, DType::int32, DType::uint8})
    for (int64_t n : sizes_for(t, false))
      for (int root : {0, world().size() - 1}) check_broadcast(world(), t, n, root, 16);
}

void check_ring(Comm& c, DType t, int64_t n, uint64_t seed) {
  // Each rank sends to the next and receives from the previous: both posted before either
  // waits, so no ordering of blocking calls is needed.
  const int p = c.size(), next = (c.rank() + 1) % p, prev = (c.rank() + p - 1) % p;
  Buffer out(t, n), in(t, n);
  for (int64_t i = 0; i < n; ++i) out.set(i, value(t, seed, c.rank(), i));
  auto r = c.recv_async(in.tensor(), prev, 7);
  auto s = c.send_async(out.tensor(), next, 7);
  s->wait();
  r->wait();
  expect_all(
      in, n, [&](int64_t i) { return value(t, seed, prev, i); }, label("send/recv ring", t, n));
}

TEST(MpiComm, SendRecvRing) {
  for (DType t : {DType::fp32, DType::int64, DType::uint8})
    for (int64_t n : sizes_for(t, false)) check_ring(world(), t, n, 17);
}

TEST(MpiComm, SendRecvTagsMatchOutOfOrder) {
  // Rank 0 sends two messages with different tags; rank 1 receives them in the opposite order.
  MpiComm& c = world();
  if (c.rank() > 1) return;
  Buffer a(DType::int32, 5), b(DType::int32, 3);
  if (c.rank() == 0) {
    for (int i = 0; i < 5; ++i) a.set(i, 100 + i);
    for (int i = 0; i < 3; ++i) b.set(i, 200 + i);
    auto s1 = c.send_async(a.tensor(), 1, 1);
    auto s2 = c.send_async(b.tensor(), 1, 2);
    s1->wait();
    s2->wait();
  } else {
    c.recv(b.tensor(), 0, 2);
    c.recv(a.tensor(), 0, 1);
    expect_all(
        a, 5, [](int64_t i) { return 100.0 + i; }, "tag 1");
    expect_all(
        b, 3, [](int64_t i) { return 200.0 + i; }, "tag 2");
  }
}

void check_all_to_all(Comm& c, DType t, int64_t n, uint64_t seed, bool in_place) {
  const int p = c.size();
  Buffer in(t, n * p), separate(t, n * p);
  for (int64_t i = 0; i < n * p; ++i) in.set(i, value(t, seed, c.rank(), i));
  Buffer& out = in_place ? in : separate;
  c.all_to_all(in.tensor(), out.tensor());
  // Block r of the output is rank r's block `rank` of its input.
  expect_all(
      out, n * p,
      [&](int64_t i) {
        int64_t r = i / std::max<int64_t>(n, 1), j = i % std::max<int64_t>(n, 1);
        return value(t, seed, int(r), c.rank() * n + j);
      },
      label("all_to_all", t, n) + (in_place ? " in place" : ""));
}

TEST(MpiComm, AllToAll) {
  for (DType t : {DType::fp32, DType::int64, DType::uint8})
    for (int64_t n : sizes_for(t, true)) check_all_to_all(world(), t, n, 18, false);
  check_all_to_all(world(), DType::fp32, kPrime, 19, true);
}

TEST(MpiComm, BarrierOrdersSideEffects) {
  // Rank 0 writes a file before the barrier; every rank sees it after.
  MpiComm& c = world();
  int64_t token = getpid();
  c.broadcast(Tensor(&token, DType::int64, {1}), 0);
  auto path = std::filesystem::temp_directory_path() / fmt::format("llmtrain-barrier-{}", token);
  if (c.rank() == 0) std::ofstream(path) << "here";
  c.barrier();
  EXPECT_TRUE(std::filesystem::exists(path)) << "rank " << c.rank() << " passed the barrier before rank 0 wrote";
  c.barrier();
  if (c.rank() == 0) std::filesystem::remove(path);
}

TEST(MpiComm, ArbitraryFloatsAgreeBitwiseOnEveryRank) {
  MpiComm& c = world();
  const int64_t n = 100003;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = mpitest::unit_float(20, c.rank(), i) * 1e3f;
  c.all_reduce(host_tensor(x.data(), {n}), ReduceOp::avg);
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    double want = 0;
    for (int r = 0; r < c.size(); ++r) want += double(mpitest::unit_float(20, r, i) * 1e3f);
    want /= c.size();
    num += (x[i] - want) * (x[i] - want);
    den += want * want;
  }
  EXPECT_LE(std::sqrt(num / den), 1e-6);
  std::vector<float> all(n * c.size());
  c.all_gather(host_tensor(x.data(), {n}), host_tensor(all.data(), {n * c.size()}));
  for (int r = 0; r < c.size(); ++r)
    EXPECT_EQ(std::memcmp(all.data() + r * n, x.data(), n * sizeof(float)), 0)
        << "rank " << r << "'s average differs from rank " << c.rank() << "'s";

  // The same in bf16 summed in bf16 (the user-defined op): within bf16's rounding of each of the
  // size - 1 additions and the division, and bitwise the same everywhere (model replicas stay equal).
  std::vector<uint16_t> h(n);
  for (int64_t i = 0; i < n; ++i) h[i] = kernels::fp32_to_bf16(mpitest::unit_float(20, c.rank(), i) * 1e3f);
  c.all_reduce(Tensor(h.data(), DType::bf16, {n}), Reduction(ReduceOp::avg, Accumulate::in_dtype));
  num = den = 0;
  for (int64_t i = 0; i < n; ++i) {
    double want = 0;
    for (int r = 0; r < c.size(); ++r)
      want += kernels::bf16_to_fp32(kernels::fp32_to_bf16(mpitest::unit_float(20, r, i) * 1e3f));
    want /= c.size();
    const double got = kernels::bf16_to_fp32(h[i]);
    num += (got - want) * (got - want);
    den += want * want;
  }
  EXPECT_LE(std::sqrt(num / den), c.size() * 0x1p-8);
  std::vector<uint16_t> all16(n * c.size());
  c.all_gather(Tensor(h.data(), DType::bf16, {n}), Tensor(all16.data(), DType::bf16, {n * c.size()}));
  for (int r = 0; r < c.size(); ++r)
    EXPECT_EQ(std::memcmp(all16.data() + r * n, h.data(), n * sizeof(uint16_t)), 0)
        << "rank " << r << "'s bf16 average differs from rank " << c.rank() << "'s";
}

// The piecewise path for counts beyond INT_MAX, run on small buffers by lowering max_count.
TEST(MpiComm, CountsBeyondOneMpiCallGoInPieces) {
  auto c = make_mpi_world_comm(30.0, "pieces");
  c->set_max_count(1000);
  const int64_t n = 2503;  // three pieces, the last partial
  for (DType t : {DType::fp32, DType::bf16, DType::int64}) check_all_reduce(*c, t, ReduceOp::sum, n, 21);
  check_all_reduce(*c, DType::fp32, ReduceOp::avg, n, 22);
  for (DType t : {DType::fp32, DType::bf16}) check_reduce_scatter(*c, t, ReduceOp::sum, n, 23, false);
  check_reduce_scatter(*c, DType::fp32, ReduceOp::avg, n, 24, true);
  check_reduce_scatter(*c, DType::bf16, Reduction(ReduceOp::sum, Accumulate::in_dtype), n, 29, false);
  for (DType t : {DType::fp32, DType::uint8}) check_all_gather(*c, t, n, 25, false);
  check_all_gather(*c, DType::fp32, n, 26, true);
  check_broadcast(*c, DType::int32, n, c->size() - 1, 27);
  check_ring(*c, DType::fp32, n, 28);
  check_all_to_all(*c, DType::int64, n, 29, false);
  check_all_to_all(*c, DType::fp32, n, 30, true);
  // A split communicator keeps the limit.
  auto half = c->split(c->rank() % 2, c->rank(), "half");
  EXPECT_EQ(static_cast<MpiComm&>(*half).max_count(), 1000);
  check_all_reduce(*half, DType::fp32, ReduceOp::sum, n, 31);
}

TEST(MpiComm, AsyncOperationsCompleteThroughProgressWhileTheCallerComputes) {
  MpiComm& c = world();
  const int p = c.size();
  Buffer a(DType::fp32, kLarge), b(DType::fp32, kPrime), g_in(DType::int64, kPrime), g_out(DType::int64, kPrime * p),
      bc(DType::uint8, 4099);
  for (int64_t i = 0; i < kLarge; ++i) a.set(i, value(DType::fp32, 40, c.rank(), i));
  for (int64_t i = 0; i < kPrime; ++i) b.set(i, value(DType::fp32, 41, c.rank(), i) * p);
  for (int64_t i = 0; i < kPrime; ++i) g_in.set(i, value(DType::int64, 42, c.rank(), i));
  for (int64_t i = 0; i < 4099; ++i) bc.set(i, value(DType::uint8, 43, c.rank(), i));

  std::vector<WorkHandle> works;
  works.push_back(c.all_reduce_async(a.tensor(), ReduceOp::sum));
  works.push_back(c.all_reduce_async(b.tensor(), ReduceOp::avg));
  works.push_back(c.all_gather_async(g_in.tensor(), g_out.tensor()));
  works.push_back(c.broadcast_async(bc.tensor(), 0));
  works.push_back(c.barrier_async());

  // "Compute" while polling progress(); the operations must complete without any wait().
  volatile double sink = 0;
  bool all_done = false;
  for (int round = 0; round < 2000000 && !all_done; ++round) {
    for (int k = 0; k < 2000; ++k) sink = sink + std::sqrt(double(k));
    c.progress();
    all_done = true;
    for (auto& w : works) all_done = all_done && w->done();
    if (!all_done && round > 1000) usleep(100);
  }
  EXPECT_TRUE(all_done) << "asynchronous operations did not complete through progress()";
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();  // any order, after done

  expect_all(
      a, kLarge, [&](int64_t i) { return reduce_naive(DType::fp32, ReduceOp::sum, 40, p, i, 1); }, "async a");
  expect_all(
      b, kPrime, [&](int64_t i) { return reduce_naive(DType::fp32, ReduceOp::avg, 41, p, i, p); }, "async b");
  expect_all(
      g_out, kPrime * p, [&](int64_t i) { return value(DType::int64, 42, int(i / kPrime), i % kPrime); },
      "async gather");
  expect_all(
      bc, 4099, [&](int64_t i) { return value(DType::uint8, 43, 0, i); }, "async broadcast");
}

TEST(MpiComm, NamesAndTimeoutsAreInherited) {
  MpiComm& c = world();
  EXPECT_EQ(c.name(), "world");
  auto d = make_mpi_world_comm(30.0, "dup");
  d->set_timeout(7.5);
  auto s = d->split(0, c.rank(), "all");
  EXPECT_EQ(s->name(), "all");
  EXPECT_EQ(s->size(), c.size());
  EXPECT_EQ(s->rank(), c.rank());
  EXPECT_DOUBLE_EQ(s->timeout(), 7.5);
  EXPECT_EQ(d->world_rank_of(c.size() - 1), c.size() - 1);
  // Errors come back as codes on derived communicators too (LT_MPI needs it).
  MPI_Errhandler h;
  MPI_Comm_get_errhandler(static_cast<MpiComm&>(*s).handle(), &h);
  EXPECT_EQ(h, MPI_ERRORS_RETURN);
  MPI_Errhandler_free(&h);
}

}  // namespace
}  // namespace llmtrain::parallel
