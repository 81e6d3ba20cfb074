"""The built-in framework plugins, in the order they are consulted: the one table naming them (each plugin's
module imports nothing of its framework). The package registers them when it is imported
(`inloop_eval/__init__.py`); `inloop_eval.frameworks.register_framework` adds a user's own ahead of them."""

from inloop_eval.frameworks import Framework
from inloop_eval.integrations.hf import plugin as hf
from inloop_eval.integrations.lightning import plugin as lightning
from inloop_eval.integrations.megatron import plugin as megatron
from inloop_eval.integrations.olmo_core import plugin as olmo_core
from inloop_eval.integrations.torchtitan import plugin as torchtitan

BUILT_IN: tuple[Framework, ...] = (
    hf.FRAMEWORK,
    olmo_core.FRAMEWORK,
    torchtitan.FRAMEWORK,
    megatron.FRAMEWORK,
    lightning.FRAMEWORK,
)
