#include "parallel/pipe_links.h"

#include <fmt/format.h>

#include "common/error.h"

namespace llmtrain::parallel {

PipeLinks& PipeLinks::operator=(PipeLinks&& o) noexcept {
  if (this == &o) return *this;
  end_links();
  stages = o.stages;
  stage = o.stage;
  std::unique_ptr<Comm>* const mine[] = {&activation_out, &activation_in, &grad_out, &grad_in};
  std::unique_ptr<Comm>* const theirs[] = {&o.activation_out, &o.activation_in, &o.grad_out, &o.grad_in};
  made.clear();
  for (std::unique_ptr<Comm>* m : o.made)
    for (int i = 0; i < 4; ++i)
      if (m == theirs[i]) made.push_back(mine[i]);
  for (int i = 0; i < 4; ++i) *mine[i] = std::move(*theirs[i]);
  o.made.clear();
  return *this;
}

PipeLinks::~PipeLinks() { end_links(); }

void PipeLinks::end_links() {
  for (std::unique_ptr<Comm>* link : made) link->reset();
  made.clear();
}

void PipeLinks::progress() {
  for (Comm* c : {activation_out.get(), activation_in.get(), grad_out.get(), grad_in.get()})
    if (c) c->progress();
}

void PipeLinks::set_timeout(double seconds) {
  for (Comm* c : {activation_out.get(), activation_in.get(), grad_out.get(), grad_in.get()})
    if (c) c->set_timeout(seconds);
}

PipeLinks make_pipe_links(Comm& pp) {
  PipeLinks out;
  out.stages = pp.size();
  out.stage = pp.rank();
  const int p = out.stages, me = out.stage;
  if (p == 1) return out;
  // Boundary b joins stage b and stage (b + 1) mod p. Each split makes that pair one group (color
  // 0, the sender first by key) and leaves every other rank alone in a group it drops.
  auto link = [&](int from, int to, const char* what) -> std::unique_ptr<Comm> {
    const bool member = me == from || me == to;
    std::unique_ptr<Comm> c = pp.split(member ? 0 : 1 + me, me == from ? kLinkSender : kLinkReceiver,
                                       fmt::format("{} {} {} to {}", pp.name(), what, from, to));
    if (!member) return nullptr;
    LT_CHECK(c->size() == 2 && c->rank() == (me == from ? kLinkSender : kLinkReceiver),
             "pipeline link {}: size {} rank {} on stage {}", c->name(), c->size(), c->rank(), me);
    return c;
  };
  for (int b = 0; b < p; ++b) {
    const int up = b, down = (b + 1) % p;
    std::unique_ptr<Comm> act = link(up, down, "activations");
    std::unique_ptr<Comm> grad = link(down, up, "gradients");
    // Each link joins the list when made, so every stage lists (and ends) them in the same order.
    if (me == up && act) {
      out.activation_out = std::move(act);
      out.made.push_back(&out.activation_out);
    }
    if (me == down && act) {
      out.activation_in = std::move(act);
      out.made.push_back(&out.activation_in);
    }
    if (me == up && grad) {
      out.grad_in = std::move(grad);
      out.made.push_back(&out.grad_in);
    }
    if (me == down && grad) {
      out.grad_out = std::move(grad);
      out.made.push_back(&out.grad_out);
    }
  }
  return out;
}

}  // namespace llmtrain::parallel
