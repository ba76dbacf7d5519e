"""Stand-ins of Replicate's and fal's HTTP APIs, written from their public documentation only
(each module's docstring names the pages, what it models and what it had to assume).

They are separate from the project's own servers (tests/jobs_servers.py, tests/http_server.py)
and from the fake provider: a test that proves money or exactly-once against a stand-in counts
at the provider's side, as the provider would (``jobs_made``, ``bills``, ``bill_micros``).

Use::

    with ReplicateStandIn(billing="per_output_image", price_micros=3_000) as replicate:
        profile = Profile(kind="replicate", base_url=replicate.base_url, ...)
        replicate.throttle(2, retry_after=1)        # the next two creates answer 429
        replicate.script("fox", status="failed", error="CUDA out of memory")
        ...
        replicate.advance(3600)                     # the retention hour passes
        assert replicate.bill_micros == ...

    with FalStandIn(price_micros=25_000) as fal:    # flux/dev, per started megapixel
        profile = Profile(kind="fal", base_url=fal.base_url, schema_url=fal.schema_url, ...)

What both offer (``_server.StandIn``):

- read: ``requests`` (every API request, `Seen`: method, path with query, headers, body),
  ``create_requests`` (the creates among them),
  ``downloads`` (the delivery origin's), ``credential_reached_delivery``, ``create_calls``
  (creates that reached the API, refused or not), ``jobs_made`` (Counter per prompt),
  ``jobs_made_total``, ``jobs_with(**input)``, ``bills`` (job id -> micro-units),
  ``bill_micros``, ``cancels`` (Counter per job id);
- arm, for the next creates in the order armed: ``throttle(n, retry_after=1)`` (429),
  ``unavailable(n, retry_after=1)`` (503), ``refuse(n, status, body=None)``,
  ``lose_reply(n)`` (made, then 500), ``drop_after_create(n)`` (made, connection closed);
  for the next GETs: ``throttle_reads(n, retry_after=1, status=429)``;
- drive: ``script(match, **fields)`` (what jobs whose prompt contains ``match`` do),
  ``finish(job_id)`` (end it now), ``advance(seconds)`` (the stand-in's clock).
"""

from tests.standins.fal import FalStandIn
from tests.standins.replicate import ReplicateStandIn

__all__ = ["FalStandIn", "ReplicateStandIn"]
