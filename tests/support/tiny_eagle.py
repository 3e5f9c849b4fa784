"""Build an EAGLE draft head for a tiny target model, for offline tests.

EAGLE (and MTP, which vLLM drives through the same proposer) drafts from the
target's own state: at position i the head takes the embedding of token i+1 and
the target's last hidden state at i, runs its decoder layers and predicts token
i+2 with the target's lm_head. No such head exists for a model built at test
time, a random one never gets a draft accepted (then the accepted path goes
untested), and one trained on a randomly initialised target only memorises its
data (tried: 100% on the training sequences, 0.5% on others). So the head is
constructed from the target instead:

- its layers are copies of the target's layers. EAGLE's inputs are the target's
  tokens shifted by one position (position i holds token i+1), so relative
  positions, all RoPE sees, are the target's;
- EAGLE's first layer has no input norm, so the head's embeddings are the
  target's rows divided by their RMS (what that norm would have produced);
- `fc` passes the embedding through and mixes in a little of the target's
  hidden state, so the drafts depend on the hidden states vLLM hands over;
- there is no final norm and no lm_head: vLLM shares the target's, and a
  positive scale does not change a greedy argmax.

What the head lacks is token 0 (never an EAGLE input) and the exact residual
scale, so only some drafts agree with the target (simulated on greedy text:
about half of the first drafts; in vLLM with k = 3, about one draft in five is
accepted): variable acceptance, which is what a test of spec decoding needs. The checkpoint has vLLM's
EAGLE-Llama layout (`embed_tokens`, `fc`, `layers.*`, no lm_head).

Usage: python tests/support/tiny_eagle.py TARGET_DIR OUT_DIR [--hidden-mix X]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from tiny_model import MARKER, building, is_built

RECIPE_VERSION = 1


def build_eagle(target_dir: str | Path, out_dir: str | Path, hidden_mix: float = 0.002, seed: int = 0) -> Path:
    """Build (or reuse) the EAGLE head for target_dir in out_dir and return its path."""
    target_dir, out = Path(target_dir).resolve(), Path(out_dir).resolve()
    params = {
        "recipe": RECIPE_VERSION,
        "hidden_mix": hidden_mix,
        "seed": seed,
        "target": json.loads((target_dir / MARKER).read_text()),
    }
    if is_built(out, params):
        return out

    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(target_dir / "model.safetensors"))
    config = json.loads((target_dir / "config.json").read_text())
    embed = weights["model.embed_tokens.weight"]
    hidden = embed.shape[1]
    mix = torch.randn(hidden, hidden, generator=torch.Generator().manual_seed(seed)) * hidden_mix
    head = {
        "embed_tokens.weight": embed / embed.pow(2).mean(-1, keepdim=True).sqrt(),
        "fc.weight": torch.cat([torch.eye(hidden), mix], dim=1),  # fc(cat(embedding, hidden))
    }
    for name, w in weights.items():
        if name.startswith("model.layers.") and name != "model.layers.0.input_layernorm.weight":
            head[name.removeprefix("model.")] = w  # EAGLE's first layer has no input norm

    with building(out, params) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        save_file({k: v.contiguous() for k, v in head.items()}, str(tmp / "model.safetensors"))
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (target_dir / name).is_file():
                shutil.copy(target_dir / name, tmp / name)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--hidden-mix", type=float, default=0.002)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(build_eagle(args.target_dir, args.out_dir, args.hidden_mix, args.seed))


if __name__ == "__main__":
    main()
