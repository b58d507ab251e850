// Device tensors for the device communicators' tests (test_comm_staged_sim.cpp, test_comm_nccl_sim.cpp):
// a rank's distinct values, their copy on the device in a storage dtype, and back to the host in fp32;
// and the check both communicators pass, collective by collective against the host communicator.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/ops.h"
#include "parallel/comm/comm.h"

namespace llmtrain::parallel::test {

// n values that differ by rank and index.
inline std::vector<float> values(int rank, int n, float base) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = base + float(rank) * 0.25f + float(i) * 0.125f;
  return v;
}

// `v` on the device in `dtype` (rounded once from fp32).
inline kernels::Buffer on_device(const std::vector<float>& v, kernels::DType dtype = kernels::DType::fp32) {
  const int64_t n = int64_t(v.size());
  kernels::Buffer wide(kernels::DType::fp32, {n}), narrow(dtype, {n}), d(dtype, {n}, kernels::Device::cuda);
  kernels::copy(wide.tensor(), kernels::host_tensor(const_cast<float*>(v.data()), {n}));
  kernels::convert(narrow.tensor(), wide.tensor());
  kernels::copy(d.tensor(), narrow.tensor());
  return d;
}

// A device buffer's values, widened to fp32 on the host.
inline std::vector<float> to_host(const kernels::Buffer& b) {
  const int64_t n = b.numel();
  kernels::Buffer narrow(b.dtype(), {n}), wide(kernels::DType::fp32, {n});
  kernels::copy(narrow.tensor(), b.tensor());
  kernels::convert(wide.tensor(), narrow.tensor());
  const float* p = wide.tensor().ptr<float>();
  return std::vector<float>(p, p + n);
}

// Every collective of `device` (all-reduce, reduce-scatter, all-gather, broadcast from rank 1,
// all-to-all) on device tensors gives bitwise what `host`, the same ranks' host communicator, gives
// on the same values. Called by every rank.
inline void expect_collectives_match_host(Comm& device, Comm& host) {
  using kernels::Buffer, kernels::Device, kernels::DType, kernels::host_tensor;
  constexpr int kN = 12;
  const int r = device.rank(), ranks = device.size();
  std::vector<float> h = values(r, kN, 1.0f);
  Buffer d = on_device(h);
  device.all_reduce_async(d.tensor(), ReduceOp::sum)->wait();
  host.all_reduce(host_tensor(h.data(), {kN}), ReduceOp::sum);
  EXPECT_EQ(to_host(d), h) << "all_reduce";
  std::vector<float> in = values(r, kN * ranks, 2.0f), out(kN);
  Buffer din = on_device(in), dout(DType::fp32, {kN}, Device::cuda);
  device.reduce_scatter_async(din.tensor(), dout.tensor(), ReduceOp::avg)->wait();
  host.reduce_scatter(host_tensor(in.data(), {kN * ranks}), host_tensor(out.data(), {kN}), ReduceOp::avg);
  EXPECT_EQ(to_host(dout), out) << "reduce_scatter";
  std::vector<float> mine = values(r, kN, 3.0f), all(size_t(kN * ranks));
  Buffer dmine = on_device(mine), dall(DType::fp32, {kN * ranks}, Device::cuda);
  device.all_gather_async(dmine.tensor(), dall.tensor())->wait();
  host.all_gather(host_tensor(mine.data(), {kN}), host_tensor(all.data(), {kN * ranks}));
  EXPECT_EQ(to_host(dall), all) << "all_gather";
  Buffer db = on_device(values(r, kN, 4.0f));
  device.broadcast_async(db.tensor(), 1)->wait();
  EXPECT_EQ(to_host(db), values(1, kN, 4.0f)) << "broadcast";
  std::vector<float> a = values(r, kN * ranks, 5.0f), a_out(size_t(kN * ranks));
  Buffer da = on_device(a), da_out(DType::fp32, {kN * ranks}, Device::cuda);
  device.all_to_all_async(da.tensor(), da_out.tensor())->wait();
  host.all_to_all(host_tensor(a.data(), {kN * ranks}), host_tensor(a_out.data(), {kN * ranks}));
  EXPECT_EQ(to_host(da_out), a_out) << "all_to_all";
}

}  // namespace llmtrain::parallel::test
