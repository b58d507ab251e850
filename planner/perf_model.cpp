#include "planner/perf_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/recipe/layout.h"
#include "common/recipe/recipe_check.h"
#include "kernels/backend_info.h"
#include "parallel/pipeline_schedule.h"
#include "trainer/model/model.h"
#include "trainer/model/model_spec.h"
#include "trainer/optim/muon.h"
#include "trainer/placement/placement.h"

namespace llmtrain::planner {
namespace {

// Parameter counts per tensor-parallel rank: one block, the embedding (token and position) and
// the head (final norm, and the output matrix when untied).
struct ParamCounts {
  double block = 0, embedding = 0, head = 0;
  double block_matmul = 0;  // of block: the weights of matrix products (the 6N of 6N + 12·L·d·T)
};

ParamCounts param_counts(const ModelConfig& m, int tp) {
  ParamCounts c;
  for (const trainer::ParamSpec& p : trainer::model_param_specs(m)) {
    const double n = double(p.numel()) / (p.tp_split_dim >= 0 ? tp : 1);
    if (p.place == trainer::ParamPlace::block) {
      if (p.layer == 0) {
        c.block += n;
        if (p.shape.size() >= 2) c.block_matmul += n;
      }
    } else if (p.place == trainer::ParamPlace::embedding) {
      c.embedding += n;
    } else {
      c.head += n;
    }
  }
  return c;
}

// What one rank of a CPU host computes at: a rank of one thread at the measured one-thread rate
// (the other cores run the other ranks), a rank of more at its share of the all-cores rate; ranks
// whose threads outnumber the cores share them. Threads per rank: train.threads, else the host's
// cores divided among its ranks (what the launcher gives them).
double host_rank_rate(const Recipe& r, const DeviceSpec& dev, double all_cores_rate, int ranks) {
  const int cores = std::max(1, dev.cores);
  const int threads = threads_per_rank(r, cores, ranks);
  double rate = threads == 1 && dev.achievable_one_thread > 0 ? dev.achievable_one_thread
                                                              : all_cores_rate * std::min(threads, cores) / cores;
  const double demand = double(ranks) * std::min(threads, cores);  // a rank's extra threads add no cores
  if (demand > cores) rate *= cores / demand;
  return rate;
}

}  // namespace

double ring_all_reduce_time(double bytes, int ranks, double bandwidth, double latency) {
  if (ranks <= 1) return 0;
  const double n = ranks;
  return 2 * (n - 1) / n * bytes / bandwidth + 2 * (n - 1) * latency;
}

double ring_reduce_scatter_time(double bytes, int ranks, double bandwidth, double latency) {
  if (ranks <= 1) return 0;
  const double n = ranks;
  return (n - 1) / n * bytes / bandwidth + (n - 1) * latency;
}

double ring_all_gather_time(double bytes, int ranks, double bandwidth, double latency) {
  return ring_reduce_scatter_time(bytes, ranks, bandwidth, latency);
}

AttentionRates attention_rates(const Recipe& r, const Cluster& c) {
  const DeviceSpec& dev = c.device;
  if (c.stores_attention_scores) return {};
  const kernels::DType storage = trainer::precision_dtype(r.train.precision);
  if (kernels::cuda_attention_on_tensor_cores(storage, r.model.head_size()) && dev.attention_tc_forward_rate > 0)
    return {dev.attention_tc_forward_rate, dev.attention_tc_backward_rate, dev.attention_tc_source};
  if (dev.attention_forward_rate > 0)
    return {dev.attention_forward_rate, dev.attention_backward_rate, dev.attention_source};
  return {};
}

StepPrediction predict_step(const Recipe& r, const Cluster& c) {
  const ModelConfig& m = r.model;
  const Layout p = layout_of(r);
  LT_CHECK(c.gpus == p.world(), "cluster of {} ranks for a layout of {}", c.gpus, p.world());
  const DeviceSpec& dev = c.device;
  const int tp = p.tp, pp = p.pp, dp = p.dp, v = p.virtual_stages, cp = p.cp;
  const int replicas = p.replicas();  // dp × cp: the gradient reduction's ranks
  const int mbs = r.grad_accum_steps();
  // Per micro-batch and rank: a rank holds seq_len / cp tokens of each sequence (context parallelism).
  const double tokens = double(r.train.micro_batch) * m.seq_len / cp;
  const double element = p.precision == Precision::fp32 ? 4 : 2;
  const int per_node = std::max(1, std::min(c.gpus, c.gpus_per_node));

  // Compute rate per rank: the ranks of a CPU host share its cores.
  double rate = p.precision == Precision::fp32 ? dev.achievable_fp32 : dev.achievable_bf16;
  if (dev.shares_host) rate = host_rank_rate(r, dev, rate, per_node);

  // Which links each kind of group crosses (mesh order: tp fastest, then cp, then dp, then pp).
  auto link = [&](bool inter) {
    return std::pair<double, double>{inter ? c.inter_node_bandwidth : dev.intra_node_bandwidth,
                                     inter ? dev.inter_node_latency : dev.intra_node_latency};
  };
  const auto [tp_bw, tp_lat] = link(tp > c.gpus_per_node);
  const auto [cp_bw, cp_lat] = link(int64_t(tp) * cp > c.gpus_per_node);
  const auto [dp_bw, dp_lat] = link(int64_t(tp) * cp * dp > c.gpus_per_node);
  const auto [pp_bw, pp_lat] = link(int64_t(tp) * cp * dp >= c.gpus_per_node);

  // FLOPs per token and tensor-parallel rank, forward only (backward is twice the forward).
  const ParamCounts counts = param_counts(m, tp);
  // QKᵀ and AV (the 12·H·hd·T of training / 3; H·hd is hidden unless model.head_dim says otherwise)
  const double attention_forward = 4.0 * m.heads * m.head_size() * double(m.seq_len) / tp;
  const double block_forward = 2 * counts.block_matmul + attention_forward;
  // Attention's time: llmtrain's own kernel's rates where the catalogue has them (a GPU), else the
  // products'.
  const AttentionRates own = attention_rates(r, c);
  const double attention_forward_rate = own.forward > 0 ? own.forward : rate;
  const double attention_backward_rate = own.backward > 0 ? own.backward : rate;
  const double head_forward = 2.0 * double(m.padded_vocab()) * m.hidden / tp;
  double block_recompute = 0;
  if (p.recompute == ActivationCheckpointing::full) block_recompute = block_forward;
  if (p.recompute == ActivationCheckpointing::selective) block_recompute = attention_forward;
  // The memory-bound ops between the products (norms, activation functions, softmax, residual adds):
  // bytes moved per token and block, Korthikanti et al.'s activation bytes per token and layer for a
  // model that stores its attention scores, h·(10 + 24/t + 5·a·s/(h·t)) at 16 bits (sequence
  // parallelism: h·(34 + 5·a·s/h)/t), written once forward and read and written again backward.
  // Without stored scores (llmtrain's flash-style attention) the 5·a·s/h term is not there.
  const double h = m.hidden, a = m.heads, seq = m.seq_len;
  const double scores = c.stores_attention_scores ? 5 * a * seq / h : 0.0;
  const double stored = p.sequence_parallel ? h * (34 + scores) / tp : h * (10 + 24.0 / tp + scores / tp);
  const double byte_scale = element / 2;
  const double traffic_forward = stored * byte_scale, traffic_backward = 2 * stored * byte_scale;
  double traffic_recompute = 0;
  if (p.recompute == ActivationCheckpointing::full) traffic_recompute = traffic_forward;
  if (p.recompute == ActivationCheckpointing::selective) traffic_recompute = h * scores / tp * byte_scale;
  double bandwidth = dev.memory_bandwidth;
  if (dev.shares_host) bandwidth /= per_node;

  // Tensor parallelism, what the model's crossings send (parallel/tensor_parallel.h): per block two
  // all-reduces of the residual stream forward, two backward, and one more in a fully recomputed
  // forward (the attention output's: the recomputation stops before the MLP's output is reduced)
  // (sequence parallelism: all-gathers and reduce-scatters of the same total bytes); one
  // at the embedding (forward) and one at the head (backward); the vocab-parallel loss's two
  // all-reduces of 1 and 2 fp32 per token (forward); with sequence parallelism the replicated
  // norm and bias gradients, one all-reduce per block and one for the final norm (backward).
  const double stream_bytes = tokens * m.hidden * element;
  const double tp_collective = ring_all_reduce_time(stream_bytes, tp, tp_bw, tp_lat);
  const bool full_recompute = p.recompute == ActivationCheckpointing::full;
  const double tp_forward_block = 2 * tp_collective;
  const double tp_backward_block = (full_recompute ? 3 : 2) * tp_collective;
  const double loss_time =
      ring_all_reduce_time(tokens * 4, tp, tp_bw, tp_lat) + ring_all_reduce_time(tokens * 8, tp, tp_bw, tp_lat);
  double block_replicated = 0, head_replicated = 0;  // 1-D parameters every tp rank holds whole
  for (const trainer::ParamSpec& ps : trainer::model_param_specs(m)) {
    if (ps.tp_split_dim >= 0 || ps.shape.size() != 1) continue;
    if (ps.place == trainer::ParamPlace::block && ps.layer == 0) block_replicated += double(ps.numel()) * element;
    if (ps.place == trainer::ParamPlace::head) head_replicated += double(ps.numel()) * element;
  }
  // Context parallelism, per block: the ring sends cp − 1 blocks of this rank's packed q|k|v rows
  // forward (overlapped with the attention of the block held: only what the attention does not
  // cover shows) and twice that backward (the blocks and their gradient accumulators); Ulysses two
  // all-to-alls forward (q|k|v, the output) and three backward, not overlapped.
  double cp_forward_block = 0, cp_backward_block = 0;
  if (cp > 1) {
    const double qkv_bytes = tokens * double(m.heads + 2 * m.kv_heads) * m.head_size() / tp * element;
    const double out_bytes = tokens * double(m.heads) * m.head_size() / tp * element;
    const double attention_time = tokens * attention_forward / attention_forward_rate;
    if (p.cp_comm == CpComm::ring) {
      const double pass = (cp - 1) * (qkv_bytes / cp_bw + cp_lat);
      cp_forward_block = std::max(0.0, pass - attention_time);
      cp_backward_block = std::max(0.0, 2 * pass - 2 * attention_time);
    } else {
      // (structured bindings are copied in: clang before 16 cannot capture them by reference)
      auto all_to_all = [&, bw = cp_bw, lat = cp_lat](double bytes) {
        return double(cp - 1) / cp * bytes / bw + (cp - 1) * lat;
      };
      cp_forward_block = all_to_all(qkv_bytes) + all_to_all(out_bytes);
      cp_backward_block = 2 * all_to_all(out_bytes) + all_to_all(qkv_bytes);
    }
  }
  // Expert parallelism, per MoE block: the offsets' all-gather and two all-to-alls of the block's
  // picks (tokens · top_k rows; a rank keeps 1/ep of them) forward, two backward and two more in a
  // full recomputation, not overlapped. An ep group spans tp · ep consecutive ranks.
  double ep_forward_block = 0, ep_backward_block = 0;
  if (p.ep > 1) {
    const auto [ep_bw, ep_lat] = link(int64_t(tp) * p.ep > c.gpus_per_node);
    const double picks = tokens * m.moe.top_k * m.hidden * element;
    const double a2a = double(p.ep - 1) / p.ep * picks / ep_bw + (p.ep - 1) * ep_lat;
    ep_forward_block = 2 * a2a + (p.ep - 1) * ep_lat;
    ep_backward_block = (full_recompute ? 4 : 2) * a2a + (full_recompute ? (p.ep - 1) * ep_lat : 0);
  }
  const bool sp = p.sequence_parallel && tp > 1;
  const double sp_grads_block = sp ? ring_all_reduce_time(block_replicated, tp, tp_bw, tp_lat) : 0;
  const double sp_grads_head = sp ? ring_all_reduce_time(head_replicated, tp, tp_bw, tp_lat) : 0;
  // The bytes one tp rank sends (ring volumes) for a stage's micro-batch.
  const double ring_share = tp > 1 ? 2.0 * (tp - 1) / tp : 0;
  auto tp_bytes_per_micro_batch = [&](const trainer::StageLayout& layout) {
    const double blocks = layout.blocks();
    double all_reduced = blocks * (2 + (full_recompute ? 3 : 2)) * stream_bytes;
    if (layout.has_embedding) all_reduced += stream_bytes;
    if (layout.has_head) all_reduced += stream_bytes + tokens * 12 + (sp ? head_replicated : 0);
    if (sp) all_reduced += blocks * block_replicated;
    return ring_share * all_reduced;
  };
  // Pipeline: one message per forward and backward, the stream (1/tp of it with sequence parallelism).
  const double p2p = pp > 1 ? stream_bytes / (p.sequence_parallel ? tp : 1) / pp_bw + pp_lat : 0;

  struct StageCost {
    double forward = 0, backward = 0, tp_forward = 0, tp_backward = 0;
  };
  auto stage_layout = [&](int s) { return trainer::pipeline_stage_layout(m, p, s); };
  std::vector<StageCost> stages(static_cast<size_t>(pp));
  for (int s = 0; s < pp; ++s) {
    const trainer::StageLayout layout = stage_layout(s);
    const double blocks = layout.blocks();
    int moe_blocks = 0;
    for (int l = 0; l < layout.blocks(); ++l) moe_blocks += m.moe.layer(layout.layer(l)) ? 1 : 0;
    // The products' FLOPs at `rate`, attention's at its own rates.
    const double attention_flops = tokens * blocks * attention_forward;
    const double product_flops =
        tokens * (blocks * block_forward + (layout.has_head ? head_forward : 0)) - attention_flops;
    const double recompute_attention =
        p.recompute == ActivationCheckpointing::none ? 0.0 : attention_flops;  // selective and full redo it
    const double recompute_products = tokens * blocks * block_recompute - recompute_attention;
    StageCost& sc = stages[size_t(s)];
    const double fwd_traffic = tokens * blocks * traffic_forward;
    const double bwd_traffic = tokens * blocks * (traffic_backward + traffic_recompute);
    const double fwd_time = product_flops / rate + attention_flops / attention_forward_rate;
    sc.forward = (fwd_time + fwd_traffic / bandwidth) / v;  // per chunk: each op is one chunk's work
    sc.backward = ((2 * product_flops + recompute_products) / rate +
                   (recompute_attention / attention_forward_rate + 2 * attention_flops / attention_backward_rate) +
                   bwd_traffic / bandwidth) /
                  v;
    sc.tp_forward = (blocks * (tp_forward_block + cp_forward_block) + moe_blocks * ep_forward_block +
                     (layout.has_embedding ? tp_collective : 0) + (layout.has_head ? loss_time : 0)) /
                    v;
    sc.tp_backward = (blocks * (tp_backward_block + sp_grads_block + cp_backward_block) +
                      moe_blocks * ep_backward_block + (layout.has_head ? tp_collective + sp_grads_head : 0)) /
                     v;
  }
  enum Part { compute, tensor, pipe };
  auto op_time = [&](int s, const parallel::PipeOp& op, Part part) {
    const StageCost& sc = stages[size_t(s)];
    const double comm = pp > 1 ? p2p : 0;
    switch (op.kind) {
      case parallel::PipeOpKind::forward:
        return part == compute ? sc.forward : part == tensor ? sc.tp_forward : comm;
      case parallel::PipeOpKind::backward:
        return part == compute ? sc.backward : part == tensor ? sc.tp_backward : comm;
      case parallel::PipeOpKind::backward_input:  // the input gradient's half, and the collectives
        return part == compute ? sc.backward / 2 : part == tensor ? sc.tp_backward : comm;
      case parallel::PipeOpKind::backward_weight:
        return part == compute ? sc.backward / 2 : 0.0;
      default:
        return 0.0;
    }
  };
  const std::vector<std::vector<parallel::PipeOp>> lists = parallel::make_schedules(p.schedule, {pp, 0, mbs, v});
  const parallel::SimulatedStep sim = parallel::simulate_step(lists, [&](int s, const parallel::PipeOp& op) {
    return op_time(s, op, compute) + op_time(s, op, tensor) + op_time(s, op, pipe);
  });
  const double span = sim.span();
  size_t busiest = 0;
  for (size_t s = 0; s < sim.busy.size(); ++s)
    if (sim.busy[s] > sim.busy[busiest]) busiest = s;

  StepPrediction out;
  for (const parallel::PipeOp& op : lists[busiest]) {
    out.compute += op_time(int(busiest), op, compute);
    out.tp_comm += op_time(int(busiest), op, tensor);
    out.pp_comm += op_time(int(busiest), op, pipe);
  }
  out.bubble = std::max(0.0, span - sim.busy[busiest]);
  out.tp_bytes = mbs * tp_bytes_per_micro_batch(stage_layout(int(busiest)));
  const StageCost& last = stages[busiest];

  // Data parallelism and ZeRO over the stage's parameters.
  const trainer::StageLayout held = stage_layout(int(busiest));
  const double stage_params = held.blocks() * counts.block + (held.has_embedding ? counts.embedding : 0) +
                              (held.has_head ? counts.head : 0) +
                              (held.has_head && !held.has_embedding && m.tie_embeddings ? counts.embedding : 0);
  const double grad_element = p.grad_reduce == GradReduceDtype::bf16 ? 2 : 4;
  const double grads = stage_params * grad_element, params = stage_params * element;
  const int shard = p.shard_group;
  const double bucket_share = std::min(1.0, p.bucket_mb * 1e6 / std::max(grads, 1.0));
  const double backward_last = last.backward * v;  // the last micro-batch's backward over all chunks
  if (replicas > 1) {
    if (p.zero == 0) {
      const double t = ring_all_reduce_time(grads, replicas, dp_bw, dp_lat);
      out.dp_comm = std::max(t - backward_last, t * bucket_share);
    } else {
      const double rs = ring_reduce_scatter_time(grads, shard, dp_bw, dp_lat);
      const double ag = ring_all_gather_time(params, shard, dp_bw, dp_lat);
      // Hybrid sharding: the shards are all-reduced across the dp / shard groups.
      const double across = ring_all_reduce_time(grads / shard, replicas / shard, dp_bw, dp_lat);
      if (p.zero == 1) {
        out.dp_comm = std::max(rs - backward_last, rs * bucket_share) + ag + across;
      } else if (p.zero == 2) {
        out.dp_comm = mbs * std::max(rs - backward_last, rs * bucket_share) + ag + across;
      } else {  // every micro-batch gathers the parameters before forward and before backward
        const double forward_all = last.forward * v;
        out.dp_comm =
            mbs * (std::max(0.0, ag - forward_all) + std::max(rs * bucket_share, ag + rs - backward_last)) + across;
      }
    }
  }
  // AdamW: about 32 bytes read and written per owned element (gradient, moments, master, parameter);
  // 8 fewer with bf16 moments (optimizer.state_dtype: each read and written in 2 bytes, not 4), and 6
  // fewer without a master (optimizer.master false: the bf16 parameter read and written, 4 bytes,
  // in place of the master's 8 and the rounded copy's 2).
  const double update_bytes = (r.optimizer.state_dtype == StateDtype::bf16 ? 24 : 32) - (r.optimizer.master ? 0 : 6);
  out.optimizer =
      stage_params / shard * update_bytes / (dev.shares_host ? dev.memory_bandwidth / per_node : dev.memory_bandwidth);
  // Where and when the busiest stage's update runs, as the run places it (trainer/placement/placement.h).
  const trainer::Placement placed = trainer::place(r, p, {int(busiest), 0, 0});
  if (r.optimizer.name == OptimizerName::muon) {
    // Muon: each hidden matrix (this rank's block [m, n], its Gram side k — the unsplit side under
    // tp, else the smaller — and K = m·n / k) orthogonalized in ns_steps iterations of the Gram
    // matrix, its square and the polynomial's product: 4k²K + 2k³ FLOPs each, at the products' rate
    // in ns_dtype (trainer/optim/muon.h); under tp each Gram matrix (k², fp32) is all-reduced. Under
    // ZeRO (a shard group of S ranks) each matrix is orthogonalized on one owner, S matrices at once
    // (the work 1/S of it on each rank), its update's pieces sent to the owner and the result's back:
    // (S − 1)/S of its fp32 elements each way, and a latency per piece.
    const MuonConfig& mc = r.optimizer.muon;
    const double owners = p.zero >= 1 ? double(std::max(shard, 1)) : 1.0;
    double flops = 0, reduced = 0;
    for (const trainer::MuonMatrix& mat : trainer::muon_matrices(placed.params)) {
      const double k = double(mat.gram_side()), kk = double(mat.numel()) / k;
      flops += double(mc.ns_steps) * (4 * k * k * kk + 2 * k * k * k) / owners;
      if (mat.split >= 0) reduced += double(mc.ns_steps) * k * k * 4 / owners;
      if (owners > 1)
        out.optimizer += 2 * ((owners - 1) / owners * double(mat.numel()) * 4 / dp_bw + (owners - 1) * dp_lat);
    }
    double ns_rate = mc.ns_dtype == StateDtype::bf16 ? dev.achievable_bf16 : dev.achievable_fp32;
    if (dev.shares_host) ns_rate = host_rank_rate(r, dev, ns_rate, per_node);
    if (ns_rate > 0) out.optimizer += flops / ns_rate;
    if (tp > 1 && reduced > 0) out.optimizer += 2.0 * (tp - 1) / tp * reduced / tp_bw;
  }
  if (placed.offload != OffloadKind::none) {
    // docs/offload.md. host's CPU update: the owned gradients down and the values up over the host
    // link, the update at the host's memory bandwidth, pipelined. Otherwise the state crosses to the
    // update and back, overlapped with it: host memory over the host link, or a node's disk shared
    // by its ranks.
    const double owned = stage_params / shard;
    if (placed.update == trainer::UpdateSite::cpu) {
      const double link =
          owned * double(trainer::cpu_update_bytes_per_element(p, placed.values_offloaded)) / kHostLinkBandwidth;
      out.optimizer = std::max(link, owned * 32 / (kHostMemoryBandwidth / per_node));
      // Beside backward (no clipping, no loss scaling): what the last micro-batch's backward does
      // not hide, and at least the last unit's share.
      if (placed.update_during_backward)
        out.optimizer = std::max(
            out.optimizer - backward_last,
            out.optimizer * std::min(1.0, double(trainer::offload_unit_for(int64_t(owned))) / std::max(owned, 1.0)));
    } else {
      const double state = owned * (p.fp32_master() ? 3 : 2) * 4;
      const double link = placed.offload == OffloadKind::host ? kHostLinkBandwidth : kDiskBandwidth / per_node;
      out.optimizer = std::max(out.optimizer, 2 * state / link);
    }
  }

  out.total = out.compute + out.bubble + out.tp_comm + out.pp_comm + out.dp_comm + out.optimizer;
  const double step_tokens = double(r.train.global_batch) * m.seq_len;
  out.tokens = step_tokens;
  out.model_flops = trainer::training_flops_per_token(m) * step_tokens;
  double recompute = 0;
  if (p.recompute == ActivationCheckpointing::full)
    recompute = m.layers * (2 * counts.block_matmul * tp + 4.0 * m.hidden * m.seq_len);
  if (p.recompute == ActivationCheckpointing::selective) recompute = m.layers * 4.0 * m.hidden * m.seq_len;
  out.flops_with_recompute = out.model_flops + recompute * step_tokens;

  struct Named {
    double seconds;
    const char* name;
  };
  const Named parts[] = {{out.bubble, "pipeline bubble"},
                         {out.tp_comm, "tensor-parallel communication"},
                         {out.pp_comm, "pipeline transfers"},
                         {out.dp_comm, "data-parallel communication"},
                         {out.optimizer, "optimizer (memory bandwidth)"}};
  const Named* worst = std::max_element(std::begin(parts), std::end(parts),
                                        [](const Named& a, const Named& b) { return a.seconds < b.seconds; });
  out.limit = worst->seconds >= 0.1 * out.total ? worst->name : "compute";
  // Every figure finite and non-negative: the inputs are bounded where they are read (rates from
  // 1e6 FLOP/s, bandwidths from 1 Mb/s, counts by the recipe), so one that is not is a fault of
  // the model, said as such rather than printed as inf, -nan or JSON's null.
  for (const auto& [value, name] : {std::pair{out.compute, "compute"},
                                    {out.bubble, "bubble"},
                                    {out.tp_comm, "tp_comm"},
                                    {out.pp_comm, "pp_comm"},
                                    {out.dp_comm, "dp_comm"},
                                    {out.optimizer, "optimizer"},
                                    {out.total, "total"},
                                    {out.tp_bytes, "tp_bytes"},
                                    {out.model_flops, "model_flops"},
                                    {out.flops_with_recompute, "flops_with_recompute"}})
    if (!std::isfinite(value) || value < 0)
      throw Error(fmt::format("the performance model predicts {} = {} for tp {} pp {} dp {} cp {} on {} ({} GPUs, "
                              "{} Gb/s between nodes)",
                              name, value, tp, pp, dp, cp, dev.name, c.gpus, c.inter_node_bandwidth * 8 / 1e9),
                  "an input is out of the range the model was built for: report the command");
  return out;
}

}  // namespace llmtrain::planner
