# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The text of each logprob's token id, decoded once per tokenizer.

The frontend gives every logprob its token's text: for each position of a
request that asks, the sampled token and each of its top-k, one
`tokenizer.decode([token_id])` (and, for a SentencePiece-style vocabulary, one
`convert_ids_to_tokens`) per id (`convert_ids_list_to_tokens`). Through the
API server's thread-safe tokenizer each call also borrows a tokenizer copy
from a pool. That is paid at every token, and it grows with the number of
logprobs asked for, while the same ids come back step after step.

The text of one id depends on the id and the tokenizer alone (upstream decodes
each id on its own), so it is decoded once and kept on the tokenizer, as
upstream keeps the tokenizer's leading-space marker there. The cache is
bounded: when it would outgrow `MAX_CACHED_TEXTS` it starts again empty.
A tokenizer that takes no attributes decodes every id, as upstream does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.tokenizers import TokenizerLike

_CACHE_KEY = "_vllm_token_texts_cache"

# Enough for the ids a server's logprobs meet again and again; at most a few
# MiB of short strings.
MAX_CACHED_TEXTS = 1 << 16


def texts_of_ids(
    tokenizer: TokenizerLike,
    token_ids: list[int],
    decode: Callable[[TokenizerLike, list[int]], list[str]],
) -> list[str]:
    """`decode(tokenizer, token_ids)`, each id decoded by `decode` only the
    first time this tokenizer meets it (`decode` decodes each id on its own)."""
    texts: dict[int, str] | None = getattr(tokenizer, _CACHE_KEY, None)
    if texts is None:
        texts = {}
        try:
            setattr(tokenizer, _CACHE_KEY, texts)
        except AttributeError:  # a tokenizer that takes no attributes
            return decode(tokenizer, token_ids)
    # One read of the cache per id: another thread may empty it meanwhile.
    found = [texts.get(token_id) for token_id in token_ids]
    missing = list(
        dict.fromkeys(
            token_id for token_id, text in zip(token_ids, found) if text is None
        )
    )
    if not missing:
        return found  # type: ignore[return-value]
    decoded = dict(zip(missing, decode(tokenizer, missing), strict=True))
    if len(texts) + len(decoded) > MAX_CACHED_TEXTS:
        texts.clear()
    if len(decoded) <= MAX_CACHED_TEXTS:
        texts.update(decoded)
    return [
        decoded[token_id] if text is None else text
        for token_id, text in zip(token_ids, found)
    ]
