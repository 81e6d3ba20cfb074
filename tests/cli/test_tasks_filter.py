"""`inloop-eval tasks [PATTERN]`: every id, or those matching a pattern, then how many and how to filter."""

from __future__ import annotations

from inloop_eval.cli.main import main


def test_a_pattern_lists_the_ids_containing_it_and_says_how_many(capsys):
    assert main(["tasks"]) == 0
    everything = capsys.readouterr().out.splitlines()
    total = int(everything[-1].split()[0])
    assert everything[-1] == (
        f"{total} tasks; `inloop-eval tasks PATTERN` lists those whose id contains PATTERN (e.g. mmlu)"
    )
    assert main(["tasks", "mmlu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ids = [line.split()[0] for line in lines[1:-1] if not line.startswith(" ")]
    assert ids and all("mmlu" in i for i in ids) and "mmlu_mc" in ids
    assert lines[-1].startswith(f"{len(ids)} of {total} tasks match 'mmlu'")
    assert "`inloop-eval tasks` lists all" in lines[-1]
    assert len(lines) < len(everything) / 2


def test_a_pattern_with_wildcards_matches_whole_ids(capsys):
    assert main(["tasks", "ARC_*_MC"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:-1] if not line.startswith(" ")] == [
        "arc_challenge_mc",
        "arc_easy_mc",
    ]
    assert main(["tasks", "nosuch"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("0 of ")
