"""Lightning's trainer hook: `callback` (`InLoopEvalCallback`, a `lightning.pytorch.Callback`); the model is
scored by the adapter its family picks (`engine/families.py`); `plugin` declares it (`inloop_eval.frameworks`). docs/hf_lightning.md shows the set-up."""
