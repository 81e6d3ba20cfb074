"""Domain sets: config checks, bytes per token, memmap and text sources, the token cache, bad input, and
`inloop-eval data make-lm` / `evaluate` with both evaluator types."""

from __future__ import annotations

import importlib
import json
import math
import sysconfig
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO
from lm_helpers import DOCS, SEQ_LEN, reference_memmap, tiny_gpt

from inloop_eval.cli import main
from inloop_eval.data.perplexity.domain_config import LMDomainConfig
from inloop_eval.data.perplexity.domain_set import load_memmap_domain, load_text_domain, select_under_cap
from inloop_eval.data.perplexity.token_bytes import token_byte_lengths
from inloop_eval.data.root import neox_tokenizer_path
from inloop_eval.data.tokenizer import Tokenizer
from inloop_eval.errors import ConfigError, LMDataError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.downstream import TaskEvalConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.evaluators.perplexity import LMEvalConfig
from inloop_eval.tasks import get_task

# --- config -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"label": "", "paths": ["a"]}, "`label` is required"),
        ({"label": "Code", "paths": ["a"]}, "lower-case without spaces"),
        ({"label": "web/en", "paths": ["a"]}, "without spaces or '/'"),
        ({"label": "code", "paths": []}, "`paths` must list files or globs"),
        ({"label": "code", "paths": ["a"], "format": "parquet"}, "format must be one of"),
        ({"label": "code", "paths": ["a"], "dtype": "int8"}, "dtype must be one of"),
        ({"label": "code", "paths": ["a"], "text_field": ""}, "text_field must not be empty"),
        ({"label": "code", "paths": ["a"], "max_tokens": 0}, "max_tokens must be an integer >= 1 or null"),
    ],
)
def test_lm_domain_config_checks(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LMDomainConfig(**kwargs)


CODE = {"label": "code", "paths": ["a.npy"]}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"type": "downstream", "domains": [CODE]}, "type must be 'lm'"),
        ({"domains": []}, "`domains` must list at least one domain"),
        ({"domains": [CODE, CODE]}, r"domain labels must be unique; repeated: \['code'\]"),
        ({"domains": [CODE], "seq_len": 1}, "seq_len must be an integer >= 2"),
        ({"domains": [CODE], "seq_len": 64, "batch_tokens": 32}, "batch_tokens .32. must be >= seq_len .64."),
        ({"domains": [CODE], "seq_len": 64, "max_tokens": 10}, r"max_tokens \(10\) must be >= seq_len - 1"),
        ({"domains": [{**CODE, "max_tokens": 10}], "seq_len": 64}, r"'code': max_tokens \(10\)"),
        ({"domains": [{**CODE, "bogus": 1}]}, r"domains\[0\] \(code\): unknown keys \['bogus'\]"),
    ],
)
def test_lm_eval_config_checks(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LMEvalConfig(**kwargs)


def test_config_dispatches_on_type_and_round_trips():
    data = {
        "evaluators": [
            {"task": "piqa"},
            {
                "type": "lm",
                "seq_len": 8,
                "batch_tokens": 64,
                "domains": [{"label": "code", "paths": "x/*.npy"}],
            },
        ]
    }
    config = EvaluatorConfig.from_dict(data)
    task, lm = config.evaluators
    assert isinstance(task, TaskEvalConfig) and isinstance(lm, LMEvalConfig)
    assert lm.domains[0].paths == ["x/*.npy"]  # a single string becomes a list
    assert EvaluatorConfig.from_dict(config.to_dict()) == config
    twice = {"evaluators": [data["evaluators"][1], data["evaluators"][1]]}
    with pytest.raises(ConfigError, match=r"lm domain labels must be unique across `lm` evaluators"):
        EvaluatorConfig.from_dict(twice)


def test_shipped_lm_config_loads():
    config = EvaluatorConfig.from_yaml(REPO / "configs" / "lm_domains.yaml")
    kinds = [type(e) for e in config.evaluators]
    assert TaskEvalConfig in kinds and LMEvalConfig in kinds
    for ev in config.evaluators:
        if isinstance(ev, TaskEvalConfig):
            get_task(ev.task)
        else:
            assert [d.label for d in ev.domains] == ["code", "books"]


# --- bytes per token ----------------------------------------------------------------------------------


def test_byte_table_counts_the_bytes_of_real_text(neox_tokenizer):
    table = token_byte_lengths(neox_tokenizer)
    assert len(table) == neox_tokenizer.vocab_size
    assert table[0] == 0 and table[1] == 0  # <|endoftext|> and <|padding|> are special
    code = Path(json.__file__).read_text()
    for text in [*DOCS, code, "tabs\t\tand   runs of spaces          end\n\n\n", "émoji 🙂🙃 ∑ 中文"]:
        text = unicodedata.normalize("NFC", text)  # the tokenizer's normaliser
        assert int(table[neox_tokenizer.encode(text)].sum()) == len(text.encode("utf-8")), text[:40]


def test_byte_table_of_a_sentencepiece_vocabulary():
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models

    vocab = {"<unk>": 0, "<s>": 1, "▁the": 2, "<0x0A>": 3, "é": 4, "cat": 5}
    backend = Backend(models.WordLevel(vocab, unk_token="<unk>"))
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    backend.add_special_tokens(["<unk>", "<s>"])
    tokenizer = Tokenizer(backend, bos_token_id=1, eos_token_id=None, fingerprint="sentencepiece-test")
    assert token_byte_lengths(tokenizer).tolist() == [0, 0, 4, 1, 2, 3]  # "▁the" is " the"; <0x0A> one byte


# --- memmap domains -----------------------------------------------------------------------------------


def test_memmap_sequences_across_files(tmp_path, neox_tokenizer):
    table = token_byte_lengths(neox_tokenizer)
    rng = np.random.default_rng(0)
    a = rng.integers(0, 50000, 100).astype(np.uint16)
    b = rng.integers(0, 50000, 47).astype(np.uint16)  # 2 sequences of 20, 7 tokens unused
    c = rng.integers(0, 50000, 40).astype(np.uint32)
    a.tofile(tmp_path / "a.npy")
    b.tofile(tmp_path / "b.npy")
    np.save(tmp_path / "c.npy", c)  # a header naming its own dtype
    domain = load_memmap_domain(LMDomainConfig(label="x", paths=[str(tmp_path / "*.npy")]), 20, table, None)
    expected = [a[i : i + 20] for i in range(0, 100, 20)] + [b[:20], b[20:40], c[:20], c[20:]]
    assert len(domain) == len(expected) == 9
    for s, seq in enumerate(expected):
        assert domain.sequence(s).tolist() == seq.tolist()
        assert domain.bytes_S[s] == table[seq[1:].astype(np.int64)].sum()
    assert domain.n_tokens == 9 * 19
    assert domain.describe(6) == f"label 'x' file {tmp_path / 'b.npy'} sequence 1"
    assert domain.max_token_id == max(int(x.max()) for x in (a, b[:40], c))

    wide = rng.integers(0, 50000, 60).astype(np.uint32)
    wide.tofile(tmp_path / "wide.bin")
    config = LMDomainConfig(label="x", paths=[str(tmp_path / "wide.bin")], dtype="uint32")
    assert load_memmap_domain(config, 20, table, None).sequence(2).tolist() == wide[40:].tolist()


def test_cap_takes_whole_sequences_the_same_way_every_time():
    length_S = np.array([10, 3, 7, 10, 2, 10, 5, 9])
    keep = select_under_cap(length_S, 20)
    assert (length_S[keep] - 1).sum() <= 20 and len(keep) >= 2
    assert keep.tolist() == sorted(keep.tolist()) == select_under_cap(length_S, 20).tolist()
    assert select_under_cap(length_S, None).tolist() == list(range(8))
    assert select_under_cap(length_S, 10_000).tolist() == list(range(8))


# --- text domains -------------------------------------------------------------------------------------


class CountingTokenizer:
    """The real tokenizer, counting how many texts it encodes."""

    def __init__(self, inner):
        self.inner = inner
        self.encoded = 0

    def encode_batch(self, texts):
        self.encoded += len(texts)
        return self.inner.encode_batch(texts)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_text_windows_predict_every_token_once(tmp_path, neox_tokenizer):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"body": t}) + "\n" for t in DOCS) + "\n")
    config = LMDomainConfig(label="prose", paths=[str(path)], format="jsonl", text_field="body")
    domain = load_text_domain(
        config, 16, neox_tokenizer, token_byte_lengths(neox_tokenizer), None, tmp_path / "c"
    )
    for d, text in enumerate(DOCS):
        windows = [domain.sequence(s) for s in range(len(domain)) if domain.item_S[s] == d]
        assert windows[0][0] == neox_tokenizer.eos_token_id and all(len(w) <= 16 for w in windows)
        predicted = np.concatenate([w[1:] for w in windows]).tolist()
        assert predicted == neox_tokenizer.encode(text)
        mine = domain.item_S == d
        assert domain.bytes_S[mine].sum() == len(text.encode("utf-8"))
        assert (domain.bytes_S[mine] >= 0).all()
    assert domain.describe(0) == f"label 'prose' file {path} document 0"


def test_text_cache_is_built_once_and_follows_the_files(tmp_path, neox_tokenizer):
    (tmp_path / "src").mkdir()
    for i, text in enumerate(DOCS):
        (tmp_path / "src" / f"{i}.txt").write_text(text)
    config = LMDomainConfig(label="notes", paths=[str(tmp_path / "src" / "*.txt")], format="text")
    table = token_byte_lengths(neox_tokenizer)
    tokenizer = CountingTokenizer(neox_tokenizer)
    first = load_text_domain(config, SEQ_LEN, tokenizer, table, None, tmp_path / "cache")
    assert tokenizer.encoded == len(DOCS)
    again = load_text_domain(config, SEQ_LEN, tokenizer, table, None, tmp_path / "cache")
    assert tokenizer.encoded == len(DOCS)  # read from the cache
    assert again.bytes_S.tolist() == first.bytes_S.tolist()
    assert sum(first.bytes_S) == sum(len(t.encode()) for t in DOCS)
    (tmp_path / "src" / "0.txt").write_text("Changed text, a little longer than before.")
    load_text_domain(config, SEQ_LEN, tokenizer, table, None, tmp_path / "cache")
    assert tokenizer.encoded == 2 * len(DOCS)
    assert len(list((tmp_path / "cache").iterdir())) == 2


# --- bad input: each a clear error naming the label and the file -------------------------------------


def memmap(label, path, seq_len=20, dtype="uint16"):
    config = LMDomainConfig(label=label, paths=[str(path)], dtype=dtype)
    return lambda table: load_memmap_domain(config, seq_len, table, None)


def jsonl(label, path):
    config = LMDomainConfig(label=label, paths=[str(path)], format="jsonl")
    return lambda table, tokenizer, cache: load_text_domain(config, 20, tokenizer, table, None, cache)


def test_missing_files(tmp_path, neox_tokenizer):
    table = token_byte_lengths(neox_tokenizer)
    with pytest.raises(LMDataError, match=rf"label 'web': file {tmp_path / 'none.npy'} does not exist"):
        memmap("web", tmp_path / "none.npy")(table)
    with pytest.raises(LMDataError, match=r"label 'web': the pattern '.*/\*\*/\*.npy' matches no file"):
        memmap("web", tmp_path / "**" / "*.npy")(table)


def test_file_that_is_not_a_whole_number_of_tokens(tmp_path, neox_tokenizer):
    (tmp_path / "odd.npy").write_bytes(b"\x01" * 101)
    with pytest.raises(
        LMDataError, match=r"label 'web' file .*odd.npy: 101 bytes is not a whole number of uint16"
    ):
        memmap("web", tmp_path / "odd.npy")(token_byte_lengths(neox_tokenizer))
    (tmp_path / "six.npy").write_bytes(b"\x01" * 6)
    with pytest.raises(LMDataError, match=r"six.npy: 6 bytes is not a whole number of uint32 tokens"):
        memmap("web", tmp_path / "six.npy", dtype="uint32")(token_byte_lengths(neox_tokenizer))


def test_token_beyond_the_tokenizers_vocabulary(tmp_path, neox_tokenizer):
    ids = np.arange(40, dtype=np.uint32)
    ids[27] = 60_000
    ids.tofile(tmp_path / "ids.npy")
    with pytest.raises(
        LMDataError,
        match=r"label 'web' file .*ids.npy: sequence 1 holds token id 60000, beyond the tokenizer's vocabulary "
        r"of 50280",
    ):
        memmap("web", tmp_path / "ids.npy", dtype="uint32")(token_byte_lengths(neox_tokenizer))


def test_empty_labels(tmp_path, neox_tokenizer):
    table = token_byte_lengths(neox_tokenizer)
    np.arange(5, dtype=np.uint16).tofile(tmp_path / "short.npy")
    (tmp_path / "empty.npy").write_bytes(b"")
    with pytest.raises(
        LMDataError, match=r"label 'web': no sequence of seq_len=20 tokens .*short.npy \(5 tokens\)"
    ):
        memmap("web", tmp_path / "*.npy")(table)
    (tmp_path / "blank.jsonl").write_text('\n{"text": ""}\n\n')
    with pytest.raises(LMDataError, match=r"label 'notes': its files hold no text to score: .*blank.jsonl"):
        jsonl("notes", tmp_path / "blank.jsonl")(table, neox_tokenizer, tmp_path / "cache")


def test_malformed_text_files(tmp_path, neox_tokenizer):
    table = token_byte_lengths(neox_tokenizer)
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": oops}\n')
    with pytest.raises(LMDataError, match=r"label 'notes' file .*bad.jsonl line 2: not valid JSON"):
        jsonl("notes", tmp_path / "bad.jsonl")(table, neox_tokenizer, tmp_path / "cache")
    (tmp_path / "field.jsonl").write_text('{"content": "ok"}\n')
    with pytest.raises(LMDataError, match=r"field.jsonl line 1: expected a string field 'text'"):
        jsonl("notes", tmp_path / "field.jsonl")(table, neox_tokenizer, tmp_path / "cache")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    config = LMDomainConfig(label="notes", paths=[str(tmp_path / "latin1.txt")], format="text")
    with pytest.raises(LMDataError, match=r"label 'notes' file .*latin1.txt: not valid UTF-8"):
        load_text_domain(config, 20, neox_tokenizer, table, None, tmp_path / "cache")
    cache = tmp_path / "cache"
    assert not cache.exists() or not any(cache.iterdir())  # failed builds leave nothing behind


# --- the command line ---------------------------------------------------------------------------------


def test_make_lm_from_the_standard_library_and_lambada(tmp_path, data_root, neox_tokenizer, capsys):
    tokenizer = str(neox_tokenizer_path(data_root))
    stdlib_json = Path(sysconfig.get_paths()["stdlib"]) / "json"
    code = [
        "data",
        "make-lm",
        "--label",
        "code",
        "--glob",
        f"{stdlib_json}/**/*.py",
        "--tokenizer",
        tokenizer,
    ]
    assert main([*code, "--out", str(tmp_path), "--tokens-per-file", "4000", "--max-tokens", "0"]) == 0
    manifest = json.loads((tmp_path / "code" / "manifest.json").read_text())
    parts = sorted((tmp_path / "code").glob("part-*.npy"))
    assert len(parts) >= 2 and manifest["dtype"] == "uint16"
    sources = (tmp_path / "code" / "documents.txt").read_text().split()
    assert sorted(sources) == sorted(str(p) for p in stdlib_json.glob("**/*.py"))
    expected = [t for s in sources for t in [*neox_tokenizer.encode(Path(s).read_text()), 0]]
    assert np.concatenate([np.fromfile(p, dtype=np.uint16) for p in parts]).tolist() == expected
    assert "config: - {label: code, paths: [" in capsys.readouterr().out

    books = ["data", "make-lm", "--label", "books", "--oe-eval", "lambada", "--root", str(data_root)]
    assert main([*books, "--format", "jsonl", "--max-tokens", "3000", "--out", str(tmp_path)]) == 0
    lines = [json.loads(x) for x in (tmp_path / "books" / "docs.jsonl").read_text().splitlines()]
    assert 10 < len(lines) < 100 and all(x["source"].startswith("lambada:") for x in lines)

    lm = {
        "type": "lm",
        "seq_len": SEQ_LEN,
        "batch_tokens": 8 * SEQ_LEN,
        "max_tokens": 2000,
        "cache_dir": str(tmp_path / "cache"),
        "domains": [
            {"label": "code", "paths": [str(tmp_path / "code" / "*.npy")]},
            {"label": "books", "paths": [str(tmp_path / "books" / "docs.jsonl")], "format": "jsonl"},
        ],
    }
    evaluator = InLoopEvaluator(EvaluatorConfig(evaluators=[lm], strict=True), tokenizer=neox_tokenizer)
    out = evaluator.run(tiny_gpt())
    assert len(out) == 6 and all(math.isfinite(v) for v in out.values())


def test_make_lm_errors(tmp_path, capsys):
    assert main(["data", "make-lm", "--label", "Code", "--glob", "x", "--out", str(tmp_path)]) == 2
    assert "lower-case" in capsys.readouterr().err
    assert main(["data", "make-lm", "--label", "code", "--out", str(tmp_path)]) == 2
    assert "--glob PATTERN and/or --oe-eval TASK" in capsys.readouterr().err


def test_cli_evaluate_runs_a_config_with_both_types(tmp_path, data_root, neox_tokenizer, hf_model_dir):
    ids = np.asarray(neox_tokenizer.encode(Path(json.__file__).read_text()), dtype=np.uint16)
    ids[: 6 * SEQ_LEN].tofile(tmp_path / "code.npy")
    yaml_config = {
        "evaluators": [
            {"task": "arc_easy", "limit": 4},
            {
                "type": "lm",
                "seq_len": SEQ_LEN,
                "batch_tokens": 1024,
                "cache_dir": str(tmp_path / "cache"),
                "domains": [{"label": "code", "paths": [str(tmp_path / "code.npy")]}],
            },
        ]
    }
    (tmp_path / "config.yaml").write_text(json.dumps(yaml_config))  # JSON is YAML
    results = tmp_path / "results.json"
    argv = ["evaluate", "--config", str(tmp_path / "config.yaml"), "--model", str(hf_model_dir)]
    assert (
        main([*argv, "--output", str(results), "--data-root", str(data_root), "--strict", "--limit", "3"])
        == 0
    )
    metrics = json.loads(results.read_text())["metrics"]
    assert metrics["eval/downstream/arc_easy/n_docs"] == 3
    transformers = importlib.import_module("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_model_dir).eval()
    expected = reference_memmap(
        lambda x: hf(x).logits, [tmp_path / "code.npy"], SEQ_LEN, token_byte_lengths(neox_tokenizer)
    )
    for key, value in expected.items():
        assert metrics[f"eval/lm/code/{key}"] == pytest.approx(value, rel=1e-5), key
