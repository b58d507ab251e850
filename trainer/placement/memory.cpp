// The memory account (trainer/placement/memory.h): the placement's bytes by kind, and the
// allocator's counts by the same kinds.
#include "trainer/placement/memory.h"

#include <fmt/format.h>

#include "common/strings.h"

namespace llmtrain::trainer {

MemoryAccount memory_account(const Placement& p) {
  MemoryAccount out;
  out.parameters = p.values.bytes();
  out.gradients = p.grads.bytes();
  out.activations = p.activation_bytes;
  out.head_logits = p.head_logit_bytes;
  out.optimizer = p.moments.bytes() + p.master.bytes() + p.muon_workspace_bytes;
  if (p.offload != OffloadKind::none) {
    // The state is in the offload store: here only its staging slots (the compute device's, or on
    // a cpu rank the host's) and, beside a cuda rank's device, the page-locked store (host) and
    // slots, and the CPU update's copies; nvme's store is on disk.
    const bool cuda = p.layout.device == DeviceKind::cuda;
    out.optimizer = cuda ? p.offload_device_slots : p.offload_host_slots;
    out.offload_host = p.cpu_update_copies + (cuda ? p.offload_host_slots : 0) +
                       (p.offload_store.where == Residence::pinned_host ? p.offload_store.bytes() : 0);
    out.offload_disk = p.offload_store.where == Residence::file ? p.offload_store.bytes() : 0;
  }
  out.checkpoint_snapshot = p.snapshot_bytes;
  out.snapshot_on_host = p.snapshot_on_host;
  out.communication = p.receive_bytes + p.sync_pool_bytes + p.tied_exchange_bytes;
  out.notes = p.notes;
  return out;
}

MemoryAccount memory_plan(const Recipe& recipe, const Layout& layout, const parallel::MeshCoord& coord) {
  return memory_account(place(recipe, layout, coord));
}

MemoryAccount memory_measured(kernels::Device device, bool peak) {
  auto get = [&](kernels::MemoryKind kind) {
    const kernels::MemoryUse u = kernels::memory_use(device, kind);
    return peak ? u.peak : u.current;
  };
  MemoryAccount out;
  out.parameters = get(kernels::MemoryKind::parameters);
  out.gradients = get(kernels::MemoryKind::gradients);
  out.optimizer = get(kernels::MemoryKind::optimizer);
  out.activations = get(kernels::MemoryKind::activations);
  out.communication = get(kernels::MemoryKind::communication);
  return out;
}

std::string format_memory(const MemoryAccount& m) {
  auto b = [](int64_t bytes) { return format_bytes(double(bytes)); };
  std::string out = fmt::format("parameters {}, gradients {}, optimizer {}, activations {}, communication {}",
                                b(m.parameters), b(m.gradients), b(m.optimizer), b(m.activations), b(m.communication));
  if (m.checkpoint_snapshot > 0 && !m.snapshot_on_host)
    out += fmt::format(", checkpoint snapshot {}", b(m.checkpoint_snapshot));
  out += fmt::format("; total {}", b(m.total()));
  std::vector<std::string> host;
  if (m.offload_host > 0) host.push_back("optimizer state " + b(m.offload_host));
  if (m.checkpoint_snapshot > 0 && m.snapshot_on_host)
    host.push_back("checkpoint snapshot " + b(m.checkpoint_snapshot));
  if (!host.empty()) out += "; host memory: " + join(host, ", ");
  if (m.offload_disk > 0) out += fmt::format("; disk (offload_path): optimizer state {}", b(m.offload_disk));
  return out;
}

}  // namespace llmtrain::trainer
