"""Tasks defined by lm-evaluation-harness YAML files (`harness:<path>`): loading, the bounded Jinja
sandbox, the task class and suites (`task`)."""
