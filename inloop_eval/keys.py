"""Every metric key, in every key style, decided here and nowhere else.

Evaluators return bare figure names per label (`acc`, `ce`, `failed`); the orchestrator turns them into keys
with `figure_key`, the way OLMo-core's evaluator callback records `f"{prefix}/{evaluator}/{figure}"`:

- `inloop` style (ours): `<prefix>/<kind>/<label>/<figure>`, e.g. `eval/downstream/piqa/acc_norm`,
  `eval/lm/c4/ppl`; a suite average (`suite_average:` in the config) `<prefix>/suite/<label>/centered_acc`
  (and `_stderr`). No spaces, so the keys sort and filter well on W&B.
- a framework's style (its plugin's `key_style`, `inloop_eval.frameworks`; chosen by `key_style: <framework>`):
  the figures that framework's own evaluator also reports take the key it gives them, so that a run moving
  from it continues its curves; every other figure keeps its `inloop` key. A style is asked, figure by figure,
  for its key of a figure of a label measuring a source (a downstream label's task id; a perplexity label
  itself), and answers None for figures it does not name.

`prefix` is `eval` for the in-loop evaluation (a trainer may record merged weights under `eval/merged`).
"""

from __future__ import annotations

from inloop_eval.errors import ConfigError
from inloop_eval.frameworks import frameworks

PREFIX = "eval"
# The kind of each evaluator, the second part of its keys.
DOWNSTREAM = "downstream"
PERPLEXITY = "lm"
# Not an evaluator: the orchestrator's averages over named tasks (`EvaluatorConfig.suite_average`).
SUITE = "suite"
# The figure every evaluator reports, set to 1, for a label whose evaluation failed.
FAILED = "failed"


def seconds_key(prefix: str = PREFIX) -> str:
    """The wall time of one evaluation, added by `run_and_log`: `<prefix>/seconds`."""
    return f"{prefix}/seconds"


def tokens_key(prefix: str = PREFIX) -> str:
    """The tokens one evaluation forwarded, added by `run_and_log`: `<prefix>/tokens_forwarded`."""
    return f"{prefix}/tokens_forwarded"


def interval_key(prefix: str = PREFIX) -> str:
    """The wall time from the end of the previous evaluation to the start of this one, added by
    `run_and_log` in a training loop: the training between them (and whatever else the loop did),
    `<prefix>/interval_seconds`."""
    return f"{prefix}/interval_seconds"


SECONDS_KEY = seconds_key()
TOKENS_KEY = tokens_key()
INTERVAL_KEY = interval_key()
# The training loss a run logs beside its evaluations (the demo does), drawn by the report.
TRAIN_LOSS_KEY = "train/loss"
def kind_prefix(kind: str, prefix: str = PREFIX) -> str:
    """`<prefix>/<kind>/`: what every key of one kind of evaluator starts with, e.g. `eval/downstream/`."""
    return f"{prefix}/{kind}/"


def figure_key(kind: str, label: str, figure: str, prefix: str = PREFIX) -> str:
    """Our key of one figure: `<prefix>/<kind>/<label>/<figure>`, e.g. `eval/lm/c4/ppl`."""
    return f"{kind_prefix(kind, prefix)}{label}/{figure}"


def suite_outcomes_label(label: str) -> str:
    """The label a suite average's per-document outcomes are filed under, beside the tasks' labels (which
    a `suite/` prefix cannot clash with: a task label has no '/' unless it is a harness file path)."""
    return f"{SUITE}/{label}"


def split_key(key: str, kind: str, prefix: str = PREFIX) -> tuple[str, str] | None:
    """(label, figure) of our key `key` of evaluator kind `kind`; None for any other key. A label may hold
    '/' (a harness task id), the figure never does."""
    head = kind_prefix(kind, prefix)
    if not key.startswith(head):
        return None
    label, _, figure = key[len(head) :].rpartition("/")
    return (label, figure) if label and figure else None


def failed_labels(metrics: dict[str, float], prefix: str = PREFIX) -> list[str]:
    """`<kind>/<label>` of every evaluator label that reported `failed = 1` in `metrics`, in key order."""
    head = f"{prefix}/"
    return [
        key[len(head) : -len(FAILED) - 1]
        for key, value in metrics.items()
        if key.startswith(head) and key.endswith(f"/{FAILED}") and value
    ]


class KeyStyle:
    """How one style names keys: `inloop` (ours) names none itself; a framework's style (a subclass in its
    plugin) overrides `key` and `owns`."""

    name = "inloop"

    def key(self, kind: str, source: str, figure: str, prefix: str) -> str | None:
        """The style's key of `figure` of a label of evaluator kind `kind` measuring `source`; None: ours."""
        return None

    def owns(self, key: str) -> bool:
        """Whether `key` is one this style names (rather than ours)."""
        return False


INLOOP = KeyStyle()


def key_styles() -> dict[str, KeyStyle]:
    """Every key style by name: ours, then each registered framework's."""
    styles = {INLOOP.name: INLOOP}
    for plugin in frameworks():
        style = plugin.style()
        if style is not None:
            styles.setdefault(plugin.name, style)
    return styles


def key_style_names() -> tuple[str, ...]:
    """The names `key_style:` takes: `inloop` and each framework that declares a style (no style imported)."""
    return (INLOOP.name, *(plugin.name for plugin in frameworks() if plugin.key_style))


def key_style(name: str) -> KeyStyle:
    """The key style called `name`; ConfigError naming the known ones otherwise."""
    styles = key_styles()
    if name not in styles:
        raise ConfigError(f"key_style: expected one of {sorted(styles)}, found {name!r}")
    return styles[name]


def metric_keys(
    kind: str,
    figures: dict[str, dict[str, float]],
    sources: dict[str, str],
    style: KeyStyle,
    prefix: str = PREFIX,
) -> dict[str, float]:
    """One evaluator's figures (label -> {figure: value}) under their keys: `<prefix>/<kind>/<label>/<figure>`,
    or the style's key for the figures it names (`sources`: what each label measures, the label itself when
    absent)."""
    metrics: dict[str, float] = {}
    for label, values in figures.items():
        source = sources.get(label, label)
        for figure, value in values.items():
            key = style.key(kind, source, figure, prefix)
            metrics[key if key is not None else figure_key(kind, label, figure, prefix)] = value
    return metrics
