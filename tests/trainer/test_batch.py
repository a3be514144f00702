from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_helpers import assert_logprobs_of_single_rows, random_rollouts
from transformers import AutoModelForCausalLM, AutoTokenizer

from trinity.trainer.batch import Tokenizer, collate, plan_micro_batches, to_samples
from trinity.trainer.logprobs import chunked_logprobs
from trinity.trainer.models import response_hidden
from trinity.v1 import common_pb2


def test_micro_batches_cover_every_sample_once_within_the_token_budget() -> None:
    samples = to_samples(random_rollouts(20, seed=3), None)
    plan = plan_micro_batches(samples, token_budget=40)
    assert sorted(i for mb in plan for i in mb) == list(range(20))
    assert len(plan) > 1
    for mb in plan:
        padded = len(mb) * max(samples[i].cost_length for i in mb)
        assert padded <= 40 or len(mb) == 1


def test_a_sample_longer_than_the_budget_gets_a_micro_batch_of_its_own() -> None:
    samples = to_samples(random_rollouts(6, seed=4), None)
    plan = plan_micro_batches(samples, token_budget=1)
    assert sorted(len(mb) for mb in plan) == [1] * 6


def test_response_positions_give_the_same_logprobs_as_a_full_forward(tiny_model: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    exps = random_rollouts(5, seed=5)
    samples = to_samples(exps, None)
    batch = collate([s.chosen for s in samples], pad_id=2)
    with torch.no_grad():
        hidden, head = response_hidden(model, batch)
        lp, _ = chunked_logprobs(head, hidden, batch.targets, chunk_size=4)
        assert_logprobs_of_single_rows(model, exps, lp)
    assert batch.mask.sum() == sum(sum(e.action_mask) for e in exps)


def test_text_only_sft_data_is_tokenized_with_the_chat_template(tiny_model: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model)
    exp = common_pb2.Experience(id="s", kind=common_pb2.EXPERIENCE_KIND_SFT, prompt_text="hi", response_text="yo")
    [sample] = to_samples([exp], Tokenizer(tok))
    assert tok.decode(sample.chosen.prompt) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(sample.chosen.response) == "yo<|im_end|>\n"
    assert all(sample.chosen.action_mask)


def test_messages_ending_with_an_assistant_turn_train_on_that_turn(tiny_model: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model)
    msgs = [
        common_pb2.ChatMessage(role="user", content="a"),
        common_pb2.ChatMessage(role="assistant", content="b"),
    ]
    exp = common_pb2.Experience(id="m", kind=common_pb2.EXPERIENCE_KIND_SFT, messages=msgs)
    [sample] = to_samples([exp], Tokenizer(tok))
    assert tok.decode(sample.chosen.response) == "b<|im_end|>\n"


def test_preference_text_pairs_share_the_prompt(tiny_model: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model)
    exp = common_pb2.Experience(
        id="p",
        kind=common_pb2.EXPERIENCE_KIND_PREFERENCE,
        prompt_text="q",
        response_text="good",
        preference=common_pb2.Preference(rejected_text="bad"),
    )
    [sample] = to_samples([exp], Tokenizer(tok))
    assert sample.rejected is not None
    assert sample.rejected.prompt == sample.chosen.prompt
    assert tok.decode(sample.rejected.response) == "bad<|im_end|>\n"


def test_misaligned_logprobs_are_rejected_with_the_experience_id() -> None:
    exp = common_pb2.Experience(id="bad", prompt_token_ids=[5], response_token_ids=[6, 7], logprobs=[-1.0])
    with pytest.raises(ValueError, match=r"'bad'.*logprobs"):
        to_samples([exp], None)


def test_truncation_cuts_the_response_and_its_annotations() -> None:
    exp = common_pb2.Experience(
        id="t", prompt_token_ids=[5, 6], response_token_ids=[7, 8, 9], logprobs=[-1.0, -2.0, -3.0]
    )
    [s] = to_samples([exp], None, max_seq_len=4)
    assert s.chosen.response == [7, 8]
    assert s.chosen.old_logprobs == [-1.0, -2.0]


def test_group_ids_are_numbered_and_empty_ones_are_singletons() -> None:
    exps = [
        common_pb2.Experience(id=str(i), group_id=g, prompt_token_ids=[5], response_token_ids=[6])
        for i, g in enumerate(["a", "b", "a", "", ""])
    ]
    assert [s.group for s in to_samples(exps, None)] == [0, 1, 0, 2, 3]
