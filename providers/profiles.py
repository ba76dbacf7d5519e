"""Provider profiles: which provider, how much it costs, where its credential comes from.

Built in: ``fake`` (the deterministic fake provider). More profiles come from a YAML file,
``EPISODIC_PROVIDERS_FILE`` (default ``$EPISODIC_HOME/providers.yaml``)::

    profiles:
      replicate-sdxl:
        kind: http
        base_url: https://images.example.com/v1
        credential_env: IMAGE_API_TOKEN        # or credential_secret_block: image-api-token
        price: {per_image: "0.05"}             # see "Prices" below
        currency: USD
        max_concurrency: 4                     # jobs in flight at once, every run and machine
        max_job_s: 60                          # the longest one job runs at the provider
        timeout_s: 30
        idempotent_create: false               # see below
        lookup: true

A profile names where its credential lives; it never contains the credential itself.

What an ``http`` profile promises about its provider (the engine's handling of an unknown
create outcome follows it, see ``episodic.providers.base.Capabilities``):

- ``idempotent_create`` (default false): the provider honours the ``Idempotency-Key`` header on
  create, so sending the same create again never makes a second job. Declare it only when the
  provider documents it; false means an unknown outcome is never answered by sending again;
- ``lookup`` (default true): the provider looks a job up by the client reference it carries
  (``GET /predictions?client_reference=...``); false leaves unknown outcomes to an operator
  unless ``idempotent_create`` is set.

Prices (``price``, decimal strings of up to six decimals, in ``currency``; `core.pricing`)::

    price: {per_image: "0.003"}
    price: {per_megapixel: "0.025", whole_megapixels: true, at_most: "1.05"}
    price: {per_second: "0.000725", at_most: "20"}

``per_megapixel`` is charged on the stored image's real pixel size (``whole_megapixels``:
every started megapixel, fal's rule), ``per_second`` on the compute time the provider reports
for the job (only kinds whose API reports one: `MEASURES_COMPUTE`). ``at_most`` is the upper
bound an image takes before it is paid (megapixels; seconds, default ``max_job_s``): what
``--plan``, the caps and the budgets reserve. A megapixel price's bound is raised to the size
the profile's inputs ask for, known before buying (``width`` and ``height`` inputs, fal's
``image_size`` presets and ``{width, height}`` object: `episodic.providers.prices.known_size`; the
inputs are read by `episodic.providers.model_inputs`). A charge above the bound pauses the
run (`episodic.pipeline.prices`). ``failed: free | billed`` says whether a job that ends failed or
cancelled is billed; by default as the kind's provider documents it (`bills_failures`). A
price of 0 needs ``free: true``. The older ``cost_per_image_minor: 5`` (whole cents per
image) still means exactly that.

The builtin ``fake`` profile ignores both: the fake provider declares its own (it honours
idempotency and can look jobs up).

A ``replicate`` profile may set ``lookup_by_input: true`` (default false): a prediction whose
create reply was lost is then looked for by its exact input. Replicate's predictions carry
nothing that names the installation that sent them, so set it only when no other
installation (a staging beside production) uses the same account for this model: otherwise
one installation could adopt, collect and cancel the other's prediction (docs/providers.md).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from episodic.core.documents import DocumentError, WholeInt, parse_yaml, read_text
from episodic.core.errors import ProviderConfigError
from episodic.core.money import MAX_IMAGE_COST_MICROS, micros_from_minor, parse_money
from episodic.core.pricing import MILLION, Basis, Price
from episodic.providers.model_inputs import (
    INPUT_NAME,
    InputValue,
    check_for_kind,
    check_values,
    size_objects,
)
from episodic.providers.prices import PriceSpec, known_size

if TYPE_CHECKING:
    from episodic.core.settings import Settings

PROFILE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # as a playlist's provider_profile
# Replicate: owner/name; fal: owner/app with an optional subpath (fal-ai/flux/dev)
MODEL_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}(/[A-Za-z0-9][A-Za-z0-9._-]{0,99}){1,3}$"
MAX_PROFILES_BYTES = 1_000_000
# The kinds whose API reports a job's compute time (a per_second price needs it): the fake
# and our http protocol (``metrics.predict_time``), Replicate (``metrics.predict_time``),
# fal (``metrics.inference_time`` in the COMPLETED status).
MEASURES_COMPUTE = frozenset({"fake", "http", "replicate", "fal"})


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    kind: Literal["fake", "http", "replicate", "fal"]
    price: PriceSpec | None = None
    # the older form: whole minor units (cents) of `currency` per image
    cost_per_image_minor: WholeInt | None = Field(
        default=None, ge=0, le=MAX_IMAGE_COST_MICROS // 10_000, strict=True
    )
    free: bool = Field(default=False, strict=True)  # a price of 0 is meant
    currency: str = Field(default="USD", pattern="^[A-Z]{3}$")
    max_concurrency: WholeInt = Field(default=4, ge=1, le=256, strict=True)
    base_url: str | None = Field(default=None, min_length=1, max_length=2048)
    # fal only: where an endpoint's OpenAPI schema is read (`providers check`), default fal's
    schema_url: str | None = Field(default=None, min_length=1, max_length=2048)
    credential_env: str | None = Field(default=None, pattern="^[A-Z_][A-Z0-9_]*$")
    # a Prefect block document name: lowercase letters, digits and dashes
    credential_secret_block: str | None = Field(default=None, pattern="^[a-z0-9-]{1,128}$")
    timeout_s: float = Field(default=30.0, gt=0, le=600, strict=True, allow_inf_nan=False)
    poll_interval_s: float = Field(default=1.0, gt=0, le=60, strict=True, allow_inf_nan=False)
    # The longest one job runs at the provider, in seconds: a job whose sender stopped
    # following it (interrupted, killed, left for later collection) keeps its provider
    # slot until it is collected or this long after it was sent.
    max_job_s: WholeInt = Field(default=60, ge=1, le=86400, strict=True)
    delay_ms: WholeInt | None = Field(default=None, ge=0, le=3_600_000, strict=True)
    idempotent_create: bool = Field(default=False, strict=True)  # `"yes"` is not true
    lookup: bool = Field(default=True, strict=True)
    # replicate and fal: the model, its inputs, and how far back a lookup looks
    model: str | None = Field(default=None, pattern=MODEL_ID)
    version: str | None = Field(default=None, pattern="^[0-9a-f]{64}$")  # replicate only
    inputs: dict[str, InputValue] = Field(default_factory=dict, max_length=32)
    prompt_input: str = Field(default="prompt", pattern=INPUT_NAME)
    seed_input: str | None = Field(default="seed", pattern=INPUT_NAME)  # None: no seed
    reference_image_input: str | None = Field(default=None, pattern=INPUT_NAME)
    lookup_window_s: WholeInt = Field(default=3600, ge=60, le=86400, strict=True)
    # replicate only: find a prediction whose create reply was lost by its exact input. Its
    # predictions carry nothing of ours, so this is true only when no other installation
    # (staging beside production) sends this model's predictions from the same account
    lookup_by_input: bool = Field(default=False, strict=True)

    # the file's inputs, read strictly (`providers.model_inputs`): a size object first, then
    # the type check, then names and values
    _size_objects = field_validator("inputs", mode="before")(size_objects)
    _constant_inputs = field_validator("inputs")(check_values)

    @model_validator(mode="after")
    def _priced(self) -> Profile:
        if (self.price is None) == (self.cost_per_image_minor is None):
            raise ValueError(
                'price: give one price, e.g. price: {per_image: "0.003"} (or the older '
                "cost_per_image_minor), not both and not neither"
            )
        unit = self.unit_micros
        if unit == 0 and not self.free:
            raise ValueError(
                "price: 0 would let every cap and budget pass whatever the provider bills; "
                "declare free: true if this provider really charges nothing"
            )
        if unit != 0 and self.free:
            raise ValueError("free: true with a price above 0; keep one")
        if self.kind == "fal" and self.price is not None and self.price.failed == "billed":
            raise ValueError(
                "price.failed: fal bills successful outputs only; a failed request is never "
                "billed (docs/providers.md)"
            )
        if self.basis == "per_second" and self.kind not in MEASURES_COMPUTE:
            raise ValueError(
                f"price: per_second needs the job's compute time, which the {self.kind} API "
                "does not report; use per_image or per_megapixel"
            )
        return self

    @property
    def basis(self) -> Basis:
        return "per_image" if self.price is None else self.price.basis

    @property
    def unit_micros(self) -> int:
        if self.price is None:
            assert self.cost_per_image_minor is not None
            return micros_from_minor(self.cost_per_image_minor)
        return self.price.unit_micros

    @property
    def bills_failures(self) -> bool:
        """Whether a job that ends failed or cancelled at the provider is billed: the price's
        ``failed`` when given, else the kind's documented rule (docs/providers.md): fal bills
        successful outputs only; Replicate bills its official models (per image, per
        megapixel) by output and its hardware-time models (per second) for the time a job
        ran, failed or cancelled; the fake and the http protocol bill failures."""
        if self.price is not None and self.price.failed is not None:
            return self.price.failed == "billed"
        if self.kind == "fal":
            return False
        if self.kind == "replicate":
            return self.basis == "per_second"
        return True

    @property
    def known_size(self) -> tuple[int, int, str] | None:
        """The image size the profile's constant inputs ask for (`prices.known_size`)."""
        return known_size(self.kind, dict(self.inputs))

    @property
    def pricing(self) -> Price:
        """The price as the engine charges it (`episodic.core.pricing.Price`). A megapixel price's
        bound is the larger of ``at_most`` and the size its inputs ask for (`known_size`):
        what the image is known to take before it is bought."""
        if self.basis == "per_image":
            bound = 1
        elif self.basis == "per_second":
            at_most = self.price.at_most if self.price is not None else None
            bound = parse_money(at_most) if at_most is not None else self.max_job_s * MILLION
        else:  # megapixels, as pixels
            assert self.price is not None and self.price.at_most is not None
            bound = parse_money(self.price.at_most)
            known = self.known_size
            if known is not None:
                bound = max(bound, known[0] * known[1])
        return Price(self.basis, self.unit_micros, self.currency, bound)

    @property
    def price_text(self) -> str:
        """'0.003 USD per image', '0.025 USD per started megapixel (at most 1.05)'."""
        from episodic.core.money import format_money

        per = {
            "per_image": "per image",
            "per_megapixel": "per megapixel",
            "per_whole_megapixel": "per started megapixel",
            "per_second": "per second of compute",
        }[self.basis]
        return f"{format_money(self.unit_micros, self.currency)} {per}"

    @property
    def estimate_basis_text(self) -> str:
        """What one call is estimated on: '1 image at 0.003 USD', 'at most 2 started
        megapixels at 0.025 USD (image_size square_hd (1024x1024))'."""
        from decimal import Decimal

        from episodic.core.money import format_money

        price = self.pricing
        # pixels / 10^6 (megapixels), microseconds / 10^6 (seconds): '1', '1.05', '20'
        bound = f"{Decimal(price.estimate_quantity).scaleb(-6).normalize():f}"
        if price.basis == "per_whole_megapixel":
            bound = str(-(-price.estimate_quantity // MILLION))
        s = "" if bound == "1" else "s"
        each = {
            "per_image": "1 image",
            "per_megapixel": f"at most {bound} megapixel{s}",
            "per_whole_megapixel": f"at most {bound} started megapixel{s}",
            "per_second": f"at most {bound} second{s} of compute",
        }[price.basis]
        known = self.known_size
        raised = known is not None and known[0] * known[1] == price.estimate_quantity
        sized = (
            f" ({known[2]})" if known is not None and raised and "megapixel" in price.basis else ""
        )
        return f"{each} at {format_money(self.unit_micros, self.currency)}{sized}"

    def estimate_text(self, calls: int) -> str:
        """What ``--plan`` says of `calls` paid calls: an estimate, with its basis and bound
        ('estimated 0.075 USD: 3 x at most 1 started megapixel at 0.025 USD')."""
        from episodic.core.money import format_money

        total = format_money(calls * self.pricing.estimate_micros, self.currency)
        return (
            f"estimated {total}: {calls} x {self.estimate_basis_text} (an estimate: each image "
            "is charged on what it really is)"
        )

    @model_validator(mode="after")
    def _fits_its_kind(self) -> Profile:
        if self.kind in ("replicate", "fal"):
            if self.model is None:
                raise ValueError(f"a {self.kind} profile needs model (e.g. {_EXAMPLE[self.kind]})")
            if self.kind == "replicate" and self.model.count("/") != 1:
                raise ValueError(
                    f"model: a replicate model is owner/name (e.g. {_EXAMPLE['replicate']})"
                )
            if not self.needs_credential:
                raise ValueError(
                    f"a {self.kind} profile needs credential_env or credential_secret_block"
                )
            declared = {"idempotent_create", "lookup"} & self.model_fields_set
            if declared:
                raise ValueError(
                    f"{', '.join(sorted(declared))}: a {self.kind} profile does not declare "
                    "this; the adapter states what the API promises (docs/providers.md)"
                )
            per_item = (self.prompt_input, self.seed_input, self.reference_image_input)
            check_for_kind(self.kind, self.inputs, [n for n in per_item if n is not None])
        if self.schema_url is not None and self.kind != "fal":
            raise ValueError("schema_url: only a fal profile has one")
        if self.version is not None and self.kind != "replicate":
            raise ValueError("version: only a replicate profile has one")
        if self.lookup_by_input and self.kind != "replicate":
            raise ValueError(
                "lookup_by_input: only a replicate profile finds jobs by their input "
                "(the others find them by our reference, or not at all)"
            )
        if self.lookup_by_input and self.seed_input is None:
            raise ValueError(
                "lookup_by_input: the model takes no seed, so inputs do not tell ours apart"
            )
        if self.kind in ("fake", "http") and (
            self.model is not None or self.inputs or self.reference_image_input is not None
        ):
            raise ValueError(
                f"model, inputs and reference_image_input: a {self.kind} profile has none"
            )
        return self

    @field_validator("base_url", "schema_url")
    @classmethod
    def _http_origin(cls, value: str | None) -> str | None:
        """An http(s) URL with a host and nothing that could carry a secret or a surprise
        (user:password@, control characters); other schemes (file:, ftp:) never reach a
        provider."""
        if value is None:
            return None
        if any(ord(char) < 0x21 or ord(char) == 0x7F for char in value):
            raise ValueError("must not contain spaces or control characters")
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        if parts.query or parts.fragment or "?" in value or "#" in value:
            raise ValueError("must not carry a query or a fragment (API paths are added to it)")
        try:
            port = parts.port  # out of range: ValueError
            _ = httpx.URL(value).host  # a host IDNA cannot read: an error here, not later
        except (ValueError, httpx.InvalidURL, UnicodeError):
            raise ValueError("must have a valid host name and port") from None
        if port == 0:
            raise ValueError("must have a valid host name and port")
        if parts.username or parts.password:
            raise ValueError("must not carry a user or password (use credential_env)")
        return value

    @property
    def needs_credential(self) -> bool:
        return self.credential_env is not None or self.credential_secret_block is not None


BUILTIN = {
    "fake": Profile(id="fake", kind="fake", price=PriceSpec(per_image="0.04"), max_concurrency=8),
}


def configured_profiles(settings: Settings) -> dict[str, Profile]:
    """The profiles this installation's settings name: the built-in ones and those of
    ``EPISODIC_PROVIDERS_FILE``, which must exist when given (a mistyped path is refused, not
    read as "only the built-in profiles"); the default ``$EPISODIC_HOME/providers.yaml`` may
    be absent."""
    return load_profiles(settings.providers_path, required=settings.providers_file is not None)


def load_profiles(path: Path | None, *, required: bool = False) -> dict[str, Profile]:
    """The built-in profiles and those of the YAML file `path` (absent: none, unless
    `required`: then `ProviderConfigError`, exit 2; a dangling symlink always is)."""
    profiles = dict(BUILTIN)
    try:
        if path is not None and required and not path.is_file():
            raise ProviderConfigError(
                f"EPISODIC_PROVIDERS_FILE: {path} does not exist or is not a file (unset it "
                "for the state folder's providers.yaml; `episodic init` writes one)"
            )
        if path is None or not path.exists():
            if path is not None and path.is_symlink():  # dangling: refused, not "no file"
                raise ProviderConfigError(f"{path}: a symlink to a missing file; fix or remove it")
            return profiles
        raw = parse_yaml(read_text(path, max_bytes=MAX_PROFILES_BYTES))
    except (DocumentError, OSError) as exc:  # OSError: exists() on a name too long, ...
        raise ProviderConfigError(f"{path}: invalid provider profiles: {exc}") from None
    if raw is None:
        return profiles
    listed = raw.get("profiles") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or set(raw) - {"profiles"} or not isinstance(listed, dict | None):
        raise ProviderConfigError(
            f"{path}: invalid provider profiles: expected a mapping `profiles:` of profile ids "
            "to their fields, and nothing else"
        )
    for profile_id, fields in (listed or {}).items():
        if not isinstance(profile_id, str) or not PROFILE_ID.fullmatch(profile_id):
            raise ProviderConfigError(
                f"{path}: profile {_shown(profile_id)}: a profile id is 1 to 64 letters, digits, "
                "'_', '.' or '-', starting with a letter or digit"
            )
        if not isinstance(fields, dict) or not all(isinstance(k, str) for k in fields):
            raise ProviderConfigError(
                f"{path}: profile {profile_id!r}: expected a mapping of field names to values"
            )
        try:
            profiles[profile_id] = Profile(id=profile_id, **fields)
        except ValidationError as exc:  # name the profile, the field and what it must be
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"])
            message = " ".join(str(first["msg"]).removeprefix("Value error, ").split())
            named = f"field {_clipped(field)}: " if field else ""  # else the text names it
            raise ProviderConfigError(f"{path}: profile {profile_id!r}: {named}{message}") from None
    return profiles


_EXAMPLE = {"replicate": "black-forest-labs/flux-schnell", "fal": "fal-ai/flux/dev"}


def _shown(value: object) -> str:
    return _clipped(repr(value))


def _clipped(text: str) -> str:
    return text if len(text) <= 64 else f"{text[:60]}…"


def get_profile(profiles: dict[str, Profile], profile_id: str) -> Profile:
    try:
        return profiles[profile_id]
    except KeyError:
        raise ProviderConfigError(
            f"unknown provider profile {profile_id!r} (known: {', '.join(sorted(profiles))})"
        ) from None
