"""The OLMo-core callback refuses a pipeline-parallel train module when the trainer is built, naming what to
do instead, rather than failing at its first evaluation (`train_module.model` raises for one): built for real
on CPU (degree 1, two stages on one rank, under torchrun)."""

from __future__ import annotations

import json

from workers.launch import REPO, launch


def test_the_callback_refuses_a_pipeline_train_module_at_build(tmp_path) -> None:
    out = tmp_path / "result.json"
    launch(
        1,
        [str(REPO / "tests" / "support" / "workers" / "olmo_core_pipeline.py"), "--out", str(out)],
        timeout=180,
    )
    result = json.loads(out.read_text())
    assert result["train_module"] == "TransformerPipelineTrainModule" and result["stages"] == 2
    assert "TransformerPipelineTrainModule (pipeline parallel)" in result["error"]
    assert "PipelineAdapter" in result["error"]
