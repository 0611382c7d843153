"""What the web page shows, as pure functions over the API's own views.

Every function here takes the JSON views that ``GET /api/threads``, ``GET /api/threads/{id}``
and ``GET /api/tasks`` answer (built by :mod:`tether.domain.views`, with ``attention`` from
:mod:`tether.domain.attention` and ``ledger`` from :mod:`tether.domain.ledger`) and turns
them into rows and cards for the templates. Nothing is derived twice: a thread's group is
its ``attention``, a ledger row is the API's ledger row. The same functions render a thread
of a linked environment, whose views arrive through the link.

:func:`affected` maps a batch of events of the feed to the fragments they change; the live
feed re-renders those from the store, so a duplicate or late event re-renders the same
fragment with the same id and can never add a second row.

One module per part of the page: :mod:`.context` (shared words and times), :mod:`.threads`
(the list and a thread's head), :mod:`.runs`, :mod:`.timeline`, :mod:`.tasks` (cards,
background rows, the ledger) and :mod:`.live` (which fragments events change).
"""

from tether.web.model.context import GROUP_TITLES, OPEN, Context, elapsed, seconds_text, short
from tether.web.model.live import affected
from tether.web.model.runs import run_state
from tether.web.model.tasks import background_rows, deadline_fields, ledger_rows, task_card
from tether.web.model.threads import group_rows, thread_head, thread_row
from tether.web.model.timeline import monitor_entry, monitor_page, timeline

__all__ = [
    "GROUP_TITLES",
    "OPEN",
    "Context",
    "affected",
    "background_rows",
    "deadline_fields",
    "elapsed",
    "group_rows",
    "ledger_rows",
    "monitor_entry",
    "monitor_page",
    "run_state",
    "seconds_text",
    "short",
    "task_card",
    "thread_head",
    "thread_row",
    "timeline",
]
