#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/comm_threads.h"
#include "parallel/comm/flight_recorder.h"

namespace llmtrain::parallel {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(FlightRecorder, RecordsOperationsOfAWrappedCommAndItsSplits) {
  // Two ranks as threads; rank 0's operations go through the recorder (one process, one
  // recorder: only one rank is wrapped so the record is that rank's).
  auto comms = make_thread_comms(2, "world", 30.0);
  std::unique_ptr<Comm> recorded = with_flight_recorder(std::move(comms[0]));
  FlightRecorder& fr = flight_recorder();
  std::thread peer([&] {
    float x = 1;
    comms[1]->all_reduce(kernels::host_tensor(&x, {1}), ReduceOp::sum);
    auto sub = comms[1]->split(0, 1, "dp");
    float y[4] = {};
    auto w = sub->all_reduce_async(kernels::host_tensor(y, {4}), ReduceOp::sum);
    w->wait();
  });
  float x = 2;
  recorded->all_reduce(kernels::host_tensor(&x, {1}), ReduceOp::sum);
  EXPECT_EQ(x, 3.0f);
  EXPECT_NE(fr.last_finished().find("all_reduce #"), std::string::npos) << fr.last_finished();
  EXPECT_NE(fr.last_finished().find("on group 'world' (2 ranks, 4 B)"), std::string::npos) << fr.last_finished();
  auto sub = recorded->split(0, 0, "dp");
  EXPECT_EQ(sub->name(), "dp");
  float y[4] = {1, 2, 3, 4};
  auto w = sub->all_reduce_async(kernels::host_tensor(y, {4}), ReduceOp::sum);
  // In flight until a wait() or done() sees it complete (the peer may not have joined yet).
  EXPECT_NE(fr.in_flight().find("all_reduce_async #"), std::string::npos) << fr.in_flight();
  EXPECT_NE(fr.in_flight().find("on group 'dp' (2 ranks, 16 B) for "), std::string::npos) << fr.in_flight();
  w->wait();
  peer.join();
  EXPECT_EQ(fr.in_flight(), "");
  EXPECT_NE(fr.last_finished().find("all_reduce_async #"), std::string::npos);

  const std::string text = fr.text(0);
  EXPECT_NE(text.find("all_reduce world 2 4 -1 "), std::string::npos) << text;
  EXPECT_NE(text.find("split world 2 0 -1 "), std::string::npos) << text;
  EXPECT_NE(text.find("all_reduce_async dp 2 16 -1 "), std::string::npos) << text;

  const std::string dir = ::testing::TempDir() + "flight_" + std::to_string(::getpid());
  EXPECT_EQ(fr.dump(), "");  // no folder given: nothing written
  fr.set_dump_dir(dir, 3);
  const std::string path = fr.dump();
  EXPECT_EQ(path, dir + "/rank_00000003.txt");
  EXPECT_NE(slurp(path).find("# llmtrain flight record of rank 3"), std::string::npos);
  fr.set_dump_dir("", 0);
  std::filesystem::remove_all(dir);
}

// Issue 33: the fatal-signal dump wrote `<record>.tmp`, a fixed name, with O_TRUNC and following
// links: a link planted there made the dying rank overwrite another file.
// The recorder hands an exchange to the wrapped communicator whole (NCCL groups it; split into a
// receive and a send, two ranks that both receive first wait for each other forever).
TEST(FlightRecorder, PassesAnExchangeOnWhole) {
  auto comms = make_thread_comms(2, "pp", 30.0);
  struct Exchanges final : Comm {
    std::unique_ptr<Comm> inner;
    int exchanges = 0, point_to_point = 0;
    int rank() const override { return inner->rank(); }
    int size() const override { return inner->size(); }
    const std::string& name() const override { return inner->name(); }
    void set_timeout(double s) override { inner->set_timeout(s); }
    double timeout() const override { return inner->timeout(); }
    void progress() override { inner->progress(); }
    std::unique_ptr<Comm> split(int c, int k, std::string n) override { return inner->split(c, k, std::move(n)); }
    WorkHandle all_reduce_async(Tensor b, Reduction op) override { return inner->all_reduce_async(b, op); }
    WorkHandle reduce_scatter_async(Tensor i, Tensor o, Reduction op) override {
      return inner->reduce_scatter_async(i, o, op);
    }
    WorkHandle all_gather_async(Tensor i, Tensor o) override { return inner->all_gather_async(i, o); }
    WorkHandle broadcast_async(Tensor b, int root) override { return inner->broadcast_async(b, root); }
    WorkHandle send_async(Tensor b, int peer, int tag) override {
      ++point_to_point;
      return inner->send_async(b, peer, tag);
    }
    WorkHandle recv_async(Tensor b, int peer, int tag) override {
      ++point_to_point;
      return inner->recv_async(b, peer, tag);
    }
    WorkHandle all_to_all_async(Tensor i, Tensor o) override { return inner->all_to_all_async(i, o); }
    WorkHandle barrier_async() override { return inner->barrier_async(); }
    WorkHandle exchange_async(std::vector<Transfer> t) override {
      ++exchanges;
      return inner->exchange_async(std::move(t));
    }
  };
  auto seen = std::make_unique<Exchanges>();
  seen->inner = std::move(comms[0]);
  Exchanges& counts = *seen;
  std::unique_ptr<Comm> recorded = with_flight_recorder(std::move(seen));
  float mine = 1, theirs = 0, peer_mine = 2, peer_theirs = 0;
  std::thread peer([&] {
    comms[1]
        ->exchange_async({{Transfer::Kind::recv, kernels::host_tensor(&peer_theirs, {1}), 0},
                          {Transfer::Kind::send, kernels::host_tensor(&peer_mine, {1}), 0}})
        ->wait();
  });
  recorded
      ->exchange_async({{Transfer::Kind::recv, kernels::host_tensor(&theirs, {1}), 1},
                        {Transfer::Kind::send, kernels::host_tensor(&mine, {1}), 1}})
      ->wait();
  peer.join();
  EXPECT_EQ(theirs, 2.0f);
  EXPECT_EQ(peer_theirs, 1.0f);
  EXPECT_EQ(counts.exchanges, 1);
  EXPECT_EQ(counts.point_to_point, 0) << "the exchange reached the backend as separate sends and receives";
  EXPECT_NE(flight_recorder().last_finished().find("exchange_async #"), std::string::npos)
      << flight_recorder().last_finished();
}

TEST(FlightRecorder, SignalDumpNeverWritesThroughALink) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "flight_link_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string victim = dir + "/victim";
  std::ofstream(victim) << "precious";
  fs::create_symlink(victim, dir + "/rank_00000001.txt.tmp");
  FlightRecorder& fr = flight_recorder();  // (the process's own, as a signal handler uses it)
  fr.end(fr.begin("all_reduce", "world", 2, 4, -1));
  fr.set_dump_dir(dir, 1);
  fr.dump_from_signal();
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_NE(slurp(dir + "/rank_00000001.txt").find("all_reduce"), std::string::npos);
  EXPECT_TRUE(fs::is_symlink(dir + "/rank_00000001.txt.tmp"));  // not ours: left alone
  fr.set_dump_dir("", 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace llmtrain::parallel
