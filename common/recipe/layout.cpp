#include "common/recipe/layout.h"

#include <fmt/format.h>

#include "common/error.h"

namespace llmtrain {

Layout layout_of(const Recipe& r) {
  const ParallelConfig& p = r.parallel;
  LT_CHECK(p.dp >= 1 && (p.zero == 0 || p.zero_group >= 1),
           "layout_of on an unresolved recipe (dp {}, zero {}, zero_group {})", p.dp, p.zero, p.zero_group);
  Layout l;
  l.tp = p.tp;
  l.pp = p.pp;
  l.dp = p.dp;
  l.cp = p.cp;
  l.cp_comm = p.cp_comm;
  l.ep = p.ep;
  l.zero = p.zero;
  l.shard_group = p.zero >= 1 ? p.zero_group * p.cp : 1;
  l.schedule = p.pp_schedule;
  l.virtual_stages = p.virtual_stages;
  l.stage_blocks = p.pp_layers;
  l.sequence_parallel = p.sequence_parallel;
  l.device = r.train.device;
  l.precision = r.train.precision;
  l.master = r.optimizer.master;
  l.grad_reduce = p.grad_reduce_dtype;
  l.recompute = r.train.activation_checkpointing;
  l.bucket_mb = p.bucket_mb;
  return l;
}

std::string Layout::describe_zero() const {
  if (zero == 0) return "";
  std::string s = fmt::format("stage {}, optimizer state{} sharded over {} {}rank{}", zero,
                              parameters_sharded()  ? ", gradients and parameters"
                              : gradients_sharded() ? " and gradients"
                                                    : "",
                              shard_group, cp > 1 ? "dp × cp " : "dp ", shard_group == 1 ? "" : "s");
  if (shard_group < replicas())
    s += fmt::format(" (zero_group {}: {} shard groups of consecutive dp ranks; shards all-reduced across them)",
                     shard_group / cp, shard_groups());
  return s;
}

}  // namespace llmtrain
