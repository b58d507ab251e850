#include "parallel/pipe_links.h"

#include <fmt/format.h>

#include "common/error.h"

namespace llmtrain::parallel {

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
    if (me == up) {
      out.activation_out = std::move(act);
      out.grad_in = std::move(grad);
    }
    if (me == down) {
      out.activation_in = std::move(act);
      out.grad_out = std::move(grad);
    }
  }
  return out;
}

}  // namespace llmtrain::parallel
