"""JSON Schemas (draft 2020-12) of the files people write: the playlist and the providers
file, from the pydantic models that read them (`episodic.core.playlist.Playlist`,
`episodic.providers.profiles.Profile`), for editors to validate a file as it is typed
(``episodic schema playlist|providers``). Extras are refused in the models, so every object
says ``additionalProperties: false``: a mistyped field is flagged where it is written.

A schema checks the shape; the models check more (one price basis, a model per kind, ...):
`episodic providers check` and `episodic plan` have the last word."""

from __future__ import annotations

import copy
from typing import Any

from episodic.core.playlist import Playlist
from episodic.providers.profiles import Profile

DIALECT = "https://json-schema.org/draft/2020-12/schema"

_PROFILE_FIELDS = {
    "kind": "The adapter: fake, http (our own protocol), replicate or fal.",
    "price": "What one image costs, one basis: per_image, per_megapixel or per_second "
    '(decimal strings such as "0.003").',
    "cost_per_image_minor": "The older price form: whole cents of currency per image.",
    "free": "true when the provider really charges nothing (a price of 0 needs it).",
    "currency": "ISO 4217 code of the price (default USD).",
    "max_concurrency": "Jobs in flight at once, every run and machine together.",
    "base_url": "The API's base URL; default Replicate's or fal's own. Set only for a proxy "
    "or a test server.",
    "schema_url": "fal only: where an endpoint's OpenAPI schema is read by `providers check` "
    "(default https://fal.ai/api/openapi/queue/openapi.json).",
    "credential_env": "The environment variable holding the API token (never the token).",
    "credential_secret_block": "The Prefect Secret block holding the API token, read through "
    "PREFECT_API_URL.",
    "timeout_s": "Seconds an API call may take.",
    "poll_interval_s": "Seconds between polls of a running job.",
    "max_job_s": "The longest one job runs at the provider, in seconds.",
    "delay_ms": "fake only: milliseconds each job takes.",
    "idempotent_create": "http only: the provider honours Idempotency-Key on create.",
    "lookup": "http only: the provider looks a job up by the client reference it carries.",
    "model": "replicate: owner/name; fal: owner/app with its subpath (fal-ai/flux/dev).",
    "version": "replicate only: the model version to pin (64 hex digits).",
    "inputs": "Constant model inputs sent with every item, named as the model names them.",
    "prompt_input": "The model's input name for the prompt (default prompt).",
    "seed_input": "The model's input name for the seed (default seed; null: it takes none).",
    "reference_image_input": "The model's input taking the playlist's reference image.",
    "lookup_window_s": "replicate: how far back (seconds) a lookup by input looks.",
    "lookup_by_input": "replicate only: find a prediction whose create reply was lost by its "
    "exact input; only when no other installation uses the account for this model.",
}
_PRICE_FIELDS = {
    "per_image": "Price of one output image.",
    "per_megapixel": "Price of one megapixel of the stored image.",
    "per_second": "Price of one second of the compute time the provider reports.",
    "whole_megapixels": "per_megapixel: every started megapixel is billed (fal's rule).",
    "at_most": "The most megapixels or seconds an image takes: what estimates and budgets "
    "reserve before it exists.",
    "failed": "Whether a job that ends failed or cancelled is billed (billed or free); by "
    "default as the provider documents it: fal and Replicate's models billed by output free, "
    "per-second prices and the http protocol billed.",
}
_PLAYLIST_FIELDS = {
    "template": "The prompt template every item is generated from.",
    "provider_profile": "The provider profile (providers.yaml) that buys the images.",
    "reference_assets": "Files beside the playlist whose hashes are in every item's key.",
    "reference_image": "One of reference_assets sent with every item as the reference image.",
    "hero": "A hero run for every video without its own: candidates images, one is picked.",
    "items": "The videos: each one image per part (or a hero run's candidates).",
}
_DEFS = {
    "Template": {
        "id": "The template's id.",
        "version": "Its version: raise it when the prompt changes.",
        "prompt": "The prompt, with placeholders {title}, {part}, {video_id}, {index}.",
    },
    "Video": {
        "video_id": "The video's id, unique in the playlist.",
        "title": "The video's title ({title} in the prompt).",
        "parts": "The parts, one image each (default [1]).",
        "seed": "The video's seed, 0 to 2^31-1.",
        "hero": "This video's hero run ({candidates: N}), or false for none.",
    },
    "Hero": {"candidates": "How many candidate images are bought; a reviewer picks one."},
}


def json_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of the ``playlist`` or ``providers`` file."""
    if kind == "playlist":
        schema = Playlist.model_json_schema()
        _describe(schema, _PLAYLIST_FIELDS)
        for name, fields in _DEFS.items():
            if name in schema.get("$defs", {}):
                _describe(schema["$defs"][name], fields)
        return _headed(
            schema,
            "episodic playlist",
            "What an episode generates: a prompt template, a provider profile and the "
            "videos (docs/playlist.md).",
        )
    if kind == "providers":
        profile = copy.deepcopy(Profile.model_json_schema())
        defs = profile.pop("$defs", {})
        profile["properties"].pop("id", None)  # the profile's key in `profiles`
        profile["required"] = [name for name in profile.get("required", []) if name != "id"]
        profile["title"] = "Profile"
        profile["description"] = "One provider profile; its id is its key under profiles."
        _describe(profile, _PROFILE_FIELDS)
        if "PriceSpec" in defs:
            _describe(defs["PriceSpec"], _PRICE_FIELDS)
            defs["PriceSpec"]["description"] = "One price basis and, for megapixels and "
            defs["PriceSpec"]["description"] += "seconds, its upper bound at_most."
        defs["Profile"] = profile
        schema = {
            "type": ["object", "null"],  # an empty file loads: no profiles of its own
            "additionalProperties": False,
            "properties": {
                "profiles": {
                    "description": "Provider profiles by id (1 to 64 letters, digits, _ . -).",
                    "type": ["object", "null"],
                    "propertyNames": {"pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"},
                    "additionalProperties": {"$ref": "#/$defs/Profile"},
                }
            },
            "$defs": defs,
        }
        return _headed(
            schema,
            "episodic provider profiles",
            "Which paid image API each provider profile uses, what an image costs and where "
            "its credential is read (docs/providers.md).",
        )
    raise ValueError(kind)


def _headed(schema: dict[str, Any], title: str, description: str) -> dict[str, Any]:
    body = {key: value for key, value in schema.items() if key not in ("title", "description")}
    return {"$schema": DIALECT, "title": title, "description": description, **body}


def _describe(schema: dict[str, Any], descriptions: dict[str, str]) -> None:
    properties = schema.get("properties", {})
    for name, text in descriptions.items():
        if name in properties:
            properties[name]["description"] = text
