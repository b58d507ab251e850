// Our side of scripts/bench/tp_comm.sh: the bytes each tensor-parallel rank sends per training
// step, counted by the communicator (tests/parallel/comm/comm_counting.h wraps the mesh's tp group), for one
// layout. The ranks are threads on the in-process communicator; the counts are the ring volumes,
// so they do not depend on the backend. Prints one line of key=value pairs (rank 0's counts; every
// rank of a tp group sends the same).
//   tp_comm_bench [--family gpt2|llama] [--layers L] [--hidden d] [--heads H] [--seq T]
//                 [--micro-batch b] [--micro-batches m] [--tp N] [--sp 0|1] [--steps S]
// A benchmark tool, not a user command.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>

#include "parallel/comm/comm_threads.h"
#include "tests/common/test_layout.h"
#include "tests/parallel/comm/comm_counting.h"
#include "trainer/data/indexed_dataset.h"
#include "trainer/loop/train_step.h"

using namespace llmtrain;
using namespace llmtrain::trainer;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::map<std::string, std::string> a = {
      {"family", "gpt2"},   {"layers", "4"},        {"hidden", "256"}, {"heads", "8"}, {"seq", "128"},
      {"micro-batch", "2"}, {"micro-batches", "2"}, {"tp", "2"},       {"sp", "0"},    {"steps", "2"}};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0 || !a.count(k.substr(2))) {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
    a[k.substr(2)] = argv[i + 1];
  }
  auto num = [&](const char* k) { return std::atoi(a[k].c_str()); };

  const fs::path dir = fs::temp_directory_path() / ("tp_comm_bench_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string prefix = (dir / "data").string();
  {
    IndexedDatasetWriter w(prefix, TokenDtype::uint16);
    std::mt19937 rng(3);
    for (int d = 0; d < 400; ++d) {
      std::vector<int32_t> doc(size_t(50 + rng() % 200));
      for (auto& t : doc) t = int32_t(rng() % 256);
      w.add_document(doc);
    }
    w.close();
    w.commit();
  }

  Recipe r;
  r.model.family = a["family"] == "llama" ? ModelFamily::llama : ModelFamily::gpt2;
  r.model.layers = num("layers"), r.model.hidden = num("hidden"), r.model.heads = num("heads");
  r.model.kv_heads = r.model.heads;
  r.model.ffn_hidden = 4 * r.model.hidden, r.model.vocab = 257, r.model.vocab_pad = 128;
  r.model.seq_len = num("seq"), r.model.max_positions = num("seq");
  r.model.tie_embeddings = true;
  r.train.micro_batch = num("micro-batch");
  r.train.global_batch = num("micro-batch") * num("micro-batches");
  r.train.steps = 100, r.optimizer.decay_steps = 100;
  r.parallel.tp = num("tp"), r.parallel.dp = 1, r.parallel.sequence_parallel = num("sp") != 0;
  const int steps = num("steps");

  int64_t bytes = 0;
  std::array<int64_t, parallel::CountingComm::kOps> per_op{}, calls{};
  parallel::run_ranks_in_threads(
      r.parallel.tp,
      [&](parallel::Comm& world) {
        const parallel::Mesh mesh({r.parallel.tp, 1, 1}, world.rank());
        parallel::MeshComms comms = parallel::make_mesh_comms(mesh, world.split(0, world.rank(), "world"));
        auto counting = std::make_unique<parallel::CountingComm>(std::move(comms.tp));
        parallel::CountingComm& tp = *counting;
        comms.tp = std::move(counting);
        GptDataset data({{prefix, 1.0}}, r.model.seq_len, 7, r.model.vocab);
        Sampler sampler(r.train.global_batch, r.train.micro_batch, 0, 1);
        MicroBatchReader batches(data, sampler, r.model.seq_len);
        const Placement placement = place(r, test_layout(r), mesh.coord());
        Model model(r.model, placement.model, *comms.tp);
        model.init_parameters(1);
        TrainStep step(r, placement, model, comms, batches);
        step.run(0, 0);  // warm
        tp.reset();
        for (int s = 1; s <= steps; ++s) step.run(s, int64_t(s) * r.train.global_batch);
        if (world.rank() == 0) {
          bytes = tp.bytes_sent() / steps;
          for (int op = 0; op < parallel::CountingComm::kOps; ++op) {
            per_op[size_t(op)] = tp.bytes_sent(parallel::CountingComm::Op(op)) / steps;
            calls[size_t(op)] = tp.calls(parallel::CountingComm::Op(op)) / steps;
          }
        }
      },
      600.0);
  fs::remove_all(dir);
  using C = parallel::CountingComm;
  std::printf(
      "family=%s layers=%d hidden=%d seq=%d micro_batch=%d micro_batches=%d tp=%d sp=%d bytes_per_step=%lld "
      "all_reduce_bytes=%lld reduce_scatter_bytes=%lld all_gather_bytes=%lld all_reduce_calls=%lld "
      "reduce_scatter_calls=%lld all_gather_calls=%lld\n",
      a["family"].c_str(), num("layers"), num("hidden"), num("seq"), num("micro-batch"), num("micro-batches"),
      num("tp"), num("sp"), static_cast<long long>(bytes), static_cast<long long>(per_op[C::all_reduce_op]),
      static_cast<long long>(per_op[C::reduce_scatter_op]), static_cast<long long>(per_op[C::all_gather_op]),
      static_cast<long long>(calls[C::all_reduce_op]), static_cast<long long>(calls[C::reduce_scatter_op]),
      static_cast<long long>(calls[C::all_gather_op]));
  return 0;
}
