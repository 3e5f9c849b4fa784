# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The text of each logprob's token id, decoded once per tokenizer
(vllm/tokenizers/token_texts.py): `convert_ids_list_to_tokens` gives what
decoding every id gives, on tokenizers trained here (a SentencePiece-style
Metaspace vocabulary, whose leading spaces upstream restores, and a byte-level
one), through the API server's pooled tokenizer too."""

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from vllm.tokenizers import token_texts
from vllm.tokenizers.detokenizer_utils import (
    _convert_ids_list_to_tokens,
    convert_ids_list_to_tokens,
)
from vllm.tokenizers.hf import maybe_make_thread_pool
from vllm.tokenizers.token_texts import texts_of_ids

CORPUS = [
    'true false  null {"key": [1, 2, 3]}   spaces\tand tabs',
    "The quick brown fox jumps over the lazy dog; naïve café déjà vu 😀.",
    "    indented code:\n        return x  # comment\n",
] * 20


def _trained(kind: str) -> PreTrainedTokenizerFast:
    """A small BPE tokenizer trained on CORPUS with a Metaspace or byte-level
    pre-tokenizer."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    if kind == "metaspace":
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        alphabet: list[str] = []
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>"], initial_alphabet=alphabet
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>")


def _recording(decoded: list[int]):
    """Upstream's decoder for `texts_of_ids`, noting in `decoded` each id it
    is asked for."""

    def decode(tok, token_ids: list[int]) -> list[str]:
        decoded.extend(token_ids)
        return _convert_ids_list_to_tokens(tok, token_ids)

    return decode


@pytest.fixture(params=["metaspace", "byte-level"])
def kind(request) -> str:
    return request.param


@pytest.mark.parametrize("pooled", [False, True], ids=["plain", "pooled"])
def test_every_id_gets_the_text_decoding_it_alone_gives(kind: str, pooled: bool):
    tokenizer = _trained(kind)
    if pooled:  # the API server's thread-safe tokenizer
        tokenizer = maybe_make_thread_pool(tokenizer)
    ids = list(range(len(tokenizer)))
    expected = dict(zip(ids, _convert_ids_list_to_tokens(tokenizer, ids)))
    if kind == "metaspace":  # the leading-space path is the one exercised
        assert any(text.startswith(" ") for text in expected.values())
    rng = random.Random(0)
    for _ in range(50):  # positions of top-k lists: repeats within and across
        batch = [rng.choice(ids) for _ in range(rng.randint(0, 12))]
        got = convert_ids_list_to_tokens(tokenizer, batch)
        assert got == [expected[token_id] for token_id in batch]
    assert convert_ids_list_to_tokens(tokenizer, ids) == [expected[i] for i in ids]


def test_each_id_is_decoded_once():
    tokenizer = _trained("byte-level")
    decoded: list[int] = []
    decode = _recording(decoded)
    first = texts_of_ids(tokenizer, [5, 7, 5, 9, 7], decode)
    again = texts_of_ids(tokenizer, [9, 7, 5, 11], decode)
    assert decoded == [5, 7, 9, 11]
    assert first == _convert_ids_list_to_tokens(tokenizer, [5, 7, 5, 9, 7])
    assert again == _convert_ids_list_to_tokens(tokenizer, [9, 7, 5, 11])


def test_each_tokenizer_keeps_its_own_texts():
    metaspace, byte_level = _trained("metaspace"), _trained("byte-level")
    ids = list(range(40, 80))
    for tokenizer in (metaspace, byte_level, metaspace, byte_level):
        expected = _convert_ids_list_to_tokens(tokenizer, ids)
        assert convert_ids_list_to_tokens(tokenizer, ids) == expected
    assert convert_ids_list_to_tokens(metaspace, ids) != convert_ids_list_to_tokens(
        byte_level, ids
    )


def test_the_cache_starts_again_when_it_would_outgrow_its_bound(monkeypatch):
    monkeypatch.setattr(token_texts, "MAX_CACHED_TEXTS", 4)
    tokenizer = _trained("byte-level")
    decoded: list[int] = []
    decode = _recording(decoded)
    texts_of_ids(tokenizer, [1, 2, 3], decode)
    texts_of_ids(tokenizer, [3, 4, 5], decode)  # 3 + 2 > 4: emptied first
    cache = getattr(tokenizer, token_texts._CACHE_KEY)
    assert sorted(cache) == [4, 5]
    ids = list(range(10, 20))  # more distinct ids than the bound: none kept
    assert texts_of_ids(tokenizer, ids, decode) == _convert_ids_list_to_tokens(
        tokenizer, ids
    )
    assert len(cache) <= 4
    assert decoded == [1, 2, 3, 4, 5, *ids]


def test_a_failed_decode_keeps_nothing():
    tokenizer = _trained("byte-level")

    def failing(tok, token_ids: list[int]) -> list[str]:
        raise ValueError("bad id")

    texts_of_ids(tokenizer, [1], _convert_ids_list_to_tokens)
    with pytest.raises(ValueError, match="bad id"):
        texts_of_ids(tokenizer, [1, 2], failing)
    assert sorted(getattr(tokenizer, token_texts._CACHE_KEY)) == [1]


def test_a_tokenizer_without_attributes_decodes_every_time():
    class Slotted:
        __slots__ = ()

        def decode(self, token_ids: list[int]) -> str:
            return f"<{token_ids[0]}>"

    calls: list[list[int]] = []

    def decode(tok, token_ids: list[int]) -> list[str]:
        calls.append(token_ids)
        return [tok.decode([token_id]) for token_id in token_ids]

    tokenizer = Slotted()
    assert texts_of_ids(tokenizer, [3, 3], decode) == ["<3>", "<3>"]
    assert texts_of_ids(tokenizer, [3], decode) == ["<3>"]
    assert calls == [[3, 3], [3]]
