#include "trainer/optim/optimizer.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "common/error.h"
#include "kernels/adamw_math.h"
#include "kernels/backend_info.h"
#include "kernels/device_select.h"
#include "kernels/device_stream.h"
#include "kernels/ops.h"

namespace llmtrain::trainer {

std::vector<DecayRange> decay_ranges(const std::vector<ModelParam>& params) {
  std::vector<DecayRange> out;
  for (const ModelParam& p : params) {
    const int64_t b = p.offset, e = p.offset + p.numel();
    if (!out.empty() && out.back().end == b && out.back().decay == p.spec.weight_decay)
      out.back().end = e;
    else
      out.push_back({b, e, p.spec.weight_decay});
  }
  return out;
}

std::vector<RoundingRange> rounding_ranges(const std::vector<ModelParam>& params) {
  std::vector<RoundingRange> out;
  for (const ModelParam& p : params) {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the name, then the shard's first index mixed in
    for (const unsigned char c : p.spec.name) h = (h ^ c) * 0x100000001b3ull;
    out.push_back(
        {p.offset, p.offset + p.numel(), kernels::splitmix64(h ^ kernels::splitmix64(uint64_t(p.shard_begin)))});
  }
  std::sort(out.begin(), out.end(), [](const RoundingRange& a, const RoundingRange& b) { return a.begin < b.begin; });
  return out;
}

namespace {

int64_t total_numel(const std::vector<parallel::FlatRange>& owned) {
  int64_t n = 0;
  for (const auto& r : owned) {
    LT_CHECK(0 <= r.begin && r.begin <= r.end, "AdamW range [{}, {})", r.begin, r.end);
    n += r.numel();
  }
  return n;
}

}  // namespace

AdamW::AdamW(const OptimizerConfig& config, std::vector<DecayRange> ranges, std::vector<parallel::FlatRange> owned,
             kernels::DType param_dtype, kernels::Device device, const OffloadConfig& offload)
    : config_(config),
      ranges_(std::move(ranges)),
      owned_(std::move(owned)),
      numel_(total_numel(owned_)),
      has_master_((param_dtype != kernels::DType::fp32 && config.master) || offload.params || offload.cpu_update),
      params_offloaded_(offload.params),
      cpu_update_(offload.cpu_update),
      rounds_stochastically_(param_dtype == kernels::DType::bf16 && !has_master_),
      timeout_s_(offload.timeout_s),
      device_(device) {
  LT_CHECK(!offload.params || (offload.kind != OffloadKind::none && param_dtype == kernels::DType::fp32),
           "offloaded parameters without offload or with a 16-bit master");
  LT_CHECK(!offload.cpu_update || (offload.kind == OffloadKind::host && device == kernels::Device::cuda),
           "a CPU update without host offload on a device");
  LT_CHECK(offload.kind == OffloadKind::none || config.state_dtype == StateDtype::fp32,
           "bf16 optimizer state offloaded");  // recipe_check refuses it by key
  LT_CHECK(has_master_ || param_dtype == kernels::DType::fp32 || param_dtype == kernels::DType::bf16,
           "optimizer.master false with {} parameters", kernels::to_string(param_dtype));  // and this
  for (size_t i = 1; i < owned_.size(); ++i)
    LT_CHECK(owned_[i - 1].end <= owned_[i].begin, "AdamW ranges [{}, {}) and [{}, {}) not ascending",
             owned_[i - 1].begin, owned_[i - 1].end, owned_[i].begin, owned_[i].end);
  if (offload.kind != OffloadKind::none) {
    store_ = std::make_unique<OffloadStore>(offload, has_master_ ? 3 : 2, numel_);
    return;
  }
  const kernels::DType moments = state_dtype();
  m_ = kernels::Buffer(moments, {numel_}, device, kernels::MemoryKind::optimizer);
  v_ = kernels::Buffer(moments, {numel_}, device, kernels::MemoryKind::optimizer);
  if (has_master_) master_ = kernels::Buffer(kernels::DType::fp32, {numel_}, device, kernels::MemoryKind::optimizer);
}

// cpu_update: the owned elements' gradients and updated values in page-locked memory, in state
// order, and for each unit its rows (every offset counted from the unit's first element: the state,
// the master, the gradients' and the values' unit views) and the copies that bring its gradients
// down and take its values up (runs of contiguous rows).
struct AdamW::HostUpdate {
  kernels::PinnedBuffer grads, values;
  kernels::Tensor g, v;  // their tensors, in the step's dtypes (v undefined with offload_params)
  kernels::Buffer rows;  // host int64 [rows, 6]
  struct Run {
    int64_t device = 0, state = 0, count = 0;  // device offset, global state offset
  };
  std::vector<std::vector<Run>> down, up;  // per unit: gradients, updated values
  // Per unit: where its gradients begin in the gradient buffer (its first run's device offset).
  // Ascending (the owned ranges are packed in flat order), so the units a final range can complete
  // are found by a binary search.
  std::vector<int64_t> down_begin;
  std::vector<kernels::DeviceEvent> arrived;  // per unit: its gradients are in page-locked memory
  // gradients_final: the flat ranges final so far this step (merged: begin -> end), the units
  // already on their way down, and the stream they go on.
  std::map<int64_t, int64_t> final_ranges;
  std::vector<char> streamed;
  std::unique_ptr<kernels::DeviceStream> stream;
  kernels::DeviceEvent ready;  // the compute stream's point where the latest final gradients were made

  // update_as_gradients_arrive: a CPU thread of its own takes each unit as its gradients start down,
  // waits for them to arrive, updates the unit and sends its values up on a stream of its own — all
  // while the main thread goes on with backward (or waits for the device).
  struct Worker {
    std::thread thread;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<int64_t> todo;  // units to update, in order
    int64_t done = 0;          // units updated (values on their way up) this step
    std::exception_ptr error;
    bool quit = false;
    ~Worker() {
      {
        std::lock_guard<std::mutex> lock(mu);
        quit = true;
      }
      cv.notify_all();
      if (thread.joinable()) thread.join();
    }
  };
  std::unique_ptr<Worker> worker;
  bool eager = false;  // the coming step is updated as its gradients arrive
  kernels::AdamWStep eager_step{};
  kernels::Tensor eager_params;  // where its values go up (undefined with offload_params)

  void post(int64_t u) {
    {
      std::lock_guard<std::mutex> lock(worker->mu);
      worker->todo.push_back(u);
    }
    worker->cv.notify_all();
  }

  // The page-locked gradients and values, in the dtypes of step()'s `param_t` and `grad_t` (at the
  // first call).
  void allocate(int64_t numel, kernels::Tensor param_t, kernels::Tensor grad_t) {
    if (grad_t.defined() && grads.bytes() == 0) {
      grads = kernels::PinnedBuffer(size_t(numel) * kernels::dtype_size(grad_t.dtype));
      g = grads.tensor(grad_t.dtype, {numel});
    }
    if (param_t.defined() && values.bytes() == 0) {
      values = kernels::PinnedBuffer(size_t(numel) * kernels::dtype_size(param_t.dtype));
      v = values.tensor(param_t.dtype, {numel});
    }
  }

  // Whether [b, e) lies inside one merged final range.
  bool final(int64_t b, int64_t e) const {
    auto it = final_ranges.upper_bound(b);
    if (it == final_ranges.begin()) return false;
    --it;
    return it->first <= b && it->second >= e;
  }
  void add_final(int64_t b, int64_t e) {
    auto it = final_ranges.upper_bound(b);
    if (it != final_ranges.begin() && std::prev(it)->second >= b) {
      --it;
      b = it->first;
      e = std::max(e, it->second);
      it = final_ranges.erase(it);
    }
    while (it != final_ranges.end() && it->first <= e) {
      e = std::max(e, it->second);
      it = final_ranges.erase(it);
    }
    final_ranges[b] = e;
  }
};

AdamW::~AdamW() = default;

kernels::Tensor AdamW::state_tensor(State which) const {
  LT_CHECK(!store_, "AdamW state offloaded: read it with read_state");
  const kernels::Buffer& b = which == State::exp_avg ? m_ : which == State::exp_avg_sq ? v_ : master_;
  LT_CHECK(which != State::master || has_master_, "AdamW master without 16-bit parameters");
  return b.tensor();
}
kernels::Tensor AdamW::exp_avg() const { return state_tensor(State::exp_avg); }
kernels::Tensor AdamW::exp_avg_sq() const { return state_tensor(State::exp_avg_sq); }
kernels::Tensor AdamW::master() const { return state_tensor(State::master); }

kernels::DType AdamW::state_dtype() const {
  return config_.state_dtype == StateDtype::bf16 ? kernels::DType::bf16 : kernels::DType::fp32;
}

// bf16 moments travel to and from the host's fp32 through a bf16 copy on the host: widened exactly,
// or rounded to nearest even (kernels::copy_convert).
void AdamW::read_state(State which, int64_t at, kernels::Tensor host) const {
  if (store_)
    store_->read(int(which), at, host);
  else
    kernels::copy_convert(host, state_tensor(which).flat(at, host.numel()));
}

void AdamW::write_state(State which, int64_t at, kernels::Tensor host) const {
  if (store_)
    store_->write(int(which), at, host);
  else
    kernels::copy_convert(state_tensor(which).flat(at, host.numel()), host);
}

template <typename Fn>
void AdamW::for_each_owned(int64_t begin, int64_t end, Fn&& fn) const {
  int64_t base = 0;
  for (const parallel::FlatRange& own : owned_) {
    const int64_t b = std::max(base, begin), e = std::min(base + own.numel(), end);
    if (b < e) fn(b, own.begin + (b - base), e - b);
    base += own.numel();
  }
}

void AdamW::master_from_params(kernels::Tensor params) {
  if (!has_master()) return;
  master_set_ = true;
  if (params_offloaded_) {  // `params` is the compact owned values (the model's initial param shard)
    LT_CHECK(params.numel() == numel_, "{} owned values for {} offloaded", params.numel(), numel_);
    kernels::Buffer host;
    if (params.device != kernels::Device::cpu) {
      host = kernels::Buffer(kernels::DType::fp32, {numel_}, kernels::Device::cpu, kernels::MemoryKind::other);
      kernels::copy(host.tensor(), params);
    }
    write_state(State::master, 0, host.data() ? host.tensor() : params);
    return;
  }
  if (store_) {
    store_->for_each_unit(
        [&](int64_t, int64_t begin, int64_t count, std::span<const kernels::Tensor> st) {
          for_each_owned(begin, begin + count, [&](int64_t state, int64_t flat, int64_t n) {
            kernels::convert(st[int(State::master)].flat(state - begin, n), params.flat(flat, n));
          });
        },
        /*write_back=*/true);
    return;
  }
  for_each_owned(0, numel_, [&](int64_t state, int64_t flat, int64_t n) {
    kernels::convert(master_.tensor().flat(state, n), params.flat(flat, n));
  });
}

void AdamW::params_from_master(kernels::Tensor params) {
  if (!has_master()) return;
  master_set_ = true;
  if (params_offloaded_) return;  // nothing to round into: the gathers read the store
  if (store_) {
    store_->for_each_unit(
        [&](int64_t, int64_t begin, int64_t count, std::span<const kernels::Tensor> st) {
          for_each_owned(begin, begin + count, [&](int64_t state, int64_t flat, int64_t n) {
            kernels::convert(params.flat(flat, n), st[int(State::master)].flat(state - begin, n));
          });
        },
        /*write_back=*/false);
    return;
  }
  for_each_owned(0, numel_, [&](int64_t state, int64_t flat, int64_t n) {
    kernels::convert(params.flat(flat, n), master_.tensor().flat(state, n));
  });
}

void AdamW::set_rounding(uint64_t seed, std::vector<RoundingRange> ranges) {
  rounding_seed_ = seed;
  rounding_ = std::move(ranges);
  rows_for_ = -1;
}

int64_t AdamW::state_offset(int64_t at) const {
  int64_t base = 0;
  for (const auto& r : owned_) {
    if (at >= r.begin && at < r.end) return base + (at - r.begin);
    base += r.numel();
  }
  return -1;
}

const kernels::Buffer& AdamW::rows(bool compact_grads, bool compact_params, int64_t params_numel, int64_t grads_numel) {
  const int key = int(compact_grads) + 2 * int(compact_params);
  if (rows_for_ == key) return rows_;
  std::vector<int64_t> table;
  int64_t base = 0;  // the owned range's first element in the moments
  for (const parallel::FlatRange& own : owned_) {
    for (const DecayRange& r : ranges_) {
      const int64_t b = std::max(r.begin, own.begin), e = std::min(r.end, own.end);
      for (int64_t at = b, count = 0; at < e; at += count) {
        count = std::min(kernels::kSquaresChunk, e - at);
        // With a master the update goes to it (at the moments' offset) and, rounded, to the 16-bit
        // parameters at their flat offset (column 3). Without one, column 3 is the first element's
        // stochastic-rounding index: rows are cut at the parameters' rounding ranges.
        int64_t index = at;
        if (rounds_stochastically_ && !rounding_.empty()) {
          auto it = std::upper_bound(rounding_.begin(), rounding_.end(), at,
                                     [](int64_t x, const RoundingRange& r) { return x < r.begin; });
          LT_CHECK(it != rounding_.begin() && at < std::prev(it)->end, "AdamW element {} outside the rounding ranges",
                   at);
          --it;
          count = std::min(count, it->end - at);
          index = int64_t(it->base + uint64_t(at - it->begin));
        }
        const int64_t state = base + (at - own.begin);
        const int64_t param = has_master() ? state : compact_params ? state : at;
        const int64_t grad = compact_grads ? state : at;
        LT_CHECK(grad + count <= grads_numel &&
                     (params_offloaded_ || (has_master() ? at + count <= params_numel : param + count <= params_numel)),
                 "AdamW range [{}, +{}) beyond {} gradients / {} parameters", at, count, grads_numel, params_numel);
        table.insert(table.end(), {param, grad, state, index, count, r.decay ? 1 : 0});
      }
    }
    base += own.numel();
  }
  if (store_) {
    // Cut at the store's units; state offsets (and the master's, which are the state's) from the unit's start.
    std::vector<int64_t> cut;
    const int64_t unit = store_->unit();
    unit_first_.assign(size_t(store_->units()) + 1, 0);
    for (size_t i = 0; i < table.size(); i += 6) {
      const int64_t* row = &table[i];
      for (int64_t x = 0; x < row[4];) {
        const int64_t state = row[2] + x, u = state / unit, n = std::min(row[4] - x, (u + 1) * unit - state);
        cut.insert(cut.end(),
                   {has_master() ? state - u * unit : row[0] + x, row[1] + x, state - u * unit, row[3] + x, n, row[5]});
        ++unit_first_[size_t(u) + 1];
        x += n;
      }
    }
    for (size_t u = 1; u < unit_first_.size(); ++u) unit_first_[u] += unit_first_[u - 1];
    table = std::move(cut);
    if (cpu_update_) {
      // The same rows on the host, everything unit-relative; the copies coalesced where rows touch.
      host_ = std::make_unique<HostUpdate>();
      host_->down.resize(size_t(store_->units()));
      host_->up.resize(size_t(store_->units()));
      host_->arrived = std::vector<kernels::DeviceEvent>(size_t(store_->units()));
      host_->streamed.assign(size_t(store_->units()), 0);
      std::vector<int64_t> cpu;
      auto add = [](std::vector<HostUpdate::Run>& runs, int64_t device, int64_t state, int64_t count) {
        if (!runs.empty() && runs.back().device + runs.back().count == device &&
            runs.back().state + runs.back().count == state)
          runs.back().count += count;
        else
          runs.push_back({device, state, count});
      };
      for (int64_t u = 0; u < store_->units(); ++u)
        for (int64_t i = unit_first_[size_t(u)]; i < unit_first_[size_t(u) + 1]; ++i) {
          const int64_t* row = &table[size_t(6 * i)];
          const int64_t rel = row[2], global = u * unit + rel, count = row[4];
          cpu.insert(cpu.end(), {rel, rel, rel, rel, count, row[5]});
          add(host_->down[size_t(u)], row[1], global, count);
          // The values: into the flat parameters (at), or the compact owned values (ZeRO 3, offload_params:
          // none, the store holds them).
          if (!params_offloaded_) add(host_->up[size_t(u)], compact_params ? global : row[3], global, count);
        }
      for (const std::vector<HostUpdate::Run>& runs : host_->down) {
        const int64_t b = runs.empty() ? (host_->down_begin.empty() ? 0 : host_->down_begin.back()) : runs[0].device;
        LT_CHECK(host_->down_begin.empty() || b >= host_->down_begin.back(), "offload units' gradients not ascending");
        host_->down_begin.push_back(b);
      }
      const int64_t n = int64_t(cpu.size()) / 6;
      host_->rows = kernels::Buffer(kernels::DType::int64, {std::max<int64_t>(n, 1), 6}, kernels::Device::cpu,
                                    kernels::MemoryKind::other);
      if (n > 0) std::copy(cpu.begin(), cpu.end(), host_->rows.ptr<int64_t>());
    }
  }
  const int64_t n = int64_t(table.size()) / 6;
  // Bookkeeping, not optimizer state: 48 bytes per 2^14 elements (MemoryKind::other, which the
  // memory account leaves out).
  rows_ = kernels::Buffer(kernels::DType::int64, {std::max<int64_t>(n, 1), 6}, device_, kernels::MemoryKind::other);
  if (n > 0)
    kernels::copy(rows_.tensor().flat(0, 6 * n), kernels::Tensor(table.data(), kernels::DType::int64, {6 * n}));
  rows_for_ = key;
  row_count_ = n;
  return rows_;
}

void AdamW::set_muon(const MuonSettings& settings, std::vector<MuonMatrix> matrices, double adamw_lr_ratio,
                     double adamw_weight_decay, const MuonGroup& tp,
                     std::vector<parallel::GradSync::UnitShards> shards) {
  LT_CHECK(!store_ && !cpu_update_, "Muon with offloaded optimizer state");
  if (shards.empty()) shards.resize(matrices.size());
  LT_CHECK(shards.size() == matrices.size(), "{} shard groups for {} Muon matrices", shards.size(), matrices.size());
  muon_sharded_.clear();
  muon_cut_.assign(matrices.size(), false);
  for (size_t i = 0; i < matrices.size(); ++i) {
    const MuonMatrix& mat = matrices[i];
    const int64_t end = mat.begin + mat.numel();
    if (shards[i].group == nullptr) {
      LT_CHECK(owned_piece(mat.begin, end).numel() == mat.numel(), "Muon matrix [{}, +{}) not inside one owned range",
               mat.begin, mat.numel());
      continue;
    }
    auto it = std::find_if(muon_sharded_.begin(), muon_sharded_.end(),
                           [&](const MuonShardGroup& g) { return g.group == shards[i].group; });
    if (it == muon_sharded_.end()) it = muon_sharded_.insert(muon_sharded_.end(), {shards[i].group, {}, {}});
    std::vector<parallel::FlatRange> pieces;
    for (const parallel::FlatRange& c : shards[i].chunks) {
      const int64_t b = std::max(mat.begin, c.begin), e = std::min(end, c.end);
      pieces.push_back(b < e ? parallel::FlatRange{b - mat.begin, e - mat.begin} : parallel::FlatRange{});
    }
    const parallel::FlatRange own = owned_piece(mat.begin, end);
    const parallel::FlatRange said = pieces[size_t(shards[i].group->rank())];
    LT_CHECK(own.numel() == said.numel() && (own.numel() == 0 || own.begin - mat.begin == said.begin),
             "Muon matrix [{}, +{}): owned [{}, {}), its shard chunk [{}, {})", mat.begin, mat.numel(), own.begin,
             own.end, said.begin + mat.begin, said.end + mat.begin);
    it->matrices.push_back(i);
    it->pieces.push_back(std::move(pieces));
    muon_cut_[i] = true;
  }
  muon_settings_ = settings;
  muon_tp_ = tp;
  muon_ = std::move(matrices);
  adamw_lr_ratio_ = adamw_lr_ratio;
  adamw_weight_decay_ = adamw_weight_decay;
  workspace_ = std::make_unique<MuonWorkspace>(device_);
  workspace_->reserve(muon_, settings.ns_dtype, state_dtype(), !muon_sharded_.empty());
  // AdamW's rows leave the matrices out: the decay ranges less every matrix.
  std::vector<DecayRange> rest;
  size_t next = 0;
  for (const DecayRange& r : ranges_) {
    int64_t at = r.begin;
    while (next < muon_.size() && muon_[next].begin + muon_[next].numel() <= at) ++next;
    for (size_t i = next; i < muon_.size() && muon_[i].begin < r.end; ++i) {
      if (muon_[i].begin > at) rest.push_back({at, muon_[i].begin, r.decay});
      at = std::max(at, muon_[i].begin + muon_[i].numel());
    }
    if (at < r.end) rest.push_back({at, r.end, r.decay});
  }
  ranges_ = std::move(rest);
  rows_for_ = -1;
}

bool AdamW::muon_owns(int64_t at) const {
  auto it =
      std::upper_bound(muon_.begin(), muon_.end(), at, [](int64_t x, const MuonMatrix& m) { return x < m.begin; });
  return it != muon_.begin() && at < std::prev(it)->begin + std::prev(it)->numel();
}

parallel::FlatRange AdamW::owned_piece(int64_t lo, int64_t hi) const {
  parallel::FlatRange piece{lo, lo};
  for (const parallel::FlatRange& r : owned_) {
    const int64_t b = std::max(lo, r.begin), e = std::min(hi, r.end);
    if (b >= e) continue;
    LT_CHECK(piece.numel() == 0, "flat range [{}, {}) meets two owned ranges", lo, hi);
    piece = {b, e};
  }
  return piece;
}

void AdamW::muon_step(kernels::Tensor params, kernels::Tensor grads, double lr, float grad_scale, bool compact_grads,
                      bool compact_params) {
  // This rank's piece of matrix i: its values (the master's, with one), gradient and momentum.
  auto piece = [&](size_t i, MuonPiece& out) {
    const MuonMatrix& mat = muon_[i];
    const parallel::FlatRange own = owned_piece(mat.begin, mat.begin + mat.numel());
    const int64_t n = own.numel(), at = n > 0 ? state_offset(own.begin) : 0;
    out.matrix = &mat;
    if (n == 0) return own;
    out.param = has_master() ? master_.tensor().flat(at, n) : params.flat(compact_params ? at : own.begin, n);
    out.grad = grads.flat(compact_grads ? at : own.begin, n);
    out.momentum = m_.tensor().flat(at, n);
    return own;
  };
  auto round_into_params = [&](const MuonPiece& p, parallel::FlatRange own) {  // the 16-bit values, rounded once
    if (has_master() && own.numel() > 0) kernels::convert(params.flat(own.begin, own.numel()), p.param);
  };
  for (size_t i = 0; i < muon_.size(); ++i) {  // the whole ones
    if (muon_cut_[i]) continue;
    MuonPiece p;
    const parallel::FlatRange own = piece(i, p);
    muon_matrix_step(muon_[i], p.param, p.grad, p.momentum, lr, config_.weight_decay, grad_scale, muon_settings_,
                     *workspace_, muon_tp_);
    round_into_params(p, own);
  }
  for (const MuonShardGroup& g : muon_sharded_) {  // the cut ones, a matrix per rank of the group at a time
    const size_t size = size_t(g.group->size());
    for (size_t first = 0; first < g.matrices.size(); first += size) {
      std::vector<MuonPiece> batch(std::min(size, g.matrices.size() - first));
      std::vector<parallel::FlatRange> owns;
      for (size_t j = 0; j < batch.size(); ++j) {
        owns.push_back(piece(g.matrices[first + j], batch[j]));
        batch[j].pieces = g.pieces[first + j];
      }
      muon_sharded_step(batch, *g.group, lr, config_.weight_decay, grad_scale, muon_settings_, *workspace_, muon_tp_);
      for (size_t j = 0; j < batch.size(); ++j) round_into_params(batch[j], owns[j]);
    }
  }
}

void AdamW::step(kernels::Tensor params, kernels::Tensor grads, double lr, float grad_scale, bool compact_grads,
                 bool compact_params) {
  const int64_t end = owned_.empty() ? 0 : owned_.back().end;
  if (params_offloaded_) params = {};  // the values are the store's; nothing to round into
  LT_CHECK((params_offloaded_ || params.numel() >= (compact_params ? owned_numel() : end)) &&
               grads.numel() >= (compact_grads ? owned_numel() : end),
           "AdamW step on {} / {} elements, owning up to {}", params.numel(), grads.numel(), end);
  LT_CHECK(!has_master() || master_set_, "AdamW step before its fp32 master was set (master_from_params)");
  LT_CHECK(!has_master() || params_offloaded_ || !compact_params, "AdamW master weights with compact parameters");
  ++steps_;
  // With Muon's matrices (set_muon) AdamW updates the rest at its own lr and weight decay.
  const bool muon = !muon_.empty();
  const kernels::AdamWStep s{.lr = float(muon ? lr * adamw_lr_ratio_ : lr),
                             .beta1 = float(config_.beta1),
                             .beta2 = float(config_.beta2),
                             .eps = float(config_.eps),
                             .weight_decay = float(muon ? adamw_weight_decay_ : config_.weight_decay),
                             .step = steps_,
                             .grad_scale = grad_scale,
                             .rounding_key = kernels::rounding_key(rounding_seed_, steps_)};
  const kernels::Buffer& table = rows(compact_grads, compact_params, params.numel(), grads.numel());
  // Muon's steps first, on every rank: under ZeRO one owning none of a matrix still takes part.
  if (muon) muon_step(params, grads, lr, grad_scale, compact_grads, compact_params);
  if (owned_numel() == 0) return;
  if (cpu_update_) return cpu_step(params, grads, s);
  if (store_) {
    store_->for_each_unit(
        [&](int64_t u, int64_t, int64_t, std::span<const kernels::Tensor> st) {
          const int64_t first = unit_first_[size_t(u)], n = unit_first_[size_t(u) + 1] - first;
          if (n == 0) return;
          const kernels::Tensor t = table.tensor().flat(6 * first, 6 * n).view({n, 6});
          const kernels::Tensor &m = st[int(State::exp_avg)], &v = st[int(State::exp_avg_sq)];
          if (has_master())  // `params` undefined when they are the master (offload_params): nothing to round
            kernels::adamw_rows(st[int(State::master)], grads, m, v, params, t, s);
          else
            kernels::adamw_rows(params, grads, m, v, kernels::Tensor{}, t, s);
        },
        /*write_back=*/true);
    return;
  }
  const int64_t n = row_count_;
  if (n == 0) return;
  const kernels::Tensor t = table.tensor().flat(0, 6 * n).view({n, 6});
  // The fp32 master takes the update and the 16-bit parameters get it rounded once; without one
  // the parameters are updated in place.
  if (has_master())
    kernels::adamw_rows(master_.tensor(), grads, m_.tensor(), v_.tensor(), params, t, s);
  else
    kernels::adamw_rows(params, grads, m_.tensor(), v_.tensor(), kernels::Tensor{}, t, s);
}

void AdamW::cpu_update_unit(int64_t u, const kernels::AdamWStep& s) {
  HostUpdate& h = *host_;
  const int64_t first = unit_first_[size_t(u)], n = unit_first_[size_t(u) + 1] - first;
  if (n == 0) return;
  const int64_t unit = store_->unit(), begin = u * unit, count = std::min(unit, numel_ - begin);
  const std::vector<kernels::Tensor> st = store_->host_unit(u);
  const kernels::Tensor t = h.rows.tensor().flat(6 * first, 6 * n).view({n, 6});
  kernels::adamw_rows(st[int(State::master)], h.g.flat(begin, count), st[int(State::exp_avg)],
                      st[int(State::exp_avg_sq)], h.v.defined() ? h.v.flat(begin, count) : kernels::Tensor{}, t, s);
}

void AdamW::wait_arrived(int64_t u) const {
  const auto t0 = std::chrono::steady_clock::now();
  while (!host_->arrived[size_t(u)].done()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s_)
      throw environment_error(fmt::format("parallel.offload host: unit {}'s gradients did not reach host memory "
                                          "within {} s (parallel.timeout)",
                                          u, timeout_s_),
                              "the device stopped responding: see the rank's log and `nvidia-smi`");
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void AdamW::copy_down(int64_t u, kernels::Tensor grads) {
  HostUpdate& h = *host_;
  for (const HostUpdate::Run& r : h.down[size_t(u)])
    kernels::copy(h.g.flat(r.state, r.count), grads.flat(r.device, r.count));
  h.arrived[size_t(u)].record_compute();
}

void AdamW::end_cpu_update() {
  HostUpdate& h = *host_;
  // The page-locked values are read by their copies until those are done.
  kernels::synchronize(device_);
  h.final_ranges.clear();
  std::fill(h.streamed.begin(), h.streamed.end(), 0);
  h.eager = false;
}

void AdamW::cpu_step(kernels::Tensor params, kernels::Tensor grads, const kernels::AdamWStep& s) {
  HostUpdate& h = *host_;
  h.allocate(numel_, params, grads);  // at the first step (or gradients_final): in the step's dtypes
  if (h.eager) return eager_step_end(grads, s);
  // Every unit's gradients down, in order on the compute stream (behind backward and the sync),
  // each unit's arrival marked.
  for (int64_t u = 0; u < store_->units(); ++u)
    if (!h.streamed[size_t(u)]) copy_down(u, grads);  // else on its way since backward (gradients_final)
  // Each unit on the CPU as soon as its gradients are there (the later ones still crossing), its
  // values up behind it.
  for (int64_t u = 0; u < store_->units(); ++u) {
    wait_arrived(u);
    cpu_update_unit(u, s);
    for (const HostUpdate::Run& r : h.up[size_t(u)])
      kernels::copy(params.flat(r.device, r.count), h.v.flat(r.state, r.count));
  }
  end_cpu_update();
}

void AdamW::update_as_gradients_arrive(kernels::Tensor params, kernels::Tensor grads, double lr, bool compact_grads,
                                       bool compact_params) {
  if (!cpu_update_ || owned_numel() == 0) return;
  if (params_offloaded_) params = {};
  rows(compact_grads, compact_params, params.numel(), grads.numel());
  HostUpdate& h = *host_;
  h.allocate(numel_, params, grads);
  h.eager = true;
  h.eager_step = kernels::AdamWStep{.lr = float(lr),
                                    .beta1 = float(config_.beta1),
                                    .beta2 = float(config_.beta2),
                                    .eps = float(config_.eps),
                                    .weight_decay = float(config_.weight_decay),
                                    .step = steps_ + 1,
                                    .grad_scale = 1.0f};
  h.eager_params = params;
  if (h.worker) return;
  h.worker = std::make_unique<HostUpdate::Worker>();
  HostUpdate::Worker& w = *h.worker;
  w.thread = std::thread([this, &h, &w, threads = kernels::cpu_threads(), device = kernels::device_current()] {
    kernels::set_cpu_threads(threads);  // a new thread starts with OpenMP's default
    std::exception_ptr error;
    std::unique_ptr<kernels::DeviceStream> up;
    try {
      kernels::device_make_current(device);  // its event queries and copies on the rank's device
      up = std::make_unique<kernels::DeviceStream>();
    } catch (...) {
      error = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(w.mu);
    while (true) {
      w.cv.wait(lock, [&] { return w.quit || !w.todo.empty(); });
      if (w.quit) return;
      const int64_t u = w.todo.front();
      w.todo.pop_front();
      lock.unlock();
      if (!error) try {
          wait_arrived(u);
          cpu_update_unit(u, h.eager_step);
          for (const HostUpdate::Run& r : h.up[size_t(u)])
            up->copy_async(h.eager_params.flat(r.device, r.count), h.v.flat(r.state, r.count));
        } catch (...) {
          error = std::current_exception();
        }
      lock.lock();
      if (error && !w.error) w.error = error;
      ++w.done;
      w.cv.notify_all();
    }
  });
}

void AdamW::eager_step_end(kernels::Tensor grads, const kernels::AdamWStep& s) {
  HostUpdate& h = *host_;
  const kernels::AdamWStep& e = h.eager_step;
  LT_CHECK(s.lr == e.lr && s.grad_scale == 1.0f && s.step == e.step,
           "AdamW step (lr {}, scale {}, step {}) other than the one updating as gradients arrive (lr {}, step {})",
           s.lr, s.grad_scale, s.step, e.lr, e.step);
  // The units whose gradients did not start down during backward: down now, to the thread.
  for (int64_t u = 0; u < store_->units(); ++u)
    if (!h.streamed[size_t(u)]) {
      copy_down(u, grads);
      h.streamed[size_t(u)] = 1;
      h.post(u);
    }
  HostUpdate::Worker& w = *h.worker;
  std::unique_lock<std::mutex> lock(w.mu);
  int64_t seen = -1;
  while (w.done < store_->units() && !w.error) {
    if (w.done != seen)
      seen = w.done;  // each unit done restarts the clock
    else
      throw environment_error(fmt::format("parallel.offload host: the CPU update made no progress within {} s "
                                          "(parallel.timeout); {} of {} units done",
                                          timeout_s_, w.done, store_->units()),
                              "the device stopped responding: see the rank's log and `nvidia-smi`");
    w.cv.wait_for(lock, std::chrono::duration<double>(timeout_s_), [&] { return w.done != seen || w.error; });
  }
  if (w.error) std::rethrow_exception(std::exchange(w.error, nullptr));
  w.done = 0;
  lock.unlock();
  end_cpu_update();
}

int64_t AdamW::units_updated() const {
  if (!host_ || !host_->eager || !host_->worker) return 0;
  std::lock_guard<std::mutex> lock(host_->worker->mu);
  return host_->worker->done;
}

int64_t AdamW::units_streamed() const {
  return host_ ? std::count(host_->streamed.begin(), host_->streamed.end(), 1) : 0;
}

void AdamW::gradients_begin() {
  if (!host_) return;
  LT_CHECK(!host_->eager || std::count(host_->streamed.begin(), host_->streamed.end(), 1) == 0,
           "a step updating as its gradients arrived ended without its update");
  host_->eager = false;
  if (host_->final_ranges.empty()) return;
  kernels::synchronize(device_);  // the copy stream's work too
  host_->final_ranges.clear();
  std::fill(host_->streamed.begin(), host_->streamed.end(), 0);
}

void AdamW::gradients_final(int64_t begin, int64_t end, kernels::Tensor params, kernels::Tensor grads,
                            bool compact_grads, bool compact_params) {
  if (!cpu_update_ || owned_numel() == 0) return;
  if (params_offloaded_) params = {};
  rows(compact_grads, compact_params, params.numel(), grads.numel());  // the unit tables (step()'s)
  HostUpdate& h = *host_;
  h.allocate(numel_, params, grads);
  if (!h.stream) h.stream = std::make_unique<kernels::DeviceStream>();
  const kernels::Tensor g = h.g;
  h.add_final(begin, end);
  bool marked = false;
  // Only units with gradients in [begin, end) can have become complete: from the last unit that
  // begins at or before `begin` to the last that begins before `end`.
  const auto first = std::upper_bound(h.down_begin.begin(), h.down_begin.end(), begin);
  for (int64_t u = std::max<int64_t>(0, first - h.down_begin.begin() - 1);
       u < store_->units() && h.down_begin[size_t(u)] < end; ++u) {
    if (h.streamed[size_t(u)]) continue;
    const std::vector<HostUpdate::Run>& runs = h.down[size_t(u)];
    if (!std::all_of(runs.begin(), runs.end(),
                     [&](const HostUpdate::Run& r) { return h.final(r.device, r.device + r.count); }))
      continue;
    if (!marked) {  // the copy stream waits for the compute stream's work so far (this backward's)
      h.ready.record_compute();
      h.ready.make_wait(*h.stream);
      marked = true;
    }
    for (const HostUpdate::Run& r : runs) h.stream->copy_async(g.flat(r.state, r.count), grads.flat(r.device, r.count));
    h.arrived[size_t(u)].record(*h.stream);
    h.streamed[size_t(u)] = 1;
    if (h.eager) h.post(u);
  }
}

namespace {

// Calls fn(p, b, e, at) for each counted (parameter, owned range) overlap [b, e) of p's flat range,
// in order; `at` is where b's gradient sits when the owned ranges' gradients are packed.
template <typename Fn>
void for_each_norm_piece(const std::vector<ModelParam>& params, int tp_rank,
                         const std::vector<parallel::FlatRange>& owned, Fn&& fn) {
  for (const ModelParam& p : params) {
    if (p.tied_copy) continue;
    if (p.tp_replica || (p.spec.tp_split_dim < 0 && tp_rank != 0)) continue;
    int64_t base = 0;  // the owned range's first element among the packed gradients
    for (const parallel::FlatRange& own : owned) {
      const int64_t b = std::max(p.offset, own.begin), e = std::min(p.offset + p.numel(), own.end);
      if (b < e) fn(p, b, e, base + (b - own.begin));
      base += own.numel();
    }
  }
}

}  // namespace

GradNormPlan::GradNormPlan(const std::vector<ModelParam>& params, int tp_rank,
                           const std::vector<parallel::FlatRange>& owned, bool compact, kernels::Device device) {
  std::vector<int64_t> chunks, first{0};
  for_each_norm_piece(params, tp_rank, owned, [&](const ModelParam&, int64_t b, int64_t e, int64_t at) {
    const int64_t start = compact ? at : b;  // the piece in the gradients sum_squares_into reads
    for (int64_t x = 0; x < e - b; x += kernels::kSquaresChunk)
      chunks.insert(chunks.end(), {start + x, std::min(kernels::kSquaresChunk, e - b - x)});
    first.push_back(int64_t(chunks.size()) / 2);
    end_ = std::max(end_, start + (e - b));
  });
  pieces_ = int64_t(first.size()) - 1;
  const int64_t c = int64_t(chunks.size()) / 2;
  chunks_ = kernels::Buffer(kernels::DType::int64, {std::max<int64_t>(c, 1), 2}, device, kernels::MemoryKind::other);
  first_ = kernels::Buffer(kernels::DType::int64, {pieces_ + 1}, device, kernels::MemoryKind::other);
  if (c > 0)
    kernels::copy(chunks_.tensor().flat(0, 2 * c), kernels::Tensor(chunks.data(), kernels::DType::int64, {2 * c}));
  kernels::copy(first_.tensor(), kernels::Tensor(first.data(), kernels::DType::int64, {pieces_ + 1}));
}

void GradNormPlan::sum_squares_into(kernels::Tensor parts, kernels::Tensor grads) const {
  if (pieces_ == 0) return;
  LT_CHECK(parts.numel() >= pieces_ && grads.numel() >= end_, "{} norm parts for {} pieces, {} gradients for {}",
           parts.numel(), pieces_, grads.numel(), end_);
  kernels::sum_squares_chunks(parts.flat(0, pieces_), grads.view({grads.numel()}), chunks_.tensor(), first_.tensor());
}

double sum_pieces(std::span<const float> parts) {
  double sum = 0;
  for (float x : parts) sum += x;
  return sum;
}

double grad_sum_squares(const std::vector<ModelParam>& params, int tp_rank,
                        const std::vector<parallel::FlatRange>& owned, kernels::Tensor compact_grads) {
  // Piece by piece (one read each): the step's GradNormPlan sums the same pieces in one op.
  double sum = 0;
  for_each_norm_piece(params, tp_rank, owned, [&](const ModelParam& p, int64_t b, int64_t e, int64_t at) {
    float part = 0;
    kernels::Buffer out(kernels::DType::fp32, {1}, p.grad.device);
    kernels::sum_squares(out.tensor(), compact_grads.defined() ? compact_grads.flat(at, e - b)
                                                               : p.grad.view({p.numel()}).flat(b - p.offset, e - b));
    kernels::copy(kernels::host_tensor(&part, {1}), out.tensor());
    sum += part;
  });
  return sum;
}

float clip_factor(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0f;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? float(c) : 1.0f;
}

}  // namespace llmtrain::trainer
