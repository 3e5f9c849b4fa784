"""Build a tiny, deterministic, randomly initialised causal LM for offline tests.

No model hub is reachable in CI, so tests build their own checkpoint: a byte-level
BPE tokenizer trained on embedded text plus a Llama or Qwen3 model with seeded
random weights, saved in the Hugging Face layout that vLLM loads.

Usage: python tests/support/tiny_model.py OUT_DIR [--arch llama|qwen3] [...]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

    from transformers import PretrainedConfig, PreTrainedTokenizerFast

# Bump when the recipe changes so cached checkpoints are rebuilt.
RECIPE_VERSION = 2
MARKER = ".tiny_model.json"
BOS, EOS, UNK, PAD = "<s>", "</s>", "<unk>", "<pad>"

# Minimal role-prefixed template; enough for chat-completion endpoints to render.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)

CORPUS = """\
The quick brown fox jumps over the lazy dog near the quiet river bank.
A small model can still produce text, even if the text makes little sense.
Tests should be fast, cheap, and deterministic so that failures are easy to read.
The server accepts a prompt and returns a completion with a list of tokens.
Every request has an identifier, a status, and a time when it was created.
He wrote the numbers one, two, three, four, five, six, seven, eight, nine, ten.
The engine schedules requests, allocates memory, and runs the forward pass.
Cache blocks are reused when two prompts share the same prefix of tokens.
The library kept old maps, letters, and books about ships and the sea.
Water boils at one hundred degrees on a normal day at sea level.
What is the capital of France? The capital of France is Paris.
How are you today? I am fine, thank you, and how are you?
Please summarize the following paragraph in one short sentence.
Music played softly in the background while the children read their stories.
A function takes input values and returns an output value to the caller.
Errors are reported with a clear message and a code that tools can parse.
The train left the station at noon and arrived in the city before dark.
Hello world! This is a simple test of the tiny language model.
Count the words in this sentence and tell me how many there are.
The teacher asked the students to write a story about a friendly robot.
Light travels faster than sound, which is why we see lightning first.
The meeting was moved from Monday to Thursday because of the holiday.
Good questions often lead to better answers and a deeper understanding.
Once upon a time there was a king who lived in a castle on a hill.
"""


def build_tokenizer(
    out_dir: str | Path, vocab_size: int = 512, model_max_length: int = 2048
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on CORPUS and save it to out_dir."""
    # Heavy imports are local so the cached (marker hit) path stays fast.
    from tokenizers import Tokenizer, decoders, models, processors, trainers
    from tokenizers import pre_tokenizers as pre
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Byte-level pre-tokenisation means any string encodes without <unk>.
    tok.pre_tokenizer = pre.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, UNK, PAD],  # ids 0..3, in this order
        initial_alphabet=pre.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    # Prepend <s> like Llama so add_special_tokens=True yields a BOS token.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        model_max_length=model_max_length,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    # transformers 5 writes tokenizer_class "TokenizersBackend", which older
    # transformers cannot resolve; the classic name loads in both. Embedding the
    # template too lets loaders that ignore chat_template.jinja find it.
    cfg_path = Path(out_dir) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=CHAT_TEMPLATE)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return fast


def _make_config(tok: PreTrainedTokenizerFast, p: dict[str, Any]) -> PretrainedConfig:
    from transformers import LlamaConfig, Qwen3Config

    classes = {"llama": LlamaConfig, "qwen3": Qwen3Config}
    if p["arch"] not in classes:
        raise ValueError(f"unsupported arch {p['arch']!r}; expected one of {[*classes]}")
    return classes[p["arch"]](
        vocab_size=p.get("vocab_size") or len(tok),
        hidden_size=p["hidden_size"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        head_dim=p.get("head_dim") or p["hidden_size"] // p["heads"],  # Qwen3 would default to 128
        intermediate_size=p["intermediate"],
        max_position_embeddings=p["max_position_embeddings"],
        initializer_range=p["init_std"],
        # Untied: with tied embeddings the residual copy of the input token
        # dominates the logits and greedy decoding repeats the last token.
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        dtype=p["dtype"],
    )


def build_model(
    out_dir: str | Path,
    arch: str = "llama",
    hidden_size: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 256,
    max_position_embeddings: int = 2048,
    seed: int = 0,
    dtype: str = "float32",
    init_std: float = 0.5,
    eos_scale: float = 2.0,
    perturb: float = 0.0,
    head_dim: int = 0,
    vocab_size: int = 0,
) -> Path:
    """Build (or reuse) the tiny checkpoint in out_dir and return its path.

    perturb > 0 adds seeded noise (that fraction of init_std) to the weights
    of the model `seed` gives: a draft model that agrees with it only often.
    head_dim (0: hidden_size / heads) and vocab_size (0: the tokenizer's 512;
    more pads the embeddings, and the padded ids are never sampled) shape a
    model like a real one, e.g. the GPU check's Qwen3-0.6B-shaped model,
    whose sampler then works on a real vocabulary's width.
    """
    # All arguments except out_dir, captured before any other local exists.
    params = {k: v for k, v in locals().items() if k != "out_dir"}
    for option in ("perturb", "head_dim", "vocab_size"):
        if not params[option]:
            del params[option]  # checkpoints built before the option stay valid
    params["recipe"] = RECIPE_VERSION
    out = Path(out_dir).resolve()
    if is_built(out, params):
        return out

    import torch
    from transformers import AutoModelForCausalLM

    with building(out, params) as tmp:
        tok = build_tokenizer(tmp, model_max_length=max_position_embeddings)
        cfg = _make_config(tok, params)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        # Explicit seeded init (independent of transformers' _init_weights, which
        # changes between releases). A large std spreads the logits so greedy
        # output is varied and argmax margins dwarf kernel rounding differences.
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _, w in sorted(model.named_parameters()):
                if w.ndim == 1:
                    w.fill_(1.0)  # RMSNorm weights (Llama/Qwen3 have no biases)
                else:
                    w.copy_(torch.randn(w.shape, generator=gen) * init_std)
            noise = torch.Generator().manual_seed(seed + 1)
            for _, w in sorted(model.named_parameters()) if perturb else ():
                if w.ndim > 1:
                    w.add_(torch.randn(w.shape, generator=noise) * init_std * perturb)
            # Zero the output rows of specials (except EOS) and of non-printable
            # byte tokens: their logit is ~0 while others spread widely, so greedy
            # text is readable ASCII without stray <s> or U+FFFD.
            head = model.get_output_embeddings().weight
            for i in range(len(tok)):
                text = tok.decode([i])
                special = i in tok.all_special_ids and i != tok.eos_token_id
                if special or not (text.isascii() and text.isprintable()):
                    head[i].zero_()
            head[len(tok) :].zero_()  # padded ids (vocab_size): no text, never the greedy choice
            # A wider EOS logit makes EOS the argmax every dozen tokens or so,
            # so stop-on-EOS paths (and min_tokens suppressing it) are exercised.
            head[tok.eos_token_id] *= eos_scale
        model = model.to(getattr(torch, dtype))
        model.generation_config.do_sample = False
        model.save_pretrained(str(tmp), safe_serialization=True)
    return out


def is_built(out: Path, params: dict) -> bool:
    """Whether out holds a checkpoint built with exactly these parameters."""
    marker = out / MARKER
    return marker.is_file() and json.loads(marker.read_text()) == params


@contextlib.contextmanager
def building(out: Path, params: dict) -> Iterator[Path]:
    """Yield a scratch dir beside out; when the body succeeds, mark it and swap it into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        (tmp / MARKER).write_text(json.dumps(params, indent=2, sort_keys=True))
        # mkdtemp creates 0700 and safetensors writes 0600; readers may run as another user.
        for f in tmp.iterdir():
            f.chmod(0o644 if f.is_file() else 0o755)
        tmp.chmod(0o755)
        _swap_into_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Replace out with tmp via renames so readers never see a half-written dir."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
        os.rename(out, old / "d")
    try:
        os.rename(tmp, out)
    except OSError:
        # A concurrent builder won the race; its result is equally valid.
        if not (out / MARKER).is_file():
            raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    # Mirror build_model's keyword arguments (--hidden-size, --arch, ...).
    for name, prm in list(inspect.signature(build_model).parameters.items())[1:]:
        flag = "--" + name.replace("_", "-")
        ap.add_argument(flag, type=type(prm.default), default=prm.default)
    args = vars(ap.parse_args(argv))
    print(build_model(args.pop("out_dir"), **args))


if __name__ == "__main__":
    main()
