"""The approval form's schema, through the validator the Prefect server runs before a run
resumes (`prefect.utilities.schema_tools.validate`, the resume endpoint's own call): what it
refuses, and that the reason a person reads is words, not a regex.

A blank reviewer must not read "' ' does not match '\\\\S'", and a rejection without a note or
a name with a control character must not pass the server: the run would resume, come back
from a worker and only then suspend again with the reason, tens of seconds later."""

from __future__ import annotations

from typing import Any

import pytest
from prefect.utilities.schema_tools.validation import ValidationError, validate

from episodic.core.records import EpisodeImage
from episodic.flows.approval.form import ApprovalInput, approval_input_for

OK = [
    {"decision": "approve", "reviewer": "ann"},
    {"decision": "approve", "reviewer": "Ann-Marie O'Neil", "note": ""},
    {"decision": "reject", "reviewer": "bob", "note": "too dark\nand blurry"},
    {"decision": "approve", "reviewer": "Zoë 山田"},
]
REFUSED = [
    ({"decision": "approve", "reviewer": " "}, "reviewer", "a name, not only spaces"),
    ({"decision": "approve", "reviewer": ""}, "reviewer", "a name, not only spaces"),
    ({"decision": "approve", "reviewer": "ann\x07"}, "reviewer", "without control characters"),
    ({"decision": "approve", "reviewer": "ann\u202e"}, "reviewer", "without control characters"),
    ({"decision": "approve", "reviewer": "ann\tbob"}, "reviewer", "without control characters"),
    ({"decision": "reject", "reviewer": "bob", "note": " \n"}, "note", "a rejection needs one"),
    ({"decision": "reject", "reviewer": "bob"}, "", "'note' is a required property"),
    ({"decision": "approve", "reviewer": "a", "note": "x\x1b[2J"}, "note", "control characters"),
]


def _check(answer: dict[str, Any], schema: dict[str, Any]) -> str | None:
    try:
        validate(answer, schema, raise_on_error=True)
    except ValidationError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("answer", OK)
def test_answers_people_give_pass_the_server(answer: dict[str, Any]) -> None:
    assert _check(answer, ApprovalInput.model_json_schema()) is None


@pytest.mark.parametrize(("answer", "field", "words"), REFUSED)
def test_bad_answers_are_refused_before_resuming_in_words(
    answer: dict[str, Any], field: str, words: str
) -> None:
    reason = _check(answer, ApprovalInput.model_json_schema())
    assert reason is not None and words in reason, reason
    assert "does not match" not in reason  # no regex shown to a person
    if field:
        assert f"for field {field!r}" in reason


def test_the_hero_form_keeps_the_rules() -> None:
    outputs = [
        EpisodeImage(
            f"k{n}", "v01", 0, n, 1, None, "0" * 64, None, None, f"/img/c{n}.png", f"r{n}", 4, "USD"
        )
        for n in (1, 2)
    ]
    schema = approval_input_for(outputs).model_json_schema()
    assert _check({"decision": "approve", "reviewer": "ann", "pick_1": 2}, schema) is None
    reason = _check({"decision": "reject", "reviewer": "ann", "pick_1": 1}, schema)
    assert reason is not None and "'note' is a required property" in reason, reason
    reason = _check({"decision": "reject", "reviewer": " ", "pick_1": 1, "note": "x"}, schema)
    assert reason is not None and "a name, not only spaces" in reason, reason


def test_answers_the_schema_passes_are_still_checked_by_decide() -> None:
    """The server's rules are a first line: `decide` refuses the same after the resume."""
    from episodic.core.errors import InvalidInput
    from episodic.pipeline.approval import validate_person

    with pytest.raises(InvalidInput):
        validate_person("ann\u200b", "reviewer")  # not printable, yet no control character
