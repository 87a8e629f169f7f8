"""World-model fidelity: how well a world model predicts real outcomes (``docs/world-model.md``).

* :mod:`.cases`: the case file (JSON lines: a script, its task, the trajectory so far and its real
  outcome), which anchors write during training and ``wmrl eval world-model`` reads;
* :mod:`.metrics`: pure functions (status@1, status@2, reward MAE and bias by real rung,
  exception-class match, confusion matrix, reliability, latency);
* :mod:`.recorder`: the training side (the case file on the checkpoint volume and the rolling figures);
* :mod:`.curate`: few-shot examples picked from real cases;
* :mod:`.measure`: a backend graded on cases, case by case (latency included);
* :mod:`.report` and :mod:`.plots`: Markdown, JSON and the PNGs;
* :mod:`.cli`: ``wmrl eval world-model``.
"""
