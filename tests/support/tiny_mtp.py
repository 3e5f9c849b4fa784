"""Build a tiny target model with an MTP layer, for offline tests of MTP spec decoding.

vLLM drives MTP through the EAGLE proposer: the draft is the target checkpoint
itself, loaded a second time with `hf_config_override` swapping the
architecture for the MTP one (`speculative_config={"method": "mtp", ...}`, no
draft model path). The layout used is MiMo's (MiMoForCausalLM -> MiMoMTPModel,
vllm/model_executor/models/mimo_mtp.py), the only dense MTP model whose config
transformers knows natively: MiMo is Qwen2, so the config is a plain `qwen2`
one with `architectures: ["MiMoForCausalLM"]` and `num_nextn_predict_layers: 1`.
The target (vLLM's MiMoForCausalLM) skips the `model.mtp_layers.*` weights;
the draft (MiMoMTP) loads only them plus the shared embedding and lm_head.

At position i the MTP layer takes the embedding of token i+1 (zeroed at
position 0) and the target's pre-norm hidden state at i and computes

    z = input_proj(cat(hidden_layernorm(h_i), token_layernorm(embed(t_{i+1}))))
    final_layernorm(Qwen2 decoder layer(z) with its residual)

then the shared lm_head predicts token i+2. A head trained on a random target
only memorises (see tiny_eagle.py), so the layer is constructed from a
one-layer target instead, as tiny_eagle.py does for EAGLE:

- the target is tiny_model's recipe (seeded random weights, std 0.5, local
  tokenizer) with one layer, converted to Qwen2 (zero q/k/v biases);
- `mtp_block` is an exact copy of that layer and `final_layernorm` of the final
  norm. Its inputs are the target's tokens shifted by one position, so the
  relative positions, all RoPE sees, are the target's;
- `token_layernorm` rescales each embedding to the embeddings' mean RMS, what
  the target's residual stream starts from, and `input_proj` passes it
  through, mixing in a small random multiple of the hidden state so the drafts
  depend on the hidden states vLLM hands over.

What the layer lacks is tokens 0 and 1 of the context (position 0's embedding
is zeroed) and each token's exact embedding scale, so only some drafts agree
with the target: partial acceptance, which is what a test of spec decoding
needs. One MTP layer; vLLM reuses it for num_speculative_tokens > 1.

Usage: python tests/support/tiny_mtp.py OUT_DIR [--hidden-mix X] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from tiny_model import MARKER, build_model, building, is_built
from tiny_model import RECIPE_VERSION as TARGET_RECIPE

RECIPE_VERSION = 1
# The target: tiny_model's defaults except for depth, which the one MTP block mirrors.
TARGET = dict(hidden_size=128, layers=1, heads=4, kv_heads=2, intermediate=256, init_std=0.5, dtype="float32")


def build_mtp(out_dir: str | Path, hidden_mix: float = 0.002, seed: int = 0) -> Path:
    """Build (or reuse) the target-with-MTP checkpoint in out_dir and return its path."""
    out = Path(out_dir).resolve()
    params = {"recipe": RECIPE_VERSION, "hidden_mix": hidden_mix, "seed": seed, "target": TARGET}
    params["target_recipe"] = TARGET_RECIPE  # rebuild when tiny_model's recipe changes
    if is_built(out, params):
        return out

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen2Config

    with tempfile.TemporaryDirectory() as scratch, building(out, params) as model_dir:
        llama = build_model(Path(scratch) / "llama", arch="llama", seed=seed, **TARGET)
        src = json.loads((llama / "config.json").read_text())
        weights = load_file(str(llama / "model.safetensors"))
        hidden, head_dim = src["hidden_size"], src["head_dim"]
        config = Qwen2Config(
            architectures=["MiMoForCausalLM"],
            num_nextn_predict_layers=1,
            **{
                k: src[k]
                for k in (
                    "vocab_size",
                    "hidden_size",
                    "num_hidden_layers",
                    "num_attention_heads",
                    "num_key_value_heads",
                    "head_dim",
                    "intermediate_size",
                    "max_position_embeddings",
                    "rms_norm_eps",
                    "rope_parameters",
                    "initializer_range",
                    "tie_word_embeddings",
                    "bos_token_id",
                    "eos_token_id",
                    "pad_token_id",
                    "dtype",
                    "hidden_act",
                )
            },
        )
        for proj, heads in (
            ("q", src["num_attention_heads"]),
            ("k", src["num_key_value_heads"]),
            ("v", src["num_key_value_heads"]),
        ):
            weights[f"model.layers.0.self_attn.{proj}_proj.bias"] = torch.zeros(heads * head_dim)

        embed = weights["model.embed_tokens.weight"]
        rms = embed.pow(2).mean(-1).sqrt().mean()
        mix = torch.randn(hidden, hidden, generator=torch.Generator().manual_seed(seed)) * hidden_mix
        mtp = "model.mtp_layers.0."
        weights.update(
            {
                mtp + "token_layernorm.weight": torch.full((hidden,), float(rms)),
                mtp + "hidden_layernorm.weight": torch.ones(hidden),
                # input_proj(cat(hidden, embedding)): mostly the embedding.
                mtp + "input_proj.weight": torch.cat([mix, torch.eye(hidden)], dim=1),
                mtp + "final_layernorm.weight": weights["model.norm.weight"].clone(),
            }
        )
        for name in [n for n in weights if n.startswith("model.layers.0.")]:
            weights[mtp + name.removeprefix("model.layers.0.")] = weights[name].clone()

        config.save_pretrained(str(model_dir))
        save_file({k: v.contiguous() for k, v in sorted(weights.items())}, str(model_dir / "model.safetensors"))
        for f in llama.iterdir():
            if f.name not in ("config.json", "model.safetensors", MARKER) and f.is_file():
                shutil.copy(f, model_dir / f.name)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--hidden-mix", type=float, default=0.002)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(build_mtp(args.out_dir, args.hidden_mix, args.seed))


if __name__ == "__main__":
    main()
