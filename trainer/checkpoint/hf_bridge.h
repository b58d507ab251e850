// The Hugging Face bridge: our model and tokenizer in the form transformers loads (GPT2LMHeadModel;
// LlamaForCausalLM and the llama family's variants Qwen2ForCausalLM (q/k/v biases),
// Qwen3ForCausalLM (q/k norms, own head size), MistralForCausalLM (sliding window) and
// MixtralForCausalLM (Mistral with model.moe's block on every layer); PreTrainedTokenizerFast), and
// back. docs/hf.md is the user's guide; this is the
// one place that knows transformers' config fields and tensor layouts (names come from
// model_spec.cpp, which already spells them as Hugging Face does).
//
// Rules a reader could get wrong:
//  - Layouts: every linear weight of ours is [out, in]. GPT-2's Conv1D holds [in, out], so GPT-2's
//    c_attn, c_proj, c_fc and mlp.c_proj are transposed (c_attn's [3, d, d] viewed as [3d, d]);
//    LLaMA's nn.Linear weights are ours as they are. Our rotary layout (rotate_half over the two
//    halves of a head) is transformers' LLaMA layout, so q and k are not permuted.
//  - Vocabulary: our embedding and head have padded_vocab() rows; Hugging Face's have
//    config.vocab_size = model.vocab. Export drops the padding rows, import fills them with zeros
//    (ids past model.vocab never occur, so they are never read or trained).
//  - Mixtral's experts are per-expert tensors (experts.{e}.w1/w3/w2) on disk, as 4.40 and 5.x's
//    save_pretrained both write them: model_spec.cpp's names. 5.x's in-memory layout (mlp.gate,
//    mlp.experts.gate_up_proj [E, 2f, d] = each expert's w1 then w3, down_proj [E, d, f] = w2),
//    which save_pretrained(save_original_format=False) writes, is read too (HfTensorLayout::fused_*).
//    Qwen3-MoE's are the same tensors under its own names (mlp.gate, mlp.experts.{e}.gate_proj /
//    up_proj / down_proj), with the same fused layout in 5.x. Qwen2-MoE's too, plus its shared
//    expert mlp.shared_expert.{gate,up,down}_proj and mlp.shared_expert_gate (never fused).
//  - Gemma 3's RMSNorms (the four per block, q/k norms, the final one) compute x̂ · (1 + w): ours hold
//    the multiplier, so import adds 1 and export subtracts 1 (HfTensorLayout::offset). The norms are
//    not weight-decayed, so training either form takes the same steps.
//  - Config fields are read as transformers 4.x and 5.x write them (rope_theta + rope_scaling or
//    rope_parameters; torch_dtype or dtype); export writes 4.x's spellings, which 5.x reads too.
//  - Import refuses every config field that changes the architecture or the numerics in a way we
//    do not implement (RoPE types other than linear, llama3 and yarn, o_proj or MLP biases, another
//    activation, Qwen's per-layer windows, ...), naming
//    the field. Fields known not to matter to the forward pass are accepted; an unknown field is
//    refused (it might matter). Dropout probabilities are accepted with a warning: llmtrain trains
//    without dropout.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/recipe/recipe.h"
#include "trainer/data/tokenizer.h"
#include "trainer/model/model_spec.h"

namespace llmtrain::trainer {

// How one of our parameters is stored by transformers.
struct HfTensorLayout {
  std::string name;            // transformers' state-dict key (model_spec.h's name)
  std::vector<int64_t> shape;  // transformers' shape
  bool transpose = false;      // transformers holds the transpose of ours viewed as [rows, cols]
  int64_t rows = 0, cols = 0;  // ours as a matrix (transpose only)
  int64_t keep_rows = -1;      // vocabulary: transformers has the first keep_rows rows (-1: all)
  // Gemma's RMSNorms multiply by (1 + weight): transformers holds ours − offset (1 for those, else 0).
  float offset = 0;
  // Where transformers 5's in-memory MoE layout holds the tensor when a file has that instead of
  // `name` (save_pretrained(save_original_format=False) writes it; import only), or where the class
  // holds it always (fused_only: gpt-oss, whose name is then fused_name; import and export): a part of
  // the tensor `fused_name` of shape `fused_shape` ("": none). Element (r, c) of ours, viewed as
  // [shape[0], numel / shape[0]], is its element fused_offset + r · fused_row_stride + c ·
  // fused_col_stride; strides 0, 0: ours contiguous from fused_offset.
  std::string fused_name;
  std::vector<int64_t> fused_shape;
  int64_t fused_offset = 0;
  int64_t fused_row_stride = 0, fused_col_stride = 0;
  bool fused_only = false;
};

HfTensorLayout hf_tensor_layout(const ModelConfig& model, const ParamSpec& param);

// The transformers model_type export writes for `model`: "gpt2", or the llama-family class that
// has exactly its options ("llama", "qwen2", "qwen3", "mistral", "mixtral", "qwen3_moe", "qwen2_moe",
// "gemma3_text", "gpt_oss").
std::string hf_model_type(const ModelConfig& model);
// Ours (param.shape, fp32) -> transformers' element order and shape.
std::vector<float> to_hf_layout(const HfTensorLayout& layout, const ParamSpec& param, const float* ours);
// transformers' (layout.shape) -> ours (param.shape); padding rows are set to zero.
void from_hf_layout(const HfTensorLayout& layout, const ParamSpec& param, const float* hf, float* ours);
// The fused tensor's part that is `param` (layout.fused_name, fused_shape): read into ours, or
// written from ours.
void from_hf_fused(const HfTensorLayout& layout, const ParamSpec& param, const float* fused, float* ours);
void to_hf_fused(const HfTensorLayout& layout, const ParamSpec& param, const float* ours, float* fused);

// config.json for `model` (GPT2Config, or the config of the llama-family class that has exactly its
// options; a combination none has is refused); `torch_dtype` "float32", "bfloat16" or "float16";
// bos/eos -1 = none.
nlohmann::json hf_model_config(const ModelConfig& model, const std::string& torch_dtype, int32_t bos, int32_t eos);
nlohmann::json hf_generation_config(int32_t bos, int32_t eos);

struct HfImportedConfig {
  ModelConfig model;  // family, shape, vocab, positions, eps, theta, tying, init_std (seq_len: min(positions, 2048))
  int32_t bos = -1, eos = -1;
  std::vector<std::string> warnings;  // accepted with a caveat (dropout)
};
// Reads a transformers config.json. Throws llmtrain::Error naming `origin` and every field it
// refuses (one line each: field, value found, what llmtrain supports).
HfImportedConfig hf_read_model_config(const nlohmann::json& config, const std::string& origin);

// model.safetensors.index.json (a sharded model): the file of every tensor, from its weight_map.
// Throws llmtrain::Error naming `origin` unless the index is an object whose weight_map maps each
// tensor name to a plain file name of the model directory (never a path out of it), with at most
// kHfMaxIndexTensors tensors (a model of 4096 layers has about 40,000).
inline constexpr size_t kHfMaxIndexTensors = 1 << 20;
std::map<std::string, std::string> hf_read_weight_index(const nlohmann::json& index, const std::string& origin);

// The tokenizer as transformers loads it: file name -> contents (tokenizer.json,
// tokenizer_config.json). The byte tokenizer becomes a byte-level BPE with no merges whose ids are
// the bytes (pre-tokenizer ByteLevel without the regex, so text is never split) and
// <|endoftext|> = 256; GPT-2's vocab.json + merges.txt become their tokenizer.json; a tokenizer.json
// is copied as it is.
std::map<std::string, std::string> hf_tokenizer_files(const Tokenizer& tokenizer, int64_t model_max_length);
// The tokenizer.json that hf_tokenizer_files writes for the byte tokenizer (import recognizes it).
std::string hf_byte_tokenizer_json();

}  // namespace llmtrain::trainer
