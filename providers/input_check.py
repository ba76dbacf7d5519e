"""What `episodic providers check` verifies of a model without spending: that every input
name a profile configures (the prompt, seed and reference image inputs, the constant
``inputs``) is an input of the model's published schema, with the close matches of a
mistyped one (`difflib`)."""

from __future__ import annotations

import difflib
from typing import Any

from episodic.core.errors import ProviderConfigError
from episodic.providers.profiles import Profile


def configured_inputs(profile: Profile) -> list[str]:
    """Every input name the profile sends, in the order a reader finds them in the file."""
    names = [profile.prompt_input, profile.seed_input, profile.reference_image_input]
    names += list(profile.inputs)
    return list(dict.fromkeys(name for name in names if name is not None))


def check_inputs(profile: Profile, properties: dict[str, Any], where: str) -> list[str]:
    """The configured input names, all in `properties` (the model's input schema); else
    `ProviderConfigError` naming each unknown one and its close matches, in one line."""
    names = configured_inputs(profile)
    known = [name for name in properties if isinstance(name, str)]
    unknown = [name for name in names if name not in properties]
    if unknown:
        parts = []
        for name in unknown:
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(shown(c) for c in close)}?)" if close else ""
            parts.append(f"{name!r}{hint}")
        field = "input" if len(unknown) == 1 else "inputs"
        raise ProviderConfigError(
            f"profile {profile.id!r}: {field} {'; '.join(parts)} not in {where}'s input "
            f"schema (it takes: {_listed(known)})"
        )
    return names


def input_properties(schema: object, name: str = "Input") -> dict[str, Any] | None:
    """``components.schemas[name].properties`` of an OpenAPI document, or None."""
    found: object = schema
    for key in ("components", "schemas", name, "properties"):
        found = found.get(key) if isinstance(found, dict) else None
    return found if isinstance(found, dict) else None


def request_properties(schema: object, path: str) -> dict[str, Any] | None:
    """The properties of the JSON body ``POST path`` takes in an OpenAPI document (its
    ``$ref`` into ``components.schemas`` followed), or None. A document whose one POST with a
    body is under another path (an alias of the endpoint) is read there."""
    paths = schema.get("paths") if isinstance(schema, dict) else None
    if not isinstance(paths, dict):
        return None
    posts = {name: op.get("post") for name, op in paths.items() if isinstance(op, dict)}
    bodies = [
        name for name, post in posts.items() if isinstance(post, dict) and post.get("requestBody")
    ]
    if path not in bodies and len(bodies) == 1:
        path = bodies[0]
    found: object = posts.get(path)
    for key in ("requestBody", "content", "application/json", "schema"):
        found = found.get(key) if isinstance(found, dict) else None
    if isinstance(found, dict) and isinstance(found.get("$ref"), str):
        ref = found["$ref"]
        if not ref.startswith("#/components/schemas/"):
            return None
        return input_properties(schema, ref.removeprefix("#/components/schemas/"))
    properties = found.get("properties") if isinstance(found, dict) else None
    return properties if isinstance(properties, dict) else None


def shown(text: str) -> str:
    """Text from a provider's reply as a message may show it: printable, at most 60."""
    return "".join(char for char in text[:60] if char.isprintable())


def _listed(names: list[str]) -> str:
    shown_names = [shown(name) for name in sorted(names)[:30]]
    more = ", ..." if len(names) > 30 else ""
    return ", ".join(shown_names) + more if shown_names else "nothing"
