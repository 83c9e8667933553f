"""The spec report: a project's specification (a directory of Markdown pages, one ``### ID —
statement`` heading per clause with the tests that prove it) checked clause by clause by a
pytest run, as one self-contained page and its data.

- ``specs``: the one reader of a specs directory (clauses, groups, pages; clause markers read
  from the tests' source);
- ``outcomes``: one test variant's phases folded into one outcome;
- ``report``: a run's report as plain data (``report.json``; its schema: ``report.schema.json``);
- ``render``: ``index.html`` from that data, no script;
- ``plugin``: ``--spec-report DIR``, ``--clause ID``, ``--spec-dir DIR`` and the ini option
  ``scheduler_specs`` (the ``pytest11`` entry point ``scheduler_spec_report``);
- ``python -m harness.spec_report DIR`` rebuilds ``DIR/index.html`` from ``DIR/report.json``.

Nothing here imports the scheduler or the simulation: the plugin is loaded in every pytest run
of a project with the wheel installed.
"""
