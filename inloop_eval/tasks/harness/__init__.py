"""Tasks defined by lm-evaluation-harness YAML files (`harness:<path>`, `register_harness_tasks`).

- `loader`: reading a YAML file, `include:` merging, `!function` references (both only from the named folder);
- `sandbox`: the Jinja sandbox templates render in, with the work, sizes and time of each rendering bounded;
- `bounds`: the size limits of a rendering and the checks that refuse an operation before it allocates;
- `regex_filter`: the `regex_replace` filter, its patterns and inputs bounded so that it cannot backtrack long;
- `local_files`: checks of local data files (`dataset_path: json|csv|parquet|arrow`) before they are read;
- `task`: `HarnessYamlTask`, one multiple-choice task rendered as the harness renders it;
- `suite`: a file or folder of tasks and groups, the `harness:` resolver and `register_harness_tasks`.
"""
