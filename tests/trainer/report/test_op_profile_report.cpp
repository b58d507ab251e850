// The op profile's report (trainer/report/op_profile_report.h): rows ordered by total time with the
// rows inside them beneath, the total of the top-level compute rows only, shares of the steps' time,
// and the JSON a script reads.
#include <gtest/gtest.h>

#include <string>

#include "trainer/report/op_profile_report.h"

namespace llmtrain::trainer {
namespace {

// Two steps of 10 ms: 12 ms in ops, of which linear_forward 8 ms (its library call 7.5 ms inside);
// a side-stream all-reduce of 3 ms beside them.
OpProfileSummary two_steps() {
  OpProfileSummary s;
  s.device = "cuda";
  s.rank = 0;
  s.first_step = 2;
  s.steps = 2;
  s.step_seconds = 0.020;
  s.rows = {{"gelu_forward", "", false, 8, 0.001},
            {"all_reduce: NCCL", "", true, 2, 0.003},
            {"linear_forward: cuBLASLt", "linear_forward", false, 16, 0.0075},
            {"linear_forward", "", false, 16, 0.008},
            {"attention_forward", "", false, 4, 0.003}};
  return s;
}

TEST(OpProfileReport, OrdersByTotalWithInnerRowsBeneathAndSideStreamsLast) {
  const OpProfileSummary s = two_steps();
  const std::vector<OrderedRow> order = op_profile_order(s);
  ASSERT_EQ(order.size(), 5u);
  const std::vector<std::pair<std::string, int>> want = {{"linear_forward", 0},
                                                         {"linear_forward: cuBLASLt", 1},
                                                         {"attention_forward", 0},
                                                         {"gelu_forward", 0},
                                                         {"all_reduce: NCCL", 0}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(order[i].row->name, want[i].first) << i;
    EXPECT_EQ(order[i].depth, want[i].second) << i;
  }
  EXPECT_DOUBLE_EQ(op_profile_in_ops_seconds(s), 0.012) << "neither the inner nor the side-stream row adds";
}

TEST(OpProfileReport, TheTableHasEveryRowTheTotalAndTheShares) {
  const std::vector<std::string> lines = op_profile_table(two_steps());
  std::string text;
  for (const std::string& l : lines) text += l + "\n";
  EXPECT_NE(lines.front().find("rank 0 on cuda: 2 step(s) from step 2, 10.000 ms a step"), std::string::npos) << text;
  // name, calls, total ms, ms per step, share of the steps' 20 ms.
  auto has_row = [&](const std::string& name, const std::string& rest) {
    for (const std::string& l : lines)
      if (l.rfind("  " + name + " ", 0) == 0 && l.find(rest) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has_row("linear_forward", "16       8.000      4.000   40.0%")) << text;
  EXPECT_TRUE(has_row("  linear_forward: cuBLASLt", "16       7.500      3.750   37.5%")) << text;
  EXPECT_TRUE(has_row("attention_forward", "4       3.000      1.500   15.0%")) << text;
  EXPECT_TRUE(has_row("in ops (the total)", "28      12.000      6.000   60.0%")) << text;
  EXPECT_TRUE(has_row("all_reduce: NCCL (side stream)", "2       3.000")) << text;
  EXPECT_TRUE(has_row("outside ops", "8.000      4.000   40.0%")) << text;
  EXPECT_TRUE(has_row("the steps", "20.000     10.000  100.0%")) << text;
  // The compute rows come before the total, the side-stream row after it.
  auto at = [&](const std::string& what) { return text.find(what); };
  EXPECT_LT(at("gelu_forward"), at("in ops (the total)"));
  EXPECT_LT(at("in ops (the total)"), at("all_reduce: NCCL"));
}

TEST(OpProfileReport, NoStepProfiledSaysSo) {
  OpProfileSummary s;
  s.device = "cpu";
  const std::vector<std::string> lines = op_profile_table(s);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("no step profiled"), std::string::npos);
  EXPECT_EQ(op_profile_json(s)["ops"].size(), 0u);
}

TEST(OpProfileReport, TheJsonHasTheTablesFigures) {
  const nlohmann::json j = nlohmann::json::parse(op_profile_json(two_steps()).dump());
  EXPECT_EQ(j["rank"], 0);
  EXPECT_EQ(j["device"], "cuda");
  EXPECT_EQ(j["first_step"], 2);
  EXPECT_EQ(j["steps"], 2);
  EXPECT_DOUBLE_EQ(j["step_ms"].get<double>(), 20.0);
  EXPECT_DOUBLE_EQ(j["step_ms_per_step"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(j["in_ops_ms"].get<double>(), 12.0);
  EXPECT_DOUBLE_EQ(j["outside_ops_ms"].get<double>(), 8.0);
  EXPECT_EQ(j["dropped_scopes"], 0);
  ASSERT_EQ(j["ops"].size(), 5u);
  const nlohmann::json& first = j["ops"][0];
  EXPECT_EQ(first["name"], "linear_forward");
  EXPECT_TRUE(first["inside"].is_null());
  EXPECT_EQ(first["depth"], 0);
  EXPECT_EQ(first["side_stream"], false);
  EXPECT_EQ(first["calls"], 16);
  EXPECT_DOUBLE_EQ(first["total_ms"].get<double>(), 8.0);
  EXPECT_DOUBLE_EQ(first["ms_per_step"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(first["share"].get<double>(), 0.4);
  EXPECT_EQ(j["ops"][1]["inside"], "linear_forward");
  EXPECT_EQ(j["ops"][1]["depth"], 1);
  EXPECT_EQ(j["ops"][4]["side_stream"], true);
}

}  // namespace
}  // namespace llmtrain::trainer
