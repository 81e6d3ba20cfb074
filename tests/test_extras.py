"""The extras install together in any order: `pip install 'inloop_eval[hf]'` then `'inloop_eval[olmo-core]'` (or
the other way round, or both at once) leaves a transformers that imports.

Why a cap: OLMo-core depends on `cached_path`, which pins `huggingface-hub<2.0`, and transformers 5.25.0 is
the first release that needs `huggingface-hub>=2.4` (5.24.0 takes `>=1.31,<3`). Without a cap, `[hf]`
installs transformers 5.25 with hub 2.x; installing `[olmo-core]` afterwards downgrades hub below 2 and
transformers then fails to import (`inloop-eval evaluate` exits 2). Resolving each extra in a fresh virtual
environment is minutes of downloads, too slow for the suite, so this reads pyproject.toml instead: every
extra that names transformers caps it below the first release needing huggingface-hub 2. (Checked with
`pip install --dry-run --ignore-installed --report` of `.[hf]`, `.[olmo-core]` and `.[hf,olmo-core]` in a fresh
virtual environment: transformers 5.24.0 each time it is installed, beside huggingface-hub 1.x with OLMo-core.)
"""

from __future__ import annotations

import pytest
from helpers import REPO
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

# The first transformers release whose huggingface-hub requirement excludes hub 1.x (it needs >=2.4).
FIRST_NEEDING_HUB_2 = "5.25.0"
LAST_TAKING_HUB_1 = "5.24.0"


def transformers_requirements() -> dict[str, Requirement]:
    """extra -> its transformers requirement, for every extra of pyproject.toml that names transformers."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    found = {}
    for extra, requirements in extras.items():
        for text in requirements:
            requirement = Requirement(text)
            if requirement.name == "transformers":
                found[extra] = requirement
    return found


def test_every_extra_naming_transformers_keeps_it_compatible_with_olmo_cores_hub_pin():
    found = transformers_requirements()
    assert {"hf", "dev"} <= set(found), found
    for extra, requirement in found.items():
        assert not requirement.specifier.contains(FIRST_NEEDING_HUB_2), f"[{extra}] {requirement}: cap it below 5.25"
        assert requirement.specifier.contains(LAST_TAKING_HUB_1), f"[{extra}] {requirement}"


def test_the_olmo_core_extra_is_the_one_whose_hub_pin_the_cap_is_for():
    """The cap is for OLMo-core's `cached_path`; the extra that brings it in is still there (drop the cap with
    it, or when OLMo-core moves to huggingface-hub 2)."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(Requirement(text).name == "ai2-olmo-core" for text in extras["olmo-core"])
