"""The approval form's prompts block (`episodic.flows.approval.form.prompts_details`): one collapsed
HTML block, every prompt escaped: the form names videos and shows prompts on demand, not
item ids and hashes."""

from __future__ import annotations

from episodic.flows.approval.form import prompts_details
from episodic.pipeline.preview import PlanTexts
from tests.images import episode_image as image


def test_each_prompt_is_shown_once_escaped_in_one_collapsed_block() -> None:
    parts = [image("v01", 1), image("v01", 2)]
    hostile = "a cat </details><img src=x onerror=alert(1)>\n\n# not a heading"
    texts = PlanTexts(
        {"v01": "One"}, {parts[0].idempotency_key: hostile, parts[1].idempotency_key: "dog"}
    )
    block = prompts_details(parts, texts)
    assert block == (
        "<details><summary>Prompts</summary>"
        "<p><code>v01.p1</code> a cat &lt;/details&gt;&lt;img src=x onerror=alert(1)&gt; "
        "# not a heading</p><p><code>v01.p2</code> dog</p></details>"
    )
    assert "\n" not in block  # one line: Markdown ends the HTML block at the next blank line


def test_hero_candidates_share_their_prompt_and_no_prompt_gives_no_block() -> None:
    candidates = [image("v03", 0, 1), image("v03", 0, 2)]
    texts = PlanTexts({}, {c.idempotency_key: "hero of c" for c in candidates})
    assert prompts_details(candidates, texts) == (
        "<details><summary>Prompt</summary><p><code>v03.c1, v03.c2</code> hero of c</p></details>"
    )
    assert prompts_details(candidates, PlanTexts({}, {})) == ""
