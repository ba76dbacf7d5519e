"""A lookup of a job whose create's reply was lost, believed only from the provider's reply
(the jobs API adapters', `providers.jobs_api`): the listed jobs that are ours by the reply's
own fields (a server that ignores a filter cannot hand us another item's job), across at most
``MAX_LOOKUP_PAGES`` ``next`` links on the provider's own origin (they get the credential);
the one found, none, or `AmbiguousLookup` naming the candidates. A job the ledger records for
another submission (`recorded`) is never counted: the same input in two episodes of one
playlist would otherwise make every lookup ambiguous, or take the other episode's job.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx

from episodic.core.provider_text import provider_words
from episodic.providers.base import AmbiguousLookup, RecordedElsewhere, UnknownOutcome
from episodic.providers.bounded_http import describe
from episodic.providers.replies import read_json

MAX_LOOKUP_PAGES = 20
_HTTP_FAILURES = (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError)


class FindsJobs:
    """The lookup half of a jobs API client: its API client (`_api`, with the credential)
    and its origin (`_origin`) are the client's own."""

    _api: httpx.Client
    _origin: httpx.URL

    def _same_origin(self, page_url: httpx.URL, link: object) -> httpx.URL:
        """The next page's URL, only on the provider's origin (it gets the credential)."""
        try:
            target = page_url.join(link) if isinstance(link, str) else None
        except (httpx.InvalidURL, ValueError):  # ValueError: a host IDNA cannot encode
            target = None
        origin = self._origin
        if target is None or (target.scheme, target.host, target.port) != (
            origin.scheme,
            origin.host,
            origin.port,
        ):
            raise UnknownOutcome("lookup: next link is not on the provider's origin")
        return target

    def _find_one(
        self,
        path: str,
        params: dict[str, str],
        ours: Callable[[dict[str, Any]], bool],
        usable: re.Pattern[str],
        what: str,
        recorded: RecordedElsewhere | None = None,
    ) -> str | None:
        """The id of the one listed `what` for which `ours` holds, not `recorded` for another
        submission, across same-origin ``next`` pages of ``{"results": [...]}``; None when
        there is none. `AmbiguousLookup` when two remain, `UnknownOutcome` when a match has
        no `usable` id, the reply is unusable, or there are more than `MAX_LOOKUP_PAGES`
        pages: believed only from the reply, never from a filter."""
        found: dict[str, str] = {}  # id -> created_at as the reply says it
        url: str | httpx.URL = path
        query: dict[str, str] | None = params
        for _ in range(MAX_LOOKUP_PAGES):
            page, page_url = self._lookup_page(url, query)
            results = page.get("results")
            if not isinstance(results, list):
                raise UnknownOutcome("lookup: reply without a results list")
            for entry in results:
                if isinstance(entry, dict) and ours(entry):
                    job_id = entry.get("id")
                    if not isinstance(job_id, str) or not usable.fullmatch(job_id):
                        raise UnknownOutcome(f"lookup: a {what} matching ours has no usable id")
                    found[job_id] = provider_words(entry.get("created_at"), limit=40)
            link = page.get("next")
            if link is None or link == "":
                break
            url, query = self._same_origin(page_url, link), None
        else:
            raise UnknownOutcome(f"lookup: more than {MAX_LOOKUP_PAGES} pages of {what}s")
        mine = {ref: at for ref, at in found.items() if recorded is None or not recorded(ref)}
        if len(mine) > 1:
            raise AmbiguousLookup.among(mine, what)
        return next(iter(mine), None)

    def _lookup_page(
        self, url: str | httpx.URL, params: dict[str, str] | None
    ) -> tuple[dict[str, Any], httpx.URL]:
        try:
            response = self._api.get(url, params=params)
        except _HTTP_FAILURES as exc:
            raise UnknownOutcome(f"lookup: {describe(exc)}") from None
        if response.status_code != 200:
            raise UnknownOutcome(f"lookup: HTTP {response.status_code}")
        try:
            page = read_json(response)
        except ValueError:
            raise UnknownOutcome("lookup: reply is not JSON") from None
        if not isinstance(page, dict):
            raise UnknownOutcome("lookup: reply is not a JSON object")
        return page, response.request.url
