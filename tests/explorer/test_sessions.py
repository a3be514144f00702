"""SessionStore: which calls a feedback takes, what it gives back on a retry, what expires and is counted."""

from __future__ import annotations

from trinity.explorer.sessions import RecordedCall, Session, SessionStore, feedback_experiences


def call(response: str, choice: int = 0) -> RecordedCall:
    return RecordedCall(
        call_id=f"{response}-{choice}",
        prompt_token_ids=[1, 2],
        response_token_ids=[3, 4],
        logprobs=[-0.5, -0.25],
        model_version=3,
        response_id=response,
        choice_index=choice,
    )


def test_calls_of_one_request_share_its_step_index() -> None:
    store = SessionStore()
    assert store.record("s", [call("r0")]) == 0
    assert store.record("s", [call("r1", 0), call("r1", 1)]) == 1
    session = store.close("s")
    assert session is not None
    assert [(c.call_id, c.step_index) for c in session.calls] == [("r0-0", 0), ("r1-0", 1), ("r1-1", 1)]


def test_take_response_takes_its_choices_and_leaves_the_other_calls() -> None:
    store = SessionStore()
    store.record("s", [call("r0")])
    store.record("s", [call("r1", 0), call("r1", 1)])
    taken = store.take_response("r1")
    assert taken is not None and taken.session_id == "s"
    assert [c.call_id for c in taken.calls] == ["r1-0", "r1-1"]
    assert store.take_response("r1") is None
    rest = store.close("s")
    assert rest is not None and [c.call_id for c in rest.calls] == ["r0-0"]


def test_take_one_choice_leaves_the_response_open_for_the_others() -> None:
    store = SessionStore()
    store.record("s", [call("r", 0), call("r", 1)])
    first = store.take_response("r", choice_index=1)
    assert first is not None and [c.call_id for c in first.calls] == ["r-1"]
    assert store.take_response("r", choice_index=1) is None
    second = store.take_response("r")
    assert second is not None and [c.call_id for c in second.calls] == ["r-0"]


def test_a_session_whose_calls_were_all_taken_is_closed() -> None:
    store = SessionStore()
    store.record("s", [call("r")])
    assert store.take_response("r") is not None
    assert len(store) == 0 and store.close("s") is None


def test_restore_puts_taken_calls_back_in_step_order() -> None:
    store = SessionStore()
    store.record("s", [call("r0")])
    store.record("s", [call("r1")])
    taken = store.take_response("r0")
    assert taken is not None
    store.restore(taken)
    assert store.stats().rewarded_calls == 0
    again = store.take_response("r0")
    assert again is not None and [c.call_id for c in again.calls] == ["r0-0"]
    store.restore(again)
    session = store.close("s")
    assert session is not None and [c.call_id for c in session.calls] == ["r0-0", "r1-0"]


def test_expire_drops_idle_sessions_and_counts_their_calls() -> None:
    now = [0.0]
    store = SessionStore(ttl_s=10, clock=lambda: now[0])
    store.record("idle", [call("a", 0), call("a", 1)])
    now[0] = 5.0
    store.record("busy", [call("b")])
    now[0] = 10.5
    swept = store.expire()
    assert (swept.sessions, swept.calls) == (1, 2)
    assert store.take_response("a") is None and store.close("idle") is None
    assert store.expire().sessions == 0
    stats = store.stats()
    assert (stats.open_sessions, stats.open_calls, stats.expired_sessions, stats.expired_calls) == (1, 1, 1, 2)
    assert (stats.recorded_calls, stats.rewarded_calls) == (3, 0)


def test_a_recorded_call_keeps_its_session_alive() -> None:
    now = [0.0]
    store = SessionStore(ttl_s=10, clock=lambda: now[0])
    store.record("s", [call("a")])
    now[0] = 9.0
    store.record("s", [call("b")])
    now[0] = 15.0
    assert store.expire().sessions == 0 and len(store) == 1


def test_feedback_experiences_carry_the_calls_exactly() -> None:
    taken = Session("s", [call("r", 0), call("r", 1)])
    exps = feedback_experiences(taken, run_id="run", reward=0.5, group_id="g", components={"task": 1.0})
    assert [e.id for e in exps] == ["r-0", "r-1"]  # the call ids: a retried feedback is deduplicated
    for exp in exps:
        assert list(exp.prompt_token_ids) == [1, 2] and list(exp.response_token_ids) == [3, 4]
        assert list(exp.logprobs) == [-0.5, -0.25] and exp.model_version == 3
        assert exp.reward == 0.5 and exp.group_id == "g" and exp.task_id == "g" and exp.run_id == "run"
        assert exp.info["session_id"] == "s" and exp.info["response_id"] == "r" and exp.episode_id == "s"
