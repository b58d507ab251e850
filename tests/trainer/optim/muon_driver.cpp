// A test tool: Muon steps of one matrix (trainer/optim/muon.h) on inputs a reference wrote, for
// tests/trainer/optim/muon_torch.py, which runs torch.optim.Muon on the same inputs.
//   muon_driver DEVICE NS_DTYPE ADJUST NESTEROV LR WD MOMENTUM STEPS ROWS COLS IN OUT
// DEVICE cpu | cuda; NS_DTYPE fp32 | bf16; ADJUST original | match_rms_adamw; NESTEROV 0 | 1.
// IN: float32, the parameter [ROWS, COLS] and then STEPS gradients of that shape. OUT: float32,
// the parameter after each step.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/ops.h"
#include "trainer/optim/muon.h"

namespace k = llmtrain::kernels;
using llmtrain::MuonAdjustLr;
using llmtrain::trainer::MuonSettings;

int main(int argc, char** argv) try {
  if (argc != 13) {
    std::fprintf(stderr, "usage: muon_driver DEVICE NS_DTYPE ADJUST NESTEROV LR WD MOMENTUM STEPS ROWS COLS IN OUT\n");
    return 2;
  }
  const std::string device = argv[1], ns = argv[2], adjust = argv[3];
  MuonSettings s;
  s.ns_dtype = ns == "bf16" ? k::DType::bf16 : k::DType::fp32;
  s.adjust_lr = adjust == "match_rms_adamw" ? MuonAdjustLr::match_rms_adamw : MuonAdjustLr::original;
  s.nesterov = std::string(argv[4]) == "1";
  const double lr = std::atof(argv[5]), wd = std::atof(argv[6]);
  s.momentum = std::atof(argv[7]);
  const int steps = std::atoi(argv[8]);
  const int64_t rows = std::atoll(argv[9]), cols = std::atoll(argv[10]), n = rows * cols;
  if (steps < 1 || rows < 1 || cols < 1 || n > (int64_t(1) << 24)) {
    std::fprintf(stderr, "muon_driver: steps %d, shape [%lld, %lld] out of range\n", steps, (long long)rows,
                 (long long)cols);
    return 2;
  }
  std::vector<float> in(size_t(n) * size_t(steps + 1)), out(size_t(n) * size_t(steps));
  FILE* f = std::fopen(argv[11], "rb");
  if (!f || std::fread(in.data(), sizeof(float), in.size(), f) != in.size()) {
    std::fprintf(stderr, "muon_driver: cannot read %zu floats from %s\n", in.size(), argv[11]);
    return 1;
  }
  std::fclose(f);
  const k::Device dev = device == "cuda" ? k::Device::cuda : k::Device::cpu;
  k::Buffer param(k::DType::fp32, {rows, cols}, dev), grad(k::DType::fp32, {rows, cols}, dev),
      momentum(k::DType::fp32, {rows, cols}, dev);
  llmtrain::trainer::MuonWorkspace ws(dev);
  const llmtrain::trainer::MuonMatrix whole{.begin = 0, .rows = rows, .cols = cols};
  k::copy(param.tensor(), k::host_tensor(in.data(), {rows, cols}));
  k::fill_zero(momentum.tensor());
  for (int step = 0; step < steps; ++step) {
    k::copy(grad.tensor(), k::host_tensor(in.data() + size_t(n) * size_t(step + 1), {rows, cols}));
    llmtrain::trainer::muon_matrix_step(whole, param.tensor(), grad.tensor(), momentum.tensor(), lr, wd, 1.0f, s, ws);
    k::copy(k::host_tensor(out.data() + size_t(n) * size_t(step), {rows, cols}), param.tensor());
  }
  FILE* o = std::fopen(argv[12], "wb");
  if (!o || std::fwrite(out.data(), sizeof(float), out.size(), o) != out.size() || std::fclose(o) != 0) {
    std::fprintf(stderr, "muon_driver: cannot write %s\n", argv[12]);
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "muon_driver: %s\n", e.what());
  return 1;
}
