// The stop agreement: after each step every rank asks whether a stop was requested (SIGTERM/SIGINT,
// common/signals.h) and all of them act on the answer together, so that no rank leaves the loop
// while another waits for it in a collective.
#pragma once

#include "parallel/comm/comm.h"

namespace llmtrain::trainer {

// Whether a stop was requested on any rank of `world` (collective over it: a max of one flag).
bool stop_agreed(parallel::Comm& world);

}  // namespace llmtrain::trainer
