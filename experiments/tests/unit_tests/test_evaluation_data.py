"""Evaluation data: the loaders on the real data, and HumanEval checks and pylint."""

from __future__ import annotations

import functools
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from langchain_tag_experiments.data import DATA_DIR_ENV
from langchain_tag_experiments.evaluation import (
    DataNotFoundError,
    DatasetError,
    HumanEvalProblem,
    ObliQADataset,
    arun_check,
    extract_code,
    load_humaneval,
    load_nba,
    load_obliqa,
    pep8_path,
    pylint_score,
    run_check,
)
from langchain_tag_experiments.evaluation.datasets import load_labelled

from langchain_tag import Rule
from langchain_tag.extraction import extract_rules
from langchain_tag.rules import SourceSpan
from langchain_tag.testing import ExtractionFakeChatModel

requires_data = pytest.mark.requires_data


_load_obliqa = functools.cache(load_obliqa)


@pytest.fixture
def obliqa(data_dir: Path) -> ObliQADataset:
    """The ObliQA sample, loaded once for the module's tests."""
    return _load_obliqa(data_dir)


# --- RuleArena-NBA ------------------------------------------------------------------


@requires_data
def test_nba_matches_the_data_readme(data_dir: Path) -> None:
    nba = load_nba(data_dir)
    assert len(nba.problems) == 131
    assert Counter(p.level for p in nba.problems) == {0: 49, 1: 54, 2: 28}
    assert Counter(p.answer for p in nba.problems) == {True: 107, False: 24}
    assert len(nba.catalogue) == 55
    assert len({rule.tags for rule in nba.catalogue.rules}) == 12
    assert "Article VII" in nba.cba_text
    assert nba.assumptions["salary_cap"] == 140_588_000
    assert "$140,588,000" in nba.assumptions_text()


@requires_data
def test_nba_gold_labels_are_normalised_catalogue_ids(data_dir: Path) -> None:
    nba = load_nba(data_dir)
    catalogue_ids = {rule.rule_id for rule in nba.catalogue.rules}
    raw = [
        json.loads(line)
        for line in (data_dir / "rulearena_nba/problems_dev.jsonl").open()
    ]
    assert (
        sum(len(set(r["relevant_rules"])) < len(r["relevant_rules"]) for r in raw) == 5
    )
    for problem, record in zip(nba.problems, raw, strict=True):
        assert problem.id == record["id"]
        assert set(problem.gold_rule_ids) <= catalogue_ids
        assert len(problem.gold_rule_ids) == len(set(problem.gold_rule_ids))
        assert len(problem.gold_rule_ids) >= 3
    # A spelling variant resolves to its catalogue id.
    assert any(
        "nontaxpayer_mid_level_exception" in r["relevant_rules"]
        and "non_taxpayer_mid_level_exception" in p.gold_rule_ids
        for p, r in zip(nba.problems, raw, strict=True)
    )
    # The two null-mapped labels are dropped and counted.
    assert nba.dropped_labels == {
        "non_taxpayer_mid_level_exception_hard_cap_second_apron_level": 3,
        "taxpayer_mid_level_exception_hard_cap_first_apron_level": 1,
    }


@requires_data
def test_nba_problem_text_and_answer_fields(data_dir: Path) -> None:
    first, *_ = problems = load_nba(data_dir).problems
    assert first.id == "comp_0#001"
    assert first.text.startswith("Team Situations:\nTeam A has a team salary of")
    assert "\n\nPlayer Situations:\n" in first.text
    assert "\n\nOperations:\nA. Team A signs a 3-year contract" in first.text
    assert (first.illegal_operation, first.problematic_team) == ("A", "A")
    legal = [p for p in problems if not p.answer]
    assert legal
    assert all(p.illegal_operation is p.problematic_team is None for p in legal)


@requires_data
def test_nba_catalogue_rules_are_scoreable_rules(data_dir: Path) -> None:
    rule = load_nba(data_dir).catalogue.get(
        "contract_length_at_most_2_year_bi_annual_exception"
    )
    assert rule is not None
    assert rule.name == "Contract length at most 2 year bi annual exception"
    assert rule.condition.startswith("A Player Contract signed using Bi-annual")
    assert rule.condition in rule.action
    assert rule.tags == ("contract length",)


def copy_nba(data_dir: Path, target: Path, *, without: str = "") -> Path:
    shutil.copytree(data_dir / "rulearena_nba", target / "rulearena_nba")
    if without:
        (target / "rulearena_nba" / without).unlink()
    return target


@requires_data
def test_a_missing_nba_file_is_named(data_dir: Path, tmp_path: Path) -> None:
    copy_nba(data_dir, tmp_path, without="problems_dev.jsonl")
    with pytest.raises(DataNotFoundError, match=r"problems_dev.jsonl") as caught:
        load_nba(tmp_path)
    assert DATA_DIR_ENV in str(caught.value)


def test_a_missing_data_directory_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match=DATA_DIR_ENV):
        load_obliqa(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match=r"HumanEval.jsonl.gz"):
        load_humaneval(tmp_path)


@requires_data
def test_an_unknown_gold_label_names_file_and_line(
    data_dir: Path, tmp_path: Path
) -> None:
    copy_nba(data_dir, tmp_path)
    problems = tmp_path / "rulearena_nba/problems_dev.jsonl"
    lines = problems.read_text().splitlines()
    record = json.loads(lines[1])
    record["relevant_rules"].append("no_such_rule")
    lines[1] = json.dumps(record)
    problems.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=r"line 2: .*'no_such_rule'.*aliases"):
        load_nba(tmp_path)


@requires_data
def test_a_violation_without_its_operation_is_rejected(
    data_dir: Path, tmp_path: Path
) -> None:
    copy_nba(data_dir, tmp_path)
    problems = tmp_path / "rulearena_nba/problems_dev.jsonl"
    record = json.loads(problems.read_text().splitlines()[0])
    del record["illegal_operation"]
    problems.write_text(json.dumps(record) + "\n")
    with pytest.raises(DatasetError, match=r"line 1: .*illegal_operation"):
        load_nba(tmp_path)


# --- ObliQA -------------------------------------------------------------------------


@requires_data
def test_obliqa_matches_the_data_readme(data_dir: Path) -> None:
    obliqa = load_obliqa(data_dir)
    assert len(obliqa.units) == 767
    assert Counter(u.document_id for u in obliqa.units) == {
        19: 192,
        30: 142,
        31: 101,
        33: 139,
        34: 115,
        36: 78,
    }
    assert len(obliqa.questions) == 491
    sizes = Counter(len(q.gold_unit_ids) for q in obliqa.questions)
    assert sizes[1] == 354
    assert max(sizes) == 5
    units = {u.unit_id for u in obliqa.units}
    assert all(set(q.gold_unit_ids) <= units for q in obliqa.questions)


@requires_data
def test_obliqa_passages_are_documents_with_unit_ids(obliqa: ObliQADataset) -> None:
    passages = obliqa.passages
    assert len(passages) == 767
    first = passages[0]
    assert first.id == first.metadata["unit_id"] == "19:1)"
    assert first.metadata["document_id"] == 19
    assert first.metadata["passage_id"] == "1)"
    assert first.page_content.startswith("INTRODUCTION\nThis Guidance is issued")


@requires_data
def test_obliqa_documents_hold_every_passage_at_its_offsets(
    obliqa: ObliQADataset,
) -> None:
    texts = {str(doc.id): doc.page_content for doc in obliqa.documents}
    assert sorted(texts) == [f"obliqa-{n}" for n in (19, 30, 31, 33, 34, 36)]
    for unit in obliqa.units:
        assert texts[f"obliqa-{unit.document_id}"][unit.start : unit.end] == unit.text


@requires_data
def test_the_passage_rulebook_maps_back_to_its_passages(obliqa: ObliQADataset) -> None:
    rulebook = obliqa.passage_rulebook()
    assert len(rulebook) == 767
    assert rulebook.domain == "obliqa-passages"
    for rule in rulebook.rules:
        assert obliqa.units_of_rule(rule) == {rule.rule_id}
        by_span = rule.model_copy(update={"metadata": {}})
        assert obliqa.units_of_rule(by_span) == {rule.rule_id}
    blank = rulebook.get("36:ANNEX")
    assert blank is not None
    assert "has no text" in blank.condition


@requires_data
def test_a_span_across_passages_maps_to_each(obliqa: ObliQADataset) -> None:
    first, second, third = obliqa.units[:3]
    rule = Rule(
        rule_id="R",
        name="Spanning rule",
        condition="c",
        action="a",
        source=SourceSpan(
            document_id="obliqa-19", start=first.end - 5, end=second.start + 1
        ),
    )
    assert obliqa.units_of_rule(rule) == {first.unit_id, second.unit_id}
    inside = rule.model_copy(
        update={
            "source": SourceSpan(
                document_id="obliqa-19", start=third.start + 2, end=third.start + 2
            )
        }
    )
    assert obliqa.units_of_rule(inside) == {third.unit_id}


@requires_data
def test_unmappable_rules_are_refused(obliqa: ObliQADataset) -> None:
    rule = Rule(rule_id="R", name="Elsewhere", condition="c", action="a")
    with pytest.raises(ValueError, match="no source span"):
        obliqa.units_of_rule(rule)
    elsewhere = rule.model_copy(
        update={"source": SourceSpan(document_id="pep-0008", start=0, end=5)}
    )
    with pytest.raises(ValueError, match=r"'pep-0008'.*ObliQADataset.documents"):
        obliqa.units_of_rule(elsewhere)
    with pytest.raises(ValueError, match="not an ObliQA unit"):
        obliqa.units_of_rule(rule.model_copy(update={"metadata": {"unit_id": "99:1"}}))


@requires_data
def test_rules_extracted_from_obliqa_map_to_their_passages(
    obliqa: ObliQADataset,
) -> None:
    document = next(d for d in obliqa.documents if d.id == "obliqa-36")
    rulebook = extract_rules([document], llm=ExtractionFakeChatModel(), checkpoint=None)
    assert len(rulebook) > 20
    units = {u.unit_id: u for u in obliqa.units}
    for rule in rulebook.rules:
        assert rule.source is not None
        assert rule.source.document_id == "obliqa-36"
        mapped = obliqa.units_of_rule(rule)
        assert mapped
        assert any(rule.source_text.split()[0] in units[u].text for u in mapped)


# --- HumanEval ----------------------------------------------------------------------


@requires_data
def test_humaneval_and_pep8_are_all_there(data_dir: Path) -> None:
    problems = load_humaneval(data_dir)
    assert len(problems) == 164
    assert [p.task_id for p in problems[:2]] == ["HumanEval/0", "HumanEval/1"]
    assert problems[0].entry_point == "has_close_elements"
    assert "def check(candidate)" in problems[0].test
    assert pep8_path(data_dir).read_text().count("Programming Recommendations") >= 1


@requires_data
@pytest.mark.parametrize("index", [0, 12, 163])
def test_canonical_solutions_pass(data_dir: Path, index: int) -> None:
    problem = load_humaneval(data_dir)[index]
    result = run_check(problem, problem.canonical_solution)
    assert result.passed, result.error
    # So does the complete function, as an executor writes it.
    assert run_check(problem, problem.prompt + problem.canonical_solution).passed


ADD = HumanEvalProblem(
    task_id="Test/0",
    prompt='def add(a: int, b: int) -> int:\n    """Add two numbers."""\n',
    entry_point="add",
    canonical_solution="    return a + b\n",
    test="def check(candidate):\n    assert candidate(2, 3) == 5\n",
)


def test_a_correct_completion_passes() -> None:
    result = run_check(ADD, ADD.canonical_solution)
    assert result.passed
    assert result.error is None
    assert not result.timed_out


def test_a_wrong_completion_fails_with_the_traceback() -> None:
    result = run_check(ADD, "    return a - b\n")
    assert not result.passed
    assert not result.timed_out
    assert result.error is not None
    assert "AssertionError" in result.error


def test_an_infinite_loop_is_killed_at_the_timeout() -> None:
    result = run_check(ADD, "    while True:\n        pass\n", timeout=1.0)
    assert not result.passed
    assert result.timed_out
    assert result.error == "timed out after 1 s"
    assert 1.0 <= result.seconds < 5


async def test_checks_run_without_blocking_the_loop() -> None:
    passed = await arun_check(ADD, ADD.canonical_solution)
    looping = await arun_check(ADD, "    while True:\n        pass\n", timeout=0.5)
    assert passed.passed
    assert looping.timed_out


def test_extract_code_takes_the_python_block() -> None:
    answer = (
        "<think>```python\nwrong()\n```</think>Here you go:\n"
        "```text\nnot code\n```\n```python\nimport os\n\ndef f():\n    return 1\n```\n"
        "Done."
    )
    assert extract_code(answer) == "import os\n\ndef f():\n    return 1\n"
    assert extract_code("def f():\n    return 1\n") == "def f():\n    return 1\n"
    assert extract_code("```py\ndef g():\n    pass") == "def g():\n    pass\n"


CLEAN = '''"""Arithmetic helpers."""


def add(first: int, second: int) -> int:
    """Return the sum of two integers."""
    return first + second
'''
MESSY = """import os, sys
def Add( a,b ):
  x=1
  return a+b
"""


def test_pylint_scores_clean_code_above_messy_code() -> None:
    assert pylint_score(MESSY) < 5.0
    # Clean code scores 10, with a missing or extra final newlines too.
    assert pylint_score(CLEAN.rstrip("\n")) == 10.0
    assert pylint_score(CLEAN + "\n\n\n") == 10.0


def test_pylint_gives_zero_for_broken_or_missing_code() -> None:
    assert pylint_score("def f(:\n") == 0.0
    assert pylint_score("  \n") == 0.0


# --- a user's labelled inputs (`tag eval custom --inputs`) ----------------------------

LABELLED = (
    '{"input": "I want a refund", "applicable": ["R0"]}\n'
    '{"input": "Café order is late", "applicable": []}\n'
)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"\xef\xbb\xbf" + LABELLED.encode(), id="utf-8-bom"),
        pytest.param(LABELLED.encode("utf-16"), id="utf-16-bom"),
        pytest.param(LABELLED.replace("\n", "\r\n").encode(), id="crlf"),
    ],
)
def test_labelled_inputs_in_utf8_or_marked_utf16_are_read(
    raw: bytes, tmp_path: Path
) -> None:
    # Before: a UTF-8 byte-order mark was "line 1 is not valid JSON".
    path = tmp_path / "in.jsonl"
    path.write_bytes(raw)
    inputs = load_labelled(path)
    assert [(i.id, i.input) for i in inputs] == [
        ("line-1", "I want a refund"),
        ("line-2", "Café order is late"),
    ]


@pytest.mark.parametrize(
    ("encoding", "expected"),
    [
        ("latin-1", "is not UTF-8 text (byte 0xe9 at offset 65, line 2)"),
        ("utf-16-le", "is UTF-16LE text, not UTF-8"),
    ],
)
def test_labelled_inputs_in_another_encoding_name_file_and_line(
    encoding: str, expected: str, tmp_path: Path
) -> None:
    # Before: "'utf-8' codec can't decode byte 0xe9 in position 65", no file, no line.
    path = tmp_path / "in.jsonl"
    path.write_bytes(LABELLED.encode(encoding))
    with pytest.raises(DatasetError) as raised:
        load_labelled(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: {expected}")
    assert "save it as UTF-8" in message


@pytest.mark.parametrize(
    ("applicable", "given"),
    [('"R-x"', "the string 'R-x'"), ("7", "7"), ('{"R-x": true}', "an object")],
)
def test_applicable_must_be_a_list_of_rule_ids(
    applicable: str, given: str, tmp_path: Path
) -> None:
    # Before: pydantic's "Input should be a valid tuple", a type JSON does not have.
    path = tmp_path / "in.jsonl"
    path.write_text(
        '{"input": "a", "applicable": []}\n\n'
        f'{{"input": "b", "applicable": {applicable}}}\n',
        encoding="utf-8",
    )
    with pytest.raises(DatasetError) as raised:
        load_labelled(path)
    assert str(raised.value) == (
        f"{path} line 3: applicable: must be a list of rule ids, e.g. "
        f'["R-1", "R-2"], or [] when no rule applies; got {given}.'
    )
