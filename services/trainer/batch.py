"""Experiences (protobuf) -> token sequences -> right-padded micro-batches under a token budget.

Padding choice: right padding per micro-batch, with sequences sorted by length before they are packed
into micro-batches, so each micro-batch pads only to its own longest member and neighbours have similar
lengths. Padding-free packing (one long row with restarted position ids) needs a varlen attention kernel
(flash-attention) to keep packed sequences from attending to each other; the CPU SDPA path has none,
and a block-diagonal mask would cost more than the padding it saves. Log-probs are read only at response
positions (see `response_index`), so padding never reaches the loss.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trinity.v1 import common_pb2

KIND_ROLLOUT = common_pb2.EXPERIENCE_KIND_ROLLOUT
KIND_SFT = common_pb2.EXPERIENCE_KIND_SFT
KIND_PREFERENCE = common_pb2.EXPERIENCE_KIND_PREFERENCE


@dataclass
class TokenSequence:
    """One tokenized sample: `prompt + response`, with per-response-token annotations."""

    prompt: list[int]
    response: list[int]
    action_mask: list[bool]
    old_logprobs: list[float] | None = None
    token_rewards: list[float] | None = None
    teacher_logprobs: list[float] | None = None

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.response)


@dataclass
class Sample:
    """One experience made trainable; `rejected` is set for preference pairs only."""

    id: str
    chosen: TokenSequence
    reward: float = 0.0
    group: int = 0
    model_version: int = 0
    rejected: TokenSequence | None = None
    expert: bool = False  # a demonstration (SFT kind) inside an RL batch: CHORD's expert rows

    @property
    def sequences(self) -> list[TokenSequence]:
        return [self.chosen] if self.rejected is None else [self.chosen, self.rejected]

    @property
    def cost_length(self) -> int:
        return max(s.length for s in self.sequences)


class Tokenizer:
    """Turns the text forms of offline data (messages, prompt_text/response_text) into token ids.

    Prompts go through the model's chat template with a generation prompt; the response is the rest of
    the templated conversation, so it ends with the template's end-of-turn token (the model learns to stop).
    """

    def __init__(self, hf_tokenizer: Any) -> None:
        self.tok = hf_tokenizer

    def _encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def encode_pair(self, prompt_messages: list[dict[str, str]], response: str) -> tuple[list[int], list[int]]:
        if getattr(self.tok, "chat_template", None):
            prompt_text = self.tok.apply_chat_template(prompt_messages, add_generation_prompt=True, tokenize=False)
            full = self.tok.apply_chat_template(
                [*prompt_messages, {"role": "assistant", "content": response}], tokenize=False
            )
            if not full.startswith(prompt_text):
                raise ValueError("chat template does not render the prompt as a prefix of the conversation")
            return self._encode(prompt_text), self._encode(full[len(prompt_text) :])
        prompt_text = "\n".join(m["content"] for m in prompt_messages)
        eos = self.tok.eos_token or ""
        return self._encode(prompt_text), self._encode(response + eos)


def _prompt_messages(exp: common_pb2.Experience) -> tuple[list[dict[str, str]], str | None]:
    """The prompt conversation and, when the messages end with an assistant turn, that turn's text."""
    msgs = [{"role": m.role, "content": m.content} for m in exp.messages]
    if msgs and msgs[-1]["role"] == "assistant":
        return msgs[:-1], msgs[-1]["content"]
    if msgs:
        return msgs, None
    return [{"role": "user", "content": exp.prompt_text}], None


def _sequence_from_ids(exp: common_pb2.Experience, max_len: int | None) -> TokenSequence:
    prompt = list(exp.prompt_token_ids)
    response = list(exp.response_token_ids)
    n = len(response)

    def aligned(values: Sequence[Any], name: str) -> list[Any] | None:
        if len(values) == 0:
            return None
        if len(values) != n:
            raise ValueError(f"experience {exp.id!r}: {name} has {len(values)} entries for {n} response tokens")
        return list(values)

    mask = aligned(exp.action_mask, "action_mask") or [True] * n
    seq = TokenSequence(
        prompt=prompt,
        response=response,
        action_mask=mask,
        old_logprobs=aligned(exp.logprobs, "logprobs"),
        token_rewards=aligned(exp.token_rewards, "token_rewards"),
        teacher_logprobs=aligned(exp.teacher_logprobs, "teacher_logprobs"),
    )
    return _truncate(seq, max_len)


def _truncate(seq: TokenSequence, max_len: int | None) -> TokenSequence:
    """Cut the response so the sequence fits `max_len`; the prompt is never cut (it would change meaning)."""
    if max_len is None or seq.length <= max_len:
        return seq
    keep = max(max_len - len(seq.prompt), 0)

    def cut(values: list[Any] | None) -> list[Any] | None:
        return None if values is None else values[:keep]

    return TokenSequence(
        prompt=seq.prompt,
        response=seq.response[:keep],
        action_mask=seq.action_mask[:keep],
        old_logprobs=cut(seq.old_logprobs),
        token_rewards=cut(seq.token_rewards),
        teacher_logprobs=cut(seq.teacher_logprobs),
    )


def to_samples(
    experiences: Iterable[common_pb2.Experience],
    tokenizer: Tokenizer | None,
    *,
    max_seq_len: int | None = None,
) -> list[Sample]:
    """Tokenize (when needed) and annotate experiences. Group ids are numbered in order of appearance;
    an experience without a group id is a group of its own."""
    groups: dict[str, int] = {}
    samples: list[Sample] = []
    for exp in experiences:
        key = exp.group_id or f"\x00{exp.id}\x00{len(samples)}"
        group = groups.setdefault(key, len(groups))
        if exp.response_token_ids:
            chosen = _sequence_from_ids(exp, max_seq_len)
            rejected_ids = list(exp.preference.rejected_token_ids)
            rejected = (
                _truncate(
                    TokenSequence(list(exp.prompt_token_ids), rejected_ids, [True] * len(rejected_ids)),
                    max_seq_len,
                )
                if exp.kind == KIND_PREFERENCE
                else None
            )
        else:
            if tokenizer is None:
                raise ValueError(f"experience {exp.id!r} has no token ids and no tokenizer was given")
            prompt_msgs, last_assistant = _prompt_messages(exp)
            response_text = exp.response_text or last_assistant
            if response_text is None:
                raise ValueError(f"experience {exp.id!r} has neither response_token_ids nor a response text")
            p, r = tokenizer.encode_pair(prompt_msgs, response_text)
            chosen = _truncate(TokenSequence(p, r, [True] * len(r)), max_seq_len)
            rejected = None
            if exp.kind == KIND_PREFERENCE:
                p2, r2 = tokenizer.encode_pair(prompt_msgs, exp.preference.rejected_text)
                rejected = _truncate(TokenSequence(p2, r2, [True] * len(r2)), max_seq_len)
        if exp.kind == KIND_PREFERENCE and (rejected is None or not rejected.response):
            raise ValueError(f"preference experience {exp.id!r} has no rejected response")
        samples.append(
            Sample(
                id=exp.id,
                chosen=chosen,
                reward=float(exp.reward),
                group=group,
                model_version=int(exp.model_version),
                rejected=rejected,
                expert=exp.kind == KIND_SFT,
            )
        )
    return samples


def plan_micro_batches(samples: Sequence[Sample], token_budget: int) -> list[list[int]]:
    """Split sample indices into micro-batches whose padded size (rows x longest row) fits the budget.

    Samples are taken longest first, so each micro-batch holds similar lengths; a sample longer than the
    budget on its own forms a micro-batch by itself (it cannot be split without changing the loss).
    Preference pairs count as two rows. Returns index lists into `samples`.
    """
    order = sorted(range(len(samples)), key=lambda i: samples[i].cost_length, reverse=True)
    batches: list[list[int]] = []
    current: list[int] = []
    rows = 0
    longest = 0
    for i in order:
        s = samples[i]
        r = len(s.sequences)
        new_longest = max(longest, s.cost_length)
        if current and (rows + r) * new_longest > token_budget:
            batches.append(current)
            current, rows, new_longest = [], 0, s.cost_length
        current.append(i)
        rows += r
        longest = new_longest
    if current:
        batches.append(current)
    return batches


@dataclass
class TokenBatch:
    """Right-padded tensors for a set of sequences.

    input_ids, attention_mask: `[rows, seq]`; response_index: `[rows, resp]` position of the hidden
    state that predicts each response token (prompt_len - 1 + j; clamped to 0 in padding);
    targets: `[rows, resp]` the response tokens; mask: `[rows, resp]` bool, train on this token;
    old_logprobs, token_rewards, teacher_logprobs: `[rows, resp]` or None when no row has them.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_index: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    token_rewards: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum())

    def to(self, device: torch.device | str) -> TokenBatch:
        def mv(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return TokenBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            response_index=self.response_index.to(device),
            targets=self.targets.to(device),
            mask=self.mask.to(device),
            old_logprobs=mv(self.old_logprobs),
            token_rewards=mv(self.token_rewards),
            teacher_logprobs=mv(self.teacher_logprobs),
            extras={k: v.to(device) for k, v in self.extras.items()},
        )


def collate(seqs: Sequence[TokenSequence], pad_id: int) -> TokenBatch:
    """Pad `seqs` to the longest sequence (tokens) and the longest response (annotations)."""
    rows = len(seqs)
    seq_len = max(s.length for s in seqs)
    resp_len = max(max(len(s.response) for s in seqs), 1)
    input_ids = torch.full((rows, seq_len), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, seq_len), dtype=torch.long)
    index = torch.zeros((rows, resp_len), dtype=torch.long)
    targets = torch.full((rows, resp_len), pad_id, dtype=torch.long)
    mask = torch.zeros((rows, resp_len), dtype=torch.bool)
    optional = {"old_logprobs": {}, "token_rewards": {}, "teacher_logprobs": {}}
    for r, s in enumerate(seqs):
        ids = s.prompt + s.response
        n, p = len(s.response), len(s.prompt)
        if p == 0 and n:
            raise ValueError("a sequence needs at least one prompt token to predict its first response token")
        input_ids[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[r, : len(ids)] = 1
        if n:
            index[r, :n] = torch.arange(p - 1, p - 1 + n)
            targets[r, :n] = torch.tensor(s.response, dtype=torch.long)
            mask[r, :n] = torch.tensor(s.action_mask, dtype=torch.bool)
        for name, per_row in optional.items():
            values = getattr(s, name)
            if values is not None:
                per_row[r] = values
    tensors: dict[str, torch.Tensor | None] = {}
    for name, per_row in optional.items():
        if not per_row:
            tensors[name] = None
            continue
        t = torch.zeros((rows, resp_len), dtype=torch.float32)
        for r, values in per_row.items():
            t[r, : len(values)] = torch.tensor(values, dtype=torch.float32)
        tensors[name] = t
    return TokenBatch(
        input_ids=input_ids,
        attention_mask=attention,
        response_index=index,
        targets=targets,
        mask=mask,
        old_logprobs=tensors["old_logprobs"],
        token_rewards=tensors["token_rewards"],
        teacher_logprobs=tensors["teacher_logprobs"],
    )


def filter_experiences(
    experiences: Sequence[common_pb2.Experience], consumed: set[str], step: int, max_staleness: int | None
) -> tuple[list[common_pb2.Experience], dict[str, float]]:
    """Drop failed, duplicate (already trained: in `consumed`) and too-stale experiences, counting each.

    Shared by every training backend, so that they drop and count the same way."""
    keep, failed, dup, stale = [], 0, 0, 0
    for e in experiences:
        if e.failed:
            failed += 1
        elif e.id and e.id in consumed:
            dup += 1
        elif max_staleness is not None and step - e.model_version > max_staleness:
            stale += 1
        else:
            keep.append(e)
    return keep, {"dropped/failed": float(failed), "dropped/duplicate": float(dup), "dropped/stale": float(stale)}
