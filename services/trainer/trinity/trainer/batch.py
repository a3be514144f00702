"""Experiences (protobuf) -> token sequences -> micro-batches under a token budget.

Two layouts, both right-padded:
- one row per sequence, sorted by length before packing so each micro-batch pads only to its own
  longest member;
- shared prompts (`pack_budget`): sequences with the same prompt (a GRPO group, a DPO pair) share one
  row, `prompt + response_1 + response_2 + ...`, under a block mask in which every response sees the
  prompt and itself, with position ids restarting after the prompt. The prompt is computed once per
  group instead of once per sample, and the gradient is the same (each response reads the same prompt
  states it would read alone). With 8 samples of ~55 prompt and 16 response tokens, a group costs 183
  tokens instead of 568.

General padding-free packing of *unrelated* sequences would need a varlen attention kernel, which the
CPU SDPA path lacks; shared prompts are worth a block mask because they remove work, not just padding.
Log-probs are read only at response positions (see `response_index`), so padding never reaches the loss.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import torch

from trinity.algorithm_table import RowInput
from trinity.config import ModelConfig
from trinity.v1 import common_pb2

KIND_ROLLOUT = common_pb2.EXPERIENCE_KIND_ROLLOUT
KIND_SFT = common_pb2.EXPERIENCE_KIND_SFT
KIND_PREFERENCE = common_pb2.EXPERIENCE_KIND_PREFERENCE
REWARD_BASELINE = "reward_baseline"  # the reward component the explorer writes for ReMax
RETURN_TO_GO = "return_to_go"  # the reward component multi-step workflows write per step


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
    episode: int | None = None  # multi-step episodes: rows of one episode share it (numbered like groups)
    state_key: str = ""  # multi-step episodes: the environment state the step was taken from
    return_to_go: float | None = None  # multi-step episodes: the discounted return from this step on
    reward_baseline: float | None = None  # ReMax: the greedy response's reward (`reward_components`)

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


def max_seq_len(model: ModelConfig) -> int:
    """The longest sequence a backend trains on: the prompt and response limits the rollouts had."""
    return model.max_prompt_tokens + model.max_response_tokens


def to_samples(
    experiences: Iterable[common_pb2.Experience],
    tokenizer: Tokenizer | None,
    *,
    max_seq_len: int | None = None,
) -> list[Sample]:
    """Tokenize (when needed) and annotate experiences. Group ids are numbered in order of appearance;
    an experience without a group id is a group of its own; episode ids likewise, None without one."""
    groups: dict[str, int] = {}
    episodes: dict[str, int] = {}
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
                episode=episodes.setdefault(exp.episode_id, len(episodes)) if exp.episode_id else None,
                state_key=exp.state_key,
                return_to_go=exp.reward_components.get(RETURN_TO_GO),
                reward_baseline=exp.reward_components.get(REWARD_BASELINE),
            )
        )
    return samples


def row_inputs(samples: Sequence[Sample]) -> dict[RowInput, torch.Tensor | None]:
    """The per-row inputs only some rollouts carry, `[batch]` each, None where the batch lacks one.

    Episode ids: a row without one is an episode of its own. State keys become GiGPO's anchor-state groups: steps
    of one task group (`group`) taken from the same state share an id; a row without a key gets -1 (no group).
    Returns-to-go and ReMax's greedy baselines: all rows or none.
    """
    episodes = None
    if any(s.episode is not None for s in samples):
        known = 1 + max(s.episode for s in samples if s.episode is not None)
        own = iter(range(known, known + len(samples)))
        episodes = torch.tensor([s.episode if s.episode is not None else next(own) for s in samples])
    anchors: dict[tuple[int, str], int] = {}
    states = [anchors.setdefault((s.group, s.state_key), len(anchors)) if s.state_key else -1 for s in samples]

    def every(values: list[float | None]) -> torch.Tensor | None:
        return torch.tensor(values, dtype=torch.float32) if all(v is not None for v in values) else None

    return {
        RowInput.EPISODE_IDS: episodes,
        RowInput.STATE_KEYS: torch.tensor(states) if anchors else None,
        RowInput.STEP_REWARDS: every([s.return_to_go for s in samples]),
        RowInput.REWARD_BASELINES: every([s.reward_baseline for s in samples]),
    }


def plan_updates(n: int, mini_batch_size: int | None, epochs: int, generator: torch.Generator) -> list[list[int]]:
    """A train step's optimizer updates over `n` samples, in order: per epoch, the batch shuffled and split into
    mini-batches of `mini_batch_size` (the whole batch, unshuffled, when that covers it), one update each."""
    size = mini_batch_size or n
    if size >= n:
        return [list(range(n)) for _ in range(epochs)]
    updates: list[list[int]] = []
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator).tolist()
        updates.extend(order[i : i + size] for i in range(0, n, size))
    return updates


def group_by_prompt(items: Sequence[tuple[tuple[int, ...], int]], budget: int) -> list[tuple[list[int], int]]:
    """Indices of `items` (prompt, tokens the item adds after that prompt) grouped by shared prompt, in
    order, with each group's row length. A group grows while its row (the prompt once, then every
    item's tokens) fits `budget`, and holds at least one item."""
    groups: list[tuple[list[int], int]] = []
    open_group: dict[tuple[int, ...], int] = {}  # prompt -> index of the group still growing
    for i, (prompt, tokens) in enumerate(items):
        g = open_group.get(prompt)
        if g is not None and groups[g][1] + tokens <= budget:
            members, length = groups[g]
            members.append(i)
            groups[g] = (members, length + tokens)
        else:
            open_group[prompt] = len(groups)
            groups.append(([i], len(prompt) + tokens))
    return groups


def _after_prompt(sample: Sample) -> int:
    """Tokens a sample adds to a row that starts with its prompt (a second prompt only if it differs)."""
    first = sample.chosen.prompt
    return sum(len(s.response) + (len(s.prompt) if s.prompt != first else 0) for s in sample.sequences)


def plan_micro_batches(samples: Sequence[Sample], token_budget: int, share_prompts: bool = False) -> list[list[int]]:
    """Split sample indices into micro-batches whose padded size (rows x longest row) fits the budget.

    Rows are samples (preference pairs count as two), or with `share_prompts` the shared-prompt rows
    of `group_by_prompt`, taken longest first, so each micro-batch holds similar lengths; a row longer than
    the budget on its own forms a micro-batch by itself (it cannot be split without changing the loss).
    Returns index lists into `samples`.
    """
    units: list[tuple[list[int], int, int]]  # (sample indices, rows, row length)
    if share_prompts:
        items = [(tuple(s.chosen.prompt), _after_prompt(s)) for s in samples]
        units = [(members, 1, length) for members, length in group_by_prompt(items, token_budget)]
    else:
        units = [([i], len(s.sequences), s.cost_length) for i, s in enumerate(samples)]
    units.sort(key=lambda u: u[2], reverse=True)
    batches: list[list[int]] = []
    current: list[int] = []
    rows = 0
    longest = 0
    for members, r, length in units:
        new_longest = max(longest, length)
        if current and (rows + r) * new_longest > token_budget:
            batches.append(current)
            current, rows, new_longest = [], 0, length
        current.extend(members)
        rows += r
        longest = new_longest
    if current:
        batches.append(current)
    return batches


@dataclass
class TokenBatch:
    """Right-padded tensors for a set of sequences.

    input_ids: `[rows, seq]`; attention_mask: `[rows, seq]` (1 = token), or for shared-prompt rows a
    `[rows, 1, seq, seq]` bool block mask (True = may attend) with `position_ids` `[rows, seq]`;
    response_index: `[n, resp]` position of the hidden state that predicts each response token of
    sequence n (prompt_len - 1 + j in its own row; clamped to 0 in padding), in row `response_row[n]`
    (None: row n); targets: `[n, resp]` the response tokens; mask: `[n, resp]` bool, train on this token;
    old_logprobs, token_rewards, teacher_logprobs: `[n, resp]` or None when no sequence has them.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_index: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    token_rewards: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    response_row: torch.Tensor | None = None
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
            position_ids=mv(self.position_ids),
            response_row=mv(self.response_row),
            extras={k: v.to(device) for k, v in self.extras.items()},
        )


_OPTIONAL = ("old_logprobs", "token_rewards", "teacher_logprobs")


class _Layout(TypedDict):
    """The row tensors of a `TokenBatch`: one row per sequence, or shared-prompt rows."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_index: torch.Tensor
    position_ids: NotRequired[torch.Tensor]
    response_row: NotRequired[torch.Tensor]


def collate(seqs: Sequence[TokenSequence], pad_id: int, pack_budget: int | None = None) -> TokenBatch:
    """Pad `seqs` to the longest row (tokens) and the longest response (annotations).

    With `pack_budget`, sequences that share a prompt share a row of at most that many tokens (see the
    module doc); without shared prompts the layout is one row per sequence either way.
    """
    for s in seqs:
        if not s.prompt and s.response:
            raise ValueError("a sequence needs at least one prompt token to predict its first response token")
    n = len(seqs)
    resp_len = max(max(len(s.response) for s in seqs), 1)
    targets = torch.full((n, resp_len), pad_id, dtype=torch.long)
    mask = torch.zeros((n, resp_len), dtype=torch.bool)
    optional: dict[str, torch.Tensor] = {}
    for r, s in enumerate(seqs):
        k = len(s.response)
        if k:
            targets[r, :k] = torch.tensor(s.response, dtype=torch.long)
            mask[r, :k] = torch.tensor(s.action_mask, dtype=torch.bool)
        for name in _OPTIONAL:
            values = getattr(s, name)
            if values is not None:
                if name not in optional:
                    optional[name] = torch.zeros((n, resp_len), dtype=torch.float32)
                optional[name][r, : len(values)] = torch.tensor(values, dtype=torch.float32)
    rows = None
    if pack_budget is not None:
        rows = group_by_prompt([(tuple(s.prompt), len(s.response)) for s in seqs], pack_budget)
        if len(rows) == n:
            rows = None  # nothing shared: the plain layout runs SDPA's causal path
    layout = _shared_prompt_rows(seqs, rows, resp_len, pad_id) if rows else _plain_rows(seqs, resp_len, pad_id)
    return TokenBatch(
        targets=targets,
        mask=mask,
        old_logprobs=optional.get("old_logprobs"),
        token_rewards=optional.get("token_rewards"),
        teacher_logprobs=optional.get("teacher_logprobs"),
        **layout,
    )


def _plain_rows(seqs: Sequence[TokenSequence], resp_len: int, pad_id: int) -> _Layout:
    seq_len = max(s.length for s in seqs)
    input_ids = torch.full((len(seqs), seq_len), pad_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), seq_len), dtype=torch.long)
    index = torch.zeros((len(seqs), resp_len), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids = s.prompt + s.response
        input_ids[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[r, : len(ids)] = 1
        p = len(s.prompt)
        index[r, : len(s.response)] = torch.arange(p - 1, p - 1 + len(s.response))
    return {"input_ids": input_ids, "attention_mask": attention, "response_index": index}


def _shared_prompt_rows(
    seqs: Sequence[TokenSequence], rows: list[tuple[list[int], int]], resp_len: int, pad_id: int
) -> _Layout:
    """Row = prompt, then each member's response; `segment` 0 marks the prompt, m + 1 member m, -1 padding."""
    seq_len = max(length for _, length in rows)
    input_ids = torch.full((len(rows), seq_len), pad_id, dtype=torch.long)
    positions = torch.zeros((len(rows), seq_len), dtype=torch.long)
    segment = torch.full((len(rows), seq_len), -1, dtype=torch.long)
    index = torch.zeros((len(seqs), resp_len), dtype=torch.long)
    row_of = torch.zeros(len(seqs), dtype=torch.long)
    for row, (members, _) in enumerate(rows):
        prompt = seqs[members[0]].prompt
        p = len(prompt)
        input_ids[row, :p] = torch.tensor(prompt, dtype=torch.long)
        positions[row, :p] = torch.arange(p)
        segment[row, :p] = 0
        start = p
        for m, i in enumerate(members):
            response = seqs[i].response
            k = len(response)
            row_of[i] = row
            if not k:
                continue
            input_ids[row, start : start + k] = torch.tensor(response, dtype=torch.long)
            positions[row, start : start + k] = torch.arange(p, p + k)
            segment[row, start : start + k] = m + 1
            # token j is predicted by the state before it: the prompt's last for j = 0, else its own j - 1
            index[i, 0] = p - 1
            index[i, 1:k] = torch.arange(start, start + k - 1)
            start += k
    causal = torch.ones((seq_len, seq_len), dtype=torch.bool).tril()
    query, key = segment.unsqueeze(2), segment.unsqueeze(1)
    # Padding attends to earlier padding only, so no query row is fully masked (SDPA would give NaN).
    allowed = causal & ((key == 0) & (query >= 0) | (query == key))
    return {
        "input_ids": input_ids,
        "attention_mask": allowed.unsqueeze(1),
        "position_ids": positions,
        "response_index": index,
        "response_row": row_of,
    }


def filter_experiences(
    experiences: Sequence[common_pb2.Experience], consumed: set[str], step: int, max_staleness: int | None
) -> tuple[list[common_pb2.Experience], dict[str, float]]:
    """Drop failed, duplicate (already trained: in `consumed`) and too-stale experiences, counting each.
    Demonstrations (SFT kind) are never stale: no policy sampled them.

    Shared by every training backend, so that they drop and count the same way."""
    keep, failed, dup, stale = [], 0, 0, 0
    for e in experiences:
        if e.failed:
            failed += 1
        elif e.id and e.id in consumed:
            dup += 1
        elif max_staleness is not None and e.kind != KIND_SFT and step - e.model_version > max_staleness:
            stale += 1
        else:
            keep.append(e)
    return keep, {"dropped/failed": float(failed), "dropped/duplicate": float(dup), "dropped/stale": float(stale)}
