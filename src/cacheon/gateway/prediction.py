"""What an engine will report as cached for one request, and where the gateway must not guess.

SGLang's prefix match is capped before it looks at the cache (``Req._compute_max_prefix_len``,
every release here): at ``len - 1`` (the last prompt token's logits must be computed) and, for a
request that asks for prompt logprobs from ``logprob_start_len`` on, at that start; a paged cache
then reuses whole pages only. ``Reuse`` carries that cap, and the request's cache namespace,
from the request (``prompt.reuse_of``) to the policy.

A namespace the published ids do not show cannot be predicted: ``extra_key`` and LoRA adapters
(every release here keeps them out of event hashes), and ``cache_salt`` where the release
publishes salted pages under plain ids (``SaltedIds.UNSALTED``, the pin). Chat content that is
not plain text is rendered by the engine in ways a template alone does not reproduce. Each of
these is a ``NoPrediction`` reason: counted and shown, never a silent wrong hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from cacheon.kv.contracts import SaltedIds, by_id
from cacheon.kv.hashing import salt_seed


class NoPrediction(StrEnum):
    """Why the gateway predicts nothing for a request on a worker (``cacheon_prediction_refusals_total``)."""

    SALT_NOT_PUBLISHED = "salt_not_published"  # cache_salt, published under unsalted ids
    NAMESPACE_NOT_PUBLISHED = "namespace_not_published"  # extra_key / lora_path: in no published id
    # A chat whose rendering is not reproduced exactly (cacheon.tokens.chat.ChatRefusal, same values).
    CONTENT_PARTS = "content_parts"  # media or typed parts other than text
    CHAT_INPUT_IDS = "chat_input_ids"
    CHAT_UNSUPPORTED_FIELD = "chat_unsupported_field"
    CHAT_ENGINE_REJECTS = "chat_engine_rejects"
    CHAT_RELEASE_UNREAD = "chat_release_unread"
    CHAT_RELEASES_DIFFER = "chat_releases_differ"


@dataclass(frozen=True, slots=True)
class Reuse:
    """The most of a prompt the engine may take from its cache, and in which namespace."""

    limit: int  # leading prompt tokens a prefix match may cover at most
    salt: str | None = None  # cache_salt, when the request has one
    refusal: NoPrediction | None = None  # a reason no worker's cached prefix can be predicted




def chain_prior(contract_id: str, reuse: Reuse) -> bytes | NoPrediction:
    """The digest the chain of a worker speaking ``contract_id`` starts from for this request, or why
    it cannot be predicted there."""
    if reuse.salt is None:
        return b""
    if by_id(contract_id).salted_ids is SaltedIds.SEEDED:
        return salt_seed(reuse.salt)
    return NoPrediction.SALT_NOT_PUBLISHED
