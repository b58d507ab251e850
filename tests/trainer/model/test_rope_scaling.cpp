// YaRN's RoPE table against transformers: the recipe's model.rope_scaling resolved for the op
// (rope_scaling_op: the attention factor inferred from factor, mscale and mscale_all_dim as
// transformers infers it) and the table rope_table builds from it, against the inverse
// frequencies and attention factor of transformers' ROPE_INIT_FUNCTIONS['yarn'].
//
// kYarnCases is what tests/trainer/model/yarn_reference.py prints (run it with
// scripts/setup.sh's .venv-hf5 to regenerate): a Qwen-style range (truncated), gpt-oss's
// (truncate false), DeepSeek's mscale / mscale_all_dim, and one with its own attention factor and
// betas. transformers computes the frequencies in float32, the table here in double then float:
// they agree to float32's rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/ops.h"
#include "trainer/model/model.h"

namespace llmtrain::trainer {
namespace {

struct YarnCase {
  int64_t head_dim;
  double theta;
  RopeScalingConfig scaling;
  double attention_factor;       // transformers' attention_scaling
  std::vector<double> inv_freq;  // transformers' inv_freq, head_dim / 2 of them
};

const YarnCase kYarnCases[] = {
    {32,
     1000000.0,
     {.type = RopeScalingType::yarn, .factor = 4.0, .original_max_positions = 32768},
     1.138629436111989,
     {1.0, 0.4216965138912201, 0.17782793939113617, 0.07498941570520401, 0.03162277862429619, 0.01333521492779255,
      0.00477990135550499, 0.001659961650148034, 0.0005499999970197678, 0.00016867858357727528, 4.4456985051510856e-05,
      1.8747356079984456e-05, 7.905693564680405e-06, 3.3338035336782923e-06, 1.405853367941745e-06,
      5.928434347879374e-07}},
    {64,
     150000.0,
     {.type = RopeScalingType::yarn,
      .factor = 32.0,
      .original_max_positions = 4096,
      .beta_fast = 32.0,
      .beta_slow = 1.0,
      .truncate = false},
     1.3465735902799727,
     {1.0,
      0.6890442967414856,
      0.4747820496559143,
      0.32714587450027466,
      0.22541800141334534,
      0.15532298386096954,
      0.1070244237780571,
      0.07374456524848938,
      0.05081327259540558,
      0.031705696135759354,
      0.019334999844431877,
      0.011592049151659012,
      0.006794959306716919,
      0.0038603590801358223,
      0.002093792660161853,
      0.00105260219424963,
      0.0004564839182421565,
      0.00012931869423482567,
      3.830881178146228e-05,
      2.6396468456368893e-05,
      1.818833698052913e-05,
      1.253256959898863e-05,
      8.635495760245249e-06,
      5.95023948335438e-06,
      4.099978468730114e-06,
      2.8250667583051836e-06,
      1.9465962850517826e-06,
      1.3412909538601525e-06,
      9.242089618055616e-07,
      6.368209142237902e-07,
      4.38797854940276e-07,
      3.023511396804679e-07}},
    {32,
     10000.0,
     {.type = RopeScalingType::yarn,
      .factor = 40.0,
      .original_max_positions = 4096,
      .mscale = 1.0,
      .mscale_all_dim = 0.707},
     1.0857263992561355,
     {1.0, 0.5623413324356079, 0.3162277638912201, 0.17782793939113617, 0.10000000149011612, 0.05623412877321243,
      0.027218176051974297, 0.012829016894102097, 0.005821428261697292, 0.0024903686717152596, 0.0009599771583452821,
      0.00029214590904302895, 2.499999936844688e-05, 1.4058532542549074e-05, 7.905694474175107e-06,
      4.445698323252145e-06}},
    {16,
     10000.0,
     {.type = RopeScalingType::yarn,
      .factor = 8.0,
      .original_max_positions = 32,
      .beta_fast = 8.0,
      .beta_slow = 2.0,
      .attention_factor = 1.25},
     1.25,
     {1.0, 0.03952847048640251, 0.012500000186264515, 0.0039528473280370235, 0.0012499999720603228,
      0.00039528473280370235, 0.0001250000059371814, 3.9528473280370235e-05}},
};

TEST(RopeScaling, YarnMatchesTransformers) {
  for (const YarnCase& c : kYarnCases) {
    SCOPED_TRACE("head_dim " + std::to_string(c.head_dim) + " theta " + std::to_string(c.theta) + " factor " +
                 std::to_string(c.scaling.factor));
    EXPECT_NEAR(c.scaling.yarn_attention_factor(), c.attention_factor, 1e-12);
    const kernels::RopeScaling op = rope_scaling_op(c.scaling);
    ASSERT_EQ(op.type, kernels::RopeScaling::Type::yarn);
    const int64_t half = c.head_dim / 2, positions = 4;
    ASSERT_EQ(int64_t(c.inv_freq.size()), half);
    kernels::Buffer table(kernels::DType::fp32, {positions, 2, half}, kernels::Device::cpu);
    kernels::rope_table(table.tensor(), c.theta, op);
    const float* t = table.tensor().ptr<float>();
    // Position 1's entries are af · cos(inv_freq) and af · sin(inv_freq): their norm is the
    // attention factor and their angle the frequency (every inv_freq here is below π).
    int bad = 0;
    for (int64_t i = 0; i < half; ++i) {
      const double cos1 = t[c.head_dim + i], sin1 = t[c.head_dim + half + i];
      const double scale = std::hypot(cos1, sin1), freq = std::atan2(sin1, cos1), want = c.inv_freq[size_t(i)];
      EXPECT_NEAR(scale, c.attention_factor, 1e-6 * c.attention_factor) << "pair " << i;
      if (std::abs(freq - want) > 2e-6 * want + 1e-12 && ++bad <= 5)
        ADD_FAILURE() << "pair " << i << ": frequency " << freq << ", transformers " << want;
    }
    EXPECT_EQ(bad, 0) << "frequencies off transformers'";
  }
}

// The attention factor transformers infers: 0.1 · ln(factor) + 1, or DeepSeek's ratio with both
// mscales set, or the one given; 1 without stretching.
TEST(RopeScaling, YarnAttentionFactorInference) {
  RopeScalingConfig r{.type = RopeScalingType::yarn, .factor = 32};
  EXPECT_NEAR(r.yarn_attention_factor(), 0.1 * std::log(32.0) + 1, 1e-15);
  r.mscale = 1;
  EXPECT_NEAR(r.yarn_attention_factor(), 0.1 * std::log(32.0) + 1, 1e-15) << "mscale alone changes nothing";
  r.mscale_all_dim = 1;
  EXPECT_NEAR(r.yarn_attention_factor(), 1.0, 1e-15);
  r.attention_factor = 0.9;
  EXPECT_EQ(r.yarn_attention_factor(), 0.9);
  EXPECT_EQ((RopeScalingConfig{.type = RopeScalingType::yarn, .factor = 1}.yarn_attention_factor()), 1.0);
  EXPECT_EQ(rope_scaling_op(RopeScalingConfig{.type = RopeScalingType::llama3, .factor = 8}).attention_factor, 1.0);
}

}  // namespace
}  // namespace llmtrain::trainer
