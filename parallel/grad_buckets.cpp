#include "parallel/grad_buckets.h"

#include "common/clock.h"
#include "common/error.h"

namespace llmtrain::parallel {

GradBuckets::GradBuckets(Comm& dp, Tensor grads, std::vector<ParamRange> params, double bucket_mb,
                         Accumulate accumulate)
    : comm_(dp), grads_(grads), params_(std::move(params)), average_(ReduceOp::avg, accumulate) {
  using kernels::DType;
  LT_CHECK(grads.dtype == DType::fp32 || grads.dtype == DType::bf16 || grads.dtype == DType::fp16,
           "gradient buffer of {}", kernels::to_string(grads.dtype));
  LT_CHECK(bucket_mb > 0, "bucket_mb {}", bucket_mb);
  const auto cap = static_cast<int64_t>(bucket_mb * 1024 * 1024);
  const auto esz = static_cast<int64_t>(kernels::dtype_size(grads.dtype));
  for (const auto& p : params_)
    LT_CHECK(p.offset >= 0 && p.numel >= 0 && p.offset + p.numel <= grads.numel(),
             "parameter range [{}, +{}) outside a gradient buffer of {}", p.offset, p.numel, grads.numel());

  bucket_of_.assign(params_.size(), -1);
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
    const ParamRange& p = params_[i];
    bool join = !buckets_.empty();
    if (join) {
      const Bucket& b = buckets_.back();
      join = b.numel * esz < cap && p.offset + p.numel == b.offset;  // not full, and adjacent below it
    }
    if (!join) buckets_.push_back({p.offset + p.numel, 0, {}});
    Bucket& b = buckets_.back();
    b.offset = p.offset;
    b.numel += p.numel;
    b.params.push_back(i);
    bucket_of_[i] = static_cast<int>(buckets_.size()) - 1;
  }
  ready_.assign(params_.size(), 0);
  pending_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = static_cast<int>(buckets_[b].params.size());
  work_.resize(buckets_.size());
}

void GradBuckets::start_step_clock() {
  if (step_started_) return;
  step_started_ = true;
  step_start_ = now_s();
}

void GradBuckets::mark_ready(int param) {
  LT_CHECK(param >= 0 && param < static_cast<int>(params_.size()), "parameter {} of {}", param, params_.size());
  LT_CHECK(!ready_[param], "parameter {} marked ready twice in one step", param);
  start_step_clock();
  ready_[param] = 1;
  --pending_[bucket_of_[param]];
  // Alone, a parameter is reduced once ready: reported at once, not with its bucket.
  if (comm_.size() == 1 && reduced_hook_ && params_[size_t(param)].numel > 0)
    reduced_hook_(params_[size_t(param)].offset, params_[size_t(param)].numel);
  launch_ready();
  comm_.progress();
  report_reduced(false);
}

void GradBuckets::launch_ready() {
  const int n = static_cast<int>(buckets_.size());
  while (next_launch_ < n && pending_[next_launch_] == 0) {
    const Bucket& b = buckets_[next_launch_];
    if (comm_.size() > 1 && b.numel > 0) {
      work_[next_launch_] = comm_.all_reduce_async(grads_.flat(b.offset, b.numel), average_);
      ++stats_.buckets;
      stats_.bytes += b.numel * static_cast<int64_t>(wire_element_size(average_, grads_.dtype));
    }
    ++next_launch_;
  }
}

void GradBuckets::progress() {
  comm_.progress();
  report_reduced(false);
}

void GradBuckets::report_reduced(bool wait) {
  if (!reduced_hook_) return;
  while (next_reported_ < next_launch_) {
    WorkHandle& w = work_[size_t(next_reported_)];
    if (w && !wait && !w->done()) return;
    if (w) {
      w->wait();  // done: the compute stream orders after the result, the host does not block
      w.reset();
    }
    const Bucket& b = buckets_[size_t(next_reported_++)];
    if (comm_.size() > 1 && b.numel > 0) reduced_hook_(b.offset, b.numel);
  }
}

void GradBuckets::finish() {
  start_step_clock();
  const double t0 = now_s();
  // Parameters never marked have final gradients by now: in backward order, as mark_ready would.
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i)
    if (!ready_[i]) {
      ready_[i] = 1;
      --pending_[bucket_of_[i]];
      if (comm_.size() == 1 && reduced_hook_ && params_[size_t(i)].numel > 0)
        reduced_hook_(params_[size_t(i)].offset, params_[size_t(i)].numel);
    }
  launch_ready();
  report_reduced(true);
  wait_all(work_);
  const double t1 = now_s();

  stats_.add_step(t1 - t0, t1 - step_start_);

  for (auto& w : work_) w.reset();
  std::fill(ready_.begin(), ready_.end(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = static_cast<int>(buckets_[b].params.size());
  next_launch_ = next_reported_ = 0;
  step_started_ = false;
}

}  // namespace llmtrain::parallel
