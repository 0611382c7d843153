"""A feed frame splices the stored event JSON in without decoding it: what a reader
parses must still be exactly ``event_json``, whatever the data holds."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from tether.api.events import _frame, event_json
from tether.codec import dumps
from tether.store.base import Event

_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)


@given(data=st.dictionaries(st.text(), _values, max_size=4), thread=st.none() | st.text(min_size=1))
def test_a_frame_is_one_event_whose_data_parses_to_event_json(
    data: dict[str, object], thread: str | None
) -> None:
    event = Event(7, "task.updated", "2026-12-03T00:00:00.000Z", thread, None, "tsk_1", None, dumps(data))
    frame = _frame(event, "env_1")
    assert frame.endswith("\n\n") and frame.count("\n\n") == 1
    lines = frame[:-2].split("\n")
    assert lines[:2] == ["id: 7", "event: task.updated"]
    assert [line[:6] for line in lines[2:]] == ["data: "]
    assert json.loads(lines[2][6:]) == event_json(event, "env_1")
