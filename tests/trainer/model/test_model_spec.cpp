// Parameter counts against the published sizes of the models the recipes describe (counts from
// Hugging Face's model cards/configs, i.e. independent of our code).
#include <gtest/gtest.h>

#include "trainer/model/model_spec.h"

using namespace llmtrain;
using namespace llmtrain::trainer;

static ModelConfig gpt2_small(int vocab_pad) {
  ModelConfig m;
  m.family = ModelFamily::gpt2;
  m.layers = 12, m.hidden = 768, m.heads = 12, m.kv_heads = 12, m.ffn_hidden = 3072;
  m.vocab = 50257, m.vocab_pad = vocab_pad, m.seq_len = 1024, m.max_positions = 1024;
  m.tie_embeddings = true;
  return m;
}

TEST(ModelSpec, Gpt2SmallMatchesHuggingFaceCount) {
  // HF gpt2: 124,439,808 parameters (vocab 50257, tied head).
  EXPECT_EQ(count_parameters(gpt2_small(1)), 124439808);
  // Padding the vocabulary to 50304 adds 47 rows of 768.
  EXPECT_EQ(count_parameters(gpt2_small(128)), 124439808 + 47 * 768);
}

TEST(ModelSpec, Llama3_8BMatchesPublishedCount) {
  ModelConfig m;
  m.family = ModelFamily::llama;
  m.layers = 32, m.hidden = 4096, m.heads = 32, m.kv_heads = 8, m.ffn_hidden = 14336;
  m.vocab = 128256, m.vocab_pad = 128, m.seq_len = 8192, m.max_positions = 8192, m.tie_embeddings = false;
  EXPECT_EQ(count_parameters(m), 8030261248);  // Meta-Llama-3-8B
}

TEST(ModelSpec, Llama32_1BMatchesPublishedCount) {
  ModelConfig m;
  m.family = ModelFamily::llama;
  m.layers = 16, m.hidden = 2048, m.heads = 32, m.kv_heads = 8, m.ffn_hidden = 8192;
  m.vocab = 128256, m.vocab_pad = 128, m.seq_len = 4096, m.max_positions = 8192, m.tie_embeddings = true;
  EXPECT_EQ(count_parameters(m), 1235814400);  // Llama-3.2-1B
}

TEST(ModelSpec, NamesAndSplitsFollowMegatron) {
  auto specs = model_param_specs(gpt2_small(128));
  auto find = [&](const std::string& n) -> const ParamSpec& {
    for (const auto& p : specs)
      if (p.name == n) return p;
    throw std::runtime_error("missing " + n);
  };
  EXPECT_EQ(find("transformer.wte.weight").tp_split_dim, 0);  // vocab-parallel
  EXPECT_EQ(find("transformer.h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{3, 768, 768}));
  EXPECT_EQ(find("transformer.h.0.attn.c_attn.weight").tp_split_dim, 1);  // column-parallel per q/k/v
  EXPECT_EQ(find("transformer.h.0.attn.c_proj.weight").tp_split_dim, 1);  // row-parallel
  EXPECT_EQ(find("transformer.h.11.mlp.c_fc.weight").tp_split_dim, 0);
  EXPECT_EQ(find("transformer.h.11.mlp.c_proj.bias").tp_split_dim, -1);
  EXPECT_FALSE(find("transformer.h.0.ln_1.weight").weight_decay);
  EXPECT_TRUE(find("transformer.wpe.weight").weight_decay);
  EXPECT_EQ(find("transformer.h.3.mlp.c_proj.weight").init, ParamInit::normal_residual);
}

TEST(ModelSpec, FlopsFormula) {
  ModelConfig m = gpt2_small(1);
  // N excludes the position table (lookup only); the tied token table is the head's matmul.
  int64_t n = count_parameters(m) - 1024 * 768;
  EXPECT_EQ(count_matmul_parameters(m), n);
  EXPECT_DOUBLE_EQ(training_flops_per_token(m), 6.0 * n + 12.0 * 12 * 768 * 1024);
}

// A windowed layer's attention counts its window's keys: Gemma 3's five local layers of six see 512
// of 4096 positions, the sixth all of them; Mistral's every layer.
TEST(ModelSpec, FlopsCountTheWindowsKeys) {
  ModelConfig m;
  m.family = ModelFamily::llama;
  m.layers = 12, m.hidden = 256, m.heads = 4, m.kv_heads = 1, m.head_dim = 128, m.ffn_hidden = 512;
  m.vocab = 1000, m.seq_len = 4096, m.max_positions = 4096, m.tie_embeddings = true;
  const double dense = 6.0 * double(count_matmul_parameters(m));
  EXPECT_DOUBLE_EQ(training_flops_per_token(m), dense + 12.0 * 4 * 128 * 4096 * 12);
  m.sliding_window = 512;
  EXPECT_DOUBLE_EQ(training_flops_per_token(m), dense + 12.0 * 4 * 128 * 512 * 12);
  m.full_attention_every = 6;
  EXPECT_DOUBLE_EQ(training_flops_per_token(m), dense + 12.0 * 4 * 128 * (512 * 10 + 4096 * 2));
  m.sliding_window = 8192;  // wider than the sequence: every key
  EXPECT_DOUBLE_EQ(training_flops_per_token(m), dense + 12.0 * 4 * 128 * 4096 * 12);
}

// Mixtral-8x7B: 46,702,792,704 parameters (its model card's 46.7B), of which a token uses the
// attention, the router and 2 of each layer's 8 experts: 12.9B.
TEST(ModelSpec, Mixtral8x7BMatchesPublishedCount) {
  ModelConfig m;
  m.family = ModelFamily::llama;
  m.layers = 32, m.hidden = 4096, m.heads = 32, m.kv_heads = 8, m.ffn_hidden = 14336;
  m.vocab = 32000, m.vocab_pad = 128, m.seq_len = 4096, m.max_positions = 32768, m.tie_embeddings = false;
  m.moe.experts = 8, m.moe.top_k = 2, m.moe.ffn_hidden = 14336;
  EXPECT_EQ(count_parameters(m), 46702792704);
  const int64_t expert = 3 * int64_t(14336) * 4096;
  EXPECT_EQ(count_active_parameters(m), 46702792704 - 32 * 6 * expert);
  EXPECT_EQ(count_matmul_parameters(m), count_active_parameters(m) - 32000 * 4096);  // the input embedding
  // Mixtral's names, the router first, each expert's w1 and w3 adjacent, then the w2s.
  const auto specs = model_param_specs(m);
  std::vector<std::string> names;
  for (const ParamSpec& p : specs)
    if (p.layer == 1 && p.role >= ParamRole::moe_router_weight) names.push_back(p.name);
  ASSERT_EQ(names.size(), 1u + 3 * 8);
  EXPECT_EQ(names[0], "model.layers.1.block_sparse_moe.gate.weight");
  EXPECT_EQ(names[1], "model.layers.1.block_sparse_moe.experts.0.w1.weight");
  EXPECT_EQ(names[2], "model.layers.1.block_sparse_moe.experts.0.w3.weight");
  EXPECT_EQ(names[3], "model.layers.1.block_sparse_moe.experts.1.w1.weight");
  EXPECT_EQ(names[17], "model.layers.1.block_sparse_moe.experts.0.w2.weight");
  EXPECT_EQ(names[24], "model.layers.1.block_sparse_moe.experts.7.w2.weight");
  for (const ParamSpec& p : specs)
    if (p.name == "model.layers.1.block_sparse_moe.experts.7.w2.weight") {
      EXPECT_EQ(p.expert, 7);
      EXPECT_EQ(p.shape, (std::vector<int64_t>{4096, 14336}));
      EXPECT_EQ(p.tp_split_dim, 1);
    }
}

// Dense layers before the first MoE block and between them (first_dense, every).
TEST(ModelSpec, MoeLayersFollowFirstDenseAndEvery) {
  ModelConfig m;
  m.family = ModelFamily::llama;
  m.layers = 6, m.hidden = 64, m.heads = 4, m.kv_heads = 4, m.ffn_hidden = 128, m.vocab = 100, m.seq_len = 8;
  m.max_positions = 8, m.tie_embeddings = true;
  m.moe.experts = 4, m.moe.top_k = 1, m.moe.ffn_hidden = 32, m.moe.first_dense = 1, m.moe.every = 2;
  std::vector<int> moe_layers;
  for (const ParamSpec& p : model_param_specs(m))
    if (p.role == ParamRole::moe_router_weight) moe_layers.push_back(p.layer);
  EXPECT_EQ(moe_layers, (std::vector<int>{1, 3, 5}));
  const int64_t expert = 3 * 32 * 64;
  ModelConfig dense = m;
  dense.moe.experts = 0;
  // Three MLPs of 3·128·64 became 4 experts of 3·32·64 and a router of 4·64 each.
  EXPECT_EQ(count_parameters(m), count_parameters(dense) + 3 * (4 * expert + 4 * 64 - 3 * 128 * 64));
  EXPECT_EQ(count_active_parameters(m), count_parameters(m) - 3 * 3 * expert);
}
