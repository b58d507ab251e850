"""YaRN's inverse frequencies and attention factor as transformers computes them
(ROPE_INIT_FUNCTIONS['yarn']), for tests/trainer/model/test_rope_scaling.cpp: prints the C++ initializer of its
kYarnCases. Run with scripts/setup.sh's .venv-hf5 (transformers 5):

  .venv-hf5/bin/python tests/kernels/yarn_reference.py
"""
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

# head_dim, theta, max_position_embeddings, rope_parameters: Qwen-style (truncated range),
# gpt-oss-style (truncate false), DeepSeek-style (mscale / mscale_all_dim), and one with its own
# attention_factor and betas.
CASES = [
    (32, 1000000.0, 131072, dict(factor=4.0, original_max_position_embeddings=32768)),
    (64, 150000.0, 131072, dict(factor=32.0, original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0,
                                truncate=False)),
    (32, 10000.0, 163840, dict(factor=40.0, original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=0.707)),
    (16, 10000.0, 256, dict(factor=8.0, original_max_position_embeddings=32, beta_fast=8.0, beta_slow=2.0,
                            attention_factor=1.25)),
]


def main():
    print(f"// transformers {transformers.__version__}")
    for head_dim, theta, max_pos, params in CASES:
        config = transformers.LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim,
                                          max_position_embeddings=max_pos,
                                          rope_parameters=dict(rope_type="yarn", rope_theta=theta, **params))
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
        fields = [f".factor = {params['factor']!r}",
                  f".original_max_positions = {params['original_max_position_embeddings']}"]
        for key in ("beta_fast", "beta_slow", "truncate", "attention_factor", "mscale", "mscale_all_dim"):
            if key in params:
                value = params[key]
                fields.append(f".{key} = {('true' if value else 'false') if isinstance(value, bool) else repr(value)}")
        print(f"    {{{head_dim}, {theta!r}, {{.type = RopeScalingType::yarn, {', '.join(fields)}}}, {attention_factor!r},")
        print("     {" + ", ".join(f"{float(f)!r}" for f in inv_freq) + "}},")


if __name__ == "__main__":
    main()
