"""Who may see what (``tether.domain.access``, G10): every kind of caller against every
relation a thread can have to it."""

from __future__ import annotations

import pytest

from tether.domain import access
from tether.domain.records import Task, Thread
from tether.types import ADMIN, Caller

HERE = "env_here"
AT = "2026-01-01T00:00:00.000Z"


def thread(thread_id: str, parent: str | None = None, env: str = HERE, token: str | None = None) -> Thread:
    link = {"environmentId": env, "threadId": parent, "taskId": "tsk_1"} if parent else None
    return Thread(id=thread_id, provider="script", created_at=AT, parent=link, token_id=token)


PARENT = thread("thr_parent")
ME = thread("thr_me", parent="thr_parent")
CHILD = thread("thr_child", parent="thr_me")
SIBLING = thread("thr_sibling", parent="thr_parent")
STRANGER = thread("thr_stranger")
ELSEWHERE = thread("thr_remote_child", parent="thr_me", env="env_other")
AS_ME = Caller("thread", thread_id="thr_me")


@pytest.mark.parametrize(
    ("target", "seen"),
    [(ME, True), (CHILD, True), (PARENT, True), (SIBLING, False), (STRANGER, False), (ELSEWHERE, False)],
)
def test_a_thread_sees_itself_its_children_and_its_parent_not_its_neighbours(
    target: Thread, seen: bool
) -> None:
    assert access.sees(AS_ME, target, ME, HERE) is seen


def test_the_admin_sees_everything_and_a_link_only_what_its_token_created() -> None:
    mine, theirs = thread("thr_a", token="tok_1"), thread("thr_b", token="tok_2")
    assert all(access.sees(ADMIN, t, None, HERE) for t in (mine, theirs, STRANGER))
    link = Caller("link", token_id="tok_1")
    assert [access.sees(link, t, None, HERE) for t in (mine, theirs, STRANGER)] == [True, False, False]


def test_a_parent_in_another_environment_is_not_a_parent_here() -> None:
    assert access.parent_of(ME, HERE) == "thr_parent"
    assert access.parent_of(ME, "env_other") is None
    assert access.parent_of(PARENT, HERE) is None


def test_the_local_side_of_a_task_is_where_that_side_lives() -> None:
    task = Task("tsk_1", HERE, "thr_me", "env_other", "thr_remote", AT)
    assert access.local_side(task, "thr_me", HERE) and not access.local_side(task, "thr_remote", HERE)
    assert access.local_side(task, "thr_remote", "env_other")


def test_an_origin_is_the_parent_only_with_both_environment_and_thread() -> None:
    assert access.is_parent(ME, {"environmentId": HERE, "threadId": "thr_parent"})
    assert not access.is_parent(ME, {"environmentId": "env_other", "threadId": "thr_parent"})
    assert not access.is_parent(ME, {"environmentId": HERE, "threadId": "thr_sibling"})
    assert not access.is_parent(PARENT, {"environmentId": HERE, "threadId": "thr_parent"})
