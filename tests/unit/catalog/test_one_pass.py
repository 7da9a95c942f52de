"""``catalog check`` in one pass: every independent error of a file at once, compiler-style.

Each catalog here breaks several stages at once (a value's type, the security policy, a
section's shape, the references between sections); one load must report them all with
their lines, so an operator fixes the file in one round. A later check is skipped only
where it cannot run on what an earlier one refused.
"""

from __future__ import annotations

from .conftest import Load, where


def errors(result: object) -> list[tuple[int, str, str]]:
    from llmgw.core.catalog import LoadResult

    assert isinstance(result, LoadResult)
    out = []
    for d in result.errors:
        line, path = where(d)
        out.append((line, path, d.message))
    return out


def test_a_shape_error_hides_neither_the_policy_nor_the_other_sections_nor_the_references(load: Load) -> None:
    result = load(
        """
        models:
          bad:
            profiles:
              - engine: vllm
                source: org/model
                tp: "x"
                args: ["--trust-remote-code"]
          ok:
            profiles: [{engine: sim}]
        aliases:
          a: nothere
          b: [1]
          c: b
        fallbacks:
          ok: [nope, bad]
        guard_policies:
          p: {judge: ok, models: [ok], on_error: sometimes}
          q: {judge: nobody, models: [bad]}
        """
    )
    found = errors(result)
    assert [(line, path) for line, path, _ in found] == [
        (6, "models.bad.profiles[0].tp"),
        (7, "models.bad.profiles[0].args[0]"),
        (11, "aliases.a"),
        (12, "aliases.b"),
        (15, "fallbacks.ok[0]"),
        (17, "guard_policies.p.on_error"),
        (18, "guard_policies.q.judge"),
    ], "\n".join(map(str, found))
    messages = [message for _, _, message in found]
    assert "expected an integer" in messages[0]
    assert "--trust-remote-code is refused" in messages[1]
    assert 'unknown model "nothere"' in messages[2]
    assert "expected text, got a list" in messages[3]
    assert 'unknown model "nope"' in messages[4]  # and none for "bad", whose shape failed
    assert '"sometimes" is not one of' in messages[5]
    assert 'unknown model "nobody"' in messages[6]  # c names b, which stands though broken: no error


def test_references_wait_for_a_models_section_that_cannot_be_read(load: Load) -> None:
    result = load(
        """
        models: [m]
        aliases:
          a: m
          b: [1]
        """
    )
    # Every alias would be "unknown" against no models: only what can be known is said.
    assert [(line, path) for line, path, _ in errors(result)] == [(1, "models"), (4, "aliases.b")]
