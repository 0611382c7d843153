"""The web page (SPEC §10): server-rendered pages, a live feed of re-rendered fragments, and
actions as plain POSTs that answer with the fragments they changed.

Everything shown comes from the API's own reads (:class:`tether.engine.queries.Queries`,
with ``attention`` and ``ledger`` from the domain) and the API's own commands and tools; this
module only lays them out. Sign-in takes the admin token and keeps it in the HttpOnly
``tether_token`` cookie, which :func:`tether.api.auth.bearer` accepts; the sign-in form and
the static files are the only things open without it, every other page redirects to
sign-in, and the feed and actions answer 401.

One module per part of the page, in :mod:`tether.web.pages`: sign-in and static files, the
threads list and thread pages, the environments page, the live feed and steering actions;
this module joins their routers into the one the app includes.
"""

from __future__ import annotations

from fastapi import APIRouter

from tether.web.pages import environments, live, signin, steering, threads

router = APIRouter(include_in_schema=False)
for _part in (signin, threads, environments, live, steering):
    router.include_router(_part.router)
