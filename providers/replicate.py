"""Replicate's predictions API (https://replicate.com/docs/reference/http), as it documents it.

- **Create** ``POST /v1/predictions`` with ``{"version", "input"}`` when the profile pins a
  version, else ``POST /v1/models/{owner}/{name}/predictions`` with ``{"input"}`` (official
  models); ``Authorization: Bearer <token>``. Replicate documents **no idempotency key**: a
  create is sent once, and an unknown outcome is never answered by sending it again.
- **Collect** ``GET /v1/predictions/{id}``: ``starting`` and ``processing`` are polled again;
  ``succeeded`` is downloaded (``output`` is a URL or a list of them, on Replicate's delivery
  host: fetched without the credential); ``failed`` and ``canceled`` raise `RemoteJobFailed`
  at the profile's price (Replicate bills the time a prediction ran), with the prediction's
  own ``error`` text in the message (``CUDA out of memory``: sanitized, `core.provider_text`);
  ``aborted`` (a deadline passed before it started) raises it at no cost. A ``succeeded``
  prediction whose reply says ``data_removed: true`` (its output was deleted: "For
  predictions created through the API, all input parameters, output values, output files,
  and logs are automatically removed after an hour",
  https://replicate.com/docs/topics/predictions/data-retention) raises `OutputGone` at
  once, and so does a delivery answered 404 again after a fresh poll
  (`episodic.providers.jobs_api`): the prediction was billed, and collecting it can never succeed.
  `episodic.providers.retention` (one hour from the prediction's creation) is what `runs show` tells
  an operator of a paused run's accepted jobs.
- **Lookup** (an unknown create), only with the profile's ``lookup_by_input: true``: a
  prediction carries nothing of ours that a listing returns (its create takes ``version``,
  ``input`` and webhook settings only: no metadata, no idempotency key, no reference), so
  ``GET /v1/predictions?created_after=...`` (newest first, same-origin ``next`` pages) is
  searched for the one prediction of this model whose ``input`` equals, key for key, the
  input we sent: our per-item seed makes it unique among *ours*, not among another
  installation's with the same plan (staging beside production on one account), which is
  why it is off by default and the adapter then declares no lookup (an unknown create waits
  for an operator). Two matches are ambiguous (`UnknownOutcome`); none is "not found".
  Replicate removes an API prediction's input after an hour, so the window is at most the
  profile's ``lookup_window_s``.
- **Cancel** ``POST /v1/predictions/{id}/cancel``; **check** ``GET /v1/account`` (free).
- **Verify** a prediction an operator found (``episodic runs adopt``): ``GET
  /v1/predictions/{id}`` (free): this model (and pinned version), exactly the item's input.

Errors on create, by what they prove (Replicate answers a refused create with a problem
document, never a prediction): 429 `RateLimited`; any other 4xx `PermanentProviderError`
(401 bad token, 402 no credit, 404 unknown model, 422 invalid input); 409, 3xx, 5xx, a 2xx
without a prediction id, or no reply `UnknownOutcome`. The cost of an image is the
profile's price: Replicate's reply carries none, but it reports ``metrics.predict_time``
(seconds of compute), which a per_second price is charged on.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from episodic.core.errors import ProviderConfigError
from episodic.core.provider_text import provider_words
from episodic.providers.base import (
    CancelsJobs,
    Capabilities,
    ChecksCredential,
    DescribesJobs,
    ImageRequest,
    ImageResult,
    NotOurJob,
    OutputGone,
    RecordedElsewhere,
    RemoteJobFailed,
    UnknownOutcome,
    VerifiesJobs,
)
from episodic.providers.bounded_http import describe
from episodic.providers.compute_time import compute_us_of
from episodic.providers.input_check import check_inputs, input_properties, shown
from episodic.providers.jobs_api import (
    STATUS_WORD,
    JobsApiClient,
    NotYet,
    read_json,
    shown_status,
)
from episodic.providers.profiles import Profile

API = "https://api.replicate.com/v1"
_PREDICTION_ID = re.compile(r"[a-z0-9]{1,64}")


def model_input(profile: Profile, request: ImageRequest) -> dict[str, Any]:
    """The model's input for one item: the profile's constant inputs, the prompt and, when
    the model takes them, the seed and the plan's reference image (a data: URI), under the
    names the profile maps them to."""
    # a size object copied: the request never shares the profile's own mapping
    values: dict[str, Any] = {
        name: dict(value) if isinstance(value, dict) else value
        for name, value in profile.inputs.items()
    }
    values[profile.prompt_input] = request.prompt
    if profile.seed_input is not None:
        values[profile.seed_input] = request.seed
    if request.reference_image is not None and profile.reference_image_input is not None:
        values[profile.reference_image_input] = request.reference_image
    return values


class ReplicateProvider(JobsApiClient, CancelsJobs, DescribesJobs, ChecksCredential, VerifiesJobs):
    KIND = "replicate"
    AUTH_SCHEME = "Bearer"
    DEFAULT_BASE_URL = API
    GONE_AFTER_MISSES = 2  # its outputs are deleted after an hour (module docstring)

    def _capabilities(self, profile: Profile) -> Capabilities:
        return Capabilities(
            max_concurrency=profile.max_concurrency,
            supports_seed=profile.seed_input is not None,
            price=profile.pricing,
            # the seed tells ours apart, but only from our own: another installation on the
            # same account sends the very same input (lookup_by_input declares there is none)
            can_lookup=profile.lookup_by_input and profile.seed_input is not None,
            idempotent_create=False,
        )

    def submit(self, request: ImageRequest) -> str:
        body: dict[str, Any] = {"input": model_input(self.profile, request)}
        if self.profile.version is not None:
            body["version"] = self.profile.version
            response = self._create("/predictions", body)
        else:
            response = self._create(f"/models/{self.model}/predictions", body)
        return self._created(response, "id", _PREDICTION_ID, "prediction")

    def _collect_once(self, remote_ref: str) -> ImageResult:
        prediction = self._get_json(f"/predictions/{remote_ref}")
        status = prediction.get("status")
        if status == "aborted":  # its deadline passed before it started: not billed
            raise RemoteJobFailed("prediction aborted before it started", billed=False)
        if status in ("failed", "canceled"):
            said = provider_words(prediction.get("error"), secrets=self._secrets)
            raise RemoteJobFailed(
                f"prediction {status}" + (f": {said}" if said else ""),
                compute_us=compute_us_of(prediction),
                cancelled=status == "canceled",
            )
        if status != "succeeded":
            raise NotYet(f"status {shown_status(status)}", failed=False)
        if prediction.get("data_removed") is True:
            raise OutputGone(
                f"prediction {remote_ref}: output removed by Replicate (data_removed: its "
                "outputs are kept one hour)",
                compute_us=compute_us_of(prediction),
            )
        output = prediction.get("output")
        url = output[0] if isinstance(output, list) and output else output
        return self._fetch_output(url, compute_us=compute_us_of(prediction))

    def lookup(
        self,
        client_reference: str,
        request: ImageRequest | None = None,
        *,
        recorded: RecordedElsewhere | None = None,
    ) -> str | None:
        if not self.capabilities.can_lookup or request is None:
            raise UnknownOutcome(
                "lookup: a Replicate prediction carries nothing of ours; finding it by its "
                "input needs lookup_by_input (one installation per account)"
            )
        wanted = model_input(self.profile, request)
        since = datetime.now(UTC) - timedelta(seconds=self.profile.lookup_window_s)
        return self._find_one(
            "/predictions",
            {"created_after": since.isoformat().replace("+00:00", "Z")},
            lambda entry: self._ours(entry, wanted),
            _PREDICTION_ID,
            "prediction",
            recorded,
        )

    def _ours(self, entry: dict[str, Any], wanted: dict[str, Any]) -> bool:
        """This model's (and pinned version's) prediction with exactly our input. The
        reference image is left out of the comparison: Replicate may keep an uploaded file
        as a URL of its own instead of the data we sent (the seed and prompt still tell
        ours apart)."""
        found = entry.get("input")
        skip = self.profile.reference_image_input
        if not isinstance(found, dict) or (skip is None and found != wanted):
            return False
        if skip is not None and (
            {k: v for k, v in found.items() if k != skip}
            != {k: v for k, v in wanted.items() if k != skip}
        ):
            return False
        if self.profile.version is not None:
            return entry.get("version") == self.profile.version
        return entry.get("model") == self.model

    def verify_job(self, remote_ref: str, request: ImageRequest) -> str:
        """A prediction an operator found (``GET /v1/predictions/{id}``, free) is this
        item's only when it is of this model (and pinned version) and its ``input`` is
        exactly the item's (prompt, seed and the profile's constant inputs; a reference
        image is not compared: Replicate may keep it as a URL of its own). Replicate removes
        an API prediction's input (and output) an hour after it ends: such a prediction
        cannot be verified, and is refused."""
        if not _PREDICTION_ID.fullmatch(remote_ref):
            raise NotOurJob(f"{shown(remote_ref)!r} is not a Replicate prediction id")
        missing = f"Replicate has no prediction {remote_ref} on this account"
        entry = self._read_free(f"/predictions/{remote_ref}", missing, f"prediction {remote_ref}")
        if self.profile.version is not None:
            if entry.get("version") != self.profile.version:
                raise NotOurJob(
                    f"prediction {remote_ref} is not of version {self.profile.version[:12]} "
                    f"of {self.model}"
                )
        elif entry.get("model") != self.model:
            found = provider_words(entry.get("model"), secrets=self._secrets, limit=80)
            raise NotOurJob(f"prediction {remote_ref} is of model {found or '?'}, not {self.model}")
        wanted = model_input(self.profile, request)
        if not isinstance(entry.get("input"), dict) or not entry["input"]:
            raise NotOurJob(
                f"prediction {remote_ref} no longer shows its input (Replicate removes it an "
                "hour after the prediction ends): it cannot be verified as this item's"
            )
        if not self._ours(entry, wanted):
            raise NotOurJob(
                f"prediction {remote_ref}'s input is not item {request.item_id}'s (prompt, "
                "seed or the profile's inputs differ)"
            )
        seed = f", seed {request.seed}" if self.profile.seed_input is not None else ""
        return f"prediction {remote_ref}: model {self.model}, the item's prompt{seed}"

    def how_to_find(self, request: ImageRequest) -> str:
        """Where an operator finds a prediction whose create reply was lost (predictions
        carry nothing of ours): this model's predictions, by the item's input."""
        seed = f", seed {request.seed}" if self.profile.seed_input is not None else ""
        return (
            f"a prediction of {self.model} (prompt of item {request.item_id}{seed}) in "
            "Replicate's prediction list"
        )

    def cancel(self, remote_ref: str) -> str:
        """Ask Replicate to cancel a prediction; its status after the call (``canceled``, or
        the terminal status it had already reached). Raises `UnknownOutcome` when the
        answer is not known."""
        if not _PREDICTION_ID.fullmatch(remote_ref):
            raise UnknownOutcome("cancel: malformed prediction id")
        try:
            response = self._api.post(f"/predictions/{remote_ref}/cancel")
            status = read_json(response).get("status") if response.is_success else None
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise UnknownOutcome(f"cancel: {describe(exc)}") from None
        if not isinstance(status, str) or not STATUS_WORD.fullmatch(status):
            raise UnknownOutcome(f"cancel: HTTP {response.status_code}")
        return status

    def check(self) -> str:
        """Verify without spending: the token (``GET /v1/account``), the model (``GET
        /v1/models/{owner}/{name}``), the pinned version if any (``GET
        .../versions/{id}``), and every configured input name against the version's
        OpenAPI schema (``components.schemas.Input.properties``). Raises
        `ProviderConfigError` (refused token, no such model or version, an unknown input)
        or `UnknownOutcome` (no answer)."""
        response = self._verify("/account")
        try:
            username = read_json(response).get("username") if response.is_success else None
        except (ValueError, AttributeError):
            username = None
        if not isinstance(username, str):
            raise UnknownOutcome(f"account: HTTP {response.status_code} without an account")
        account = shown(username) or "?"
        model = self._found(f"/models/{self.model}", f"model {self.model}")
        where = f"model {self.model}"
        version: object = model.get("latest_version")
        if self.profile.version is not None:
            version = self._found(
                f"/models/{self.model}/versions/{self.profile.version}",
                f"version {self.profile.version} of model {self.model}",
            )
            where = f"{self.model} version {self.profile.version[:12]}"
        schema = version.get("openapi_schema") if isinstance(version, dict) else None
        properties = input_properties(schema)
        if properties is None:
            raise UnknownOutcome(f"{where}: the reply has no input schema")
        names = check_inputs(self.profile, properties, where)
        return (
            f"Replicate accepted the token (account {account}); {where} takes every "
            f"configured input ({', '.join(names)})"
        )

    def _found(self, path: str, what: str) -> dict[str, Any]:
        """A free GET that must answer a JSON object: 404 is `ProviderConfigError` (no such
        model or version), anything else but 200 `UnknownOutcome`."""
        response = self._verify(path)
        if response.status_code == 404:
            raise ProviderConfigError(f"profile {self.profile.id!r}: Replicate has no {what}")
        try:
            body = read_json(response) if response.status_code == 200 else None
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise UnknownOutcome(f"{what}: HTTP {response.status_code} without its description")
        return body
