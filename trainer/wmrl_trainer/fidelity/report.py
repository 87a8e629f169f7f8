"""The fidelity report as Markdown, from the JSON report ``wmrl eval world-model`` writes."""

from __future__ import annotations

from typing import Any, Optional

from wmrl_trainer.fidelity.metrics import RUNGS


def _num(value: Optional[float], digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _signed(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _seconds(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def headline_rows(arms: list[dict[str, Any]]) -> list[str]:
    rows = ["| arm | cases | graded | ungraded | gated | status@1 | status@2 | reward MAE | reward bias | "
            "exception match | latency p50 | latency p90 |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm in arms:
        s = arm["summary"]
        reward, match, latency = s["reward"]["all"], s["exception_match"], s["latency"]
        exc = f"{match['matched']}/{match['cases']}" + (f" ({match['rate']:.3f})" if match["rate"] is not None else "")
        rows.append(f"| {arm['name']} | {s['cases']} | {s['graded']} | {s['ungraded']} | {s['gated']} | "
                    f"{_num(s['status_at_1'])} | {_num(s['status_at_2'])} | {_num(reward['mae'])} | "
                    f"{_signed(reward['bias'])} | {exc} | {_seconds(latency['p50'])} | {_seconds(latency['p90'])} |")
    return rows


def rung_rows(arms: list[dict[str, Any]]) -> list[str]:
    names = [arm["name"] for arm in arms]
    rows = ["| real rung | cases | " + " | ".join(f"MAE ({n}) | bias ({n})" for n in names) + " |",
            "| --- | --- | " + " | ".join("--- | ---" for _ in names) + " |"]
    for rung in (*RUNGS, "all"):
        cells = [arm["summary"]["reward"].get(rung) for arm in arms]
        if not any(cells):
            continue
        cases = next(c["cases"] for c in cells if c)
        rows.append(f"| {rung} | {cases} | " + " | ".join(
            f"{_num(c['mae']) if c else '-'} | {_signed(c['bias']) if c else '-'}" for c in cells) + " |")
    return rows


def confusion_rows(arm: dict[str, Any]) -> list[str]:
    matrix = arm["summary"]["confusion"]
    rows = ["| real \\ predicted | " + " | ".join(matrix["predicted"]) + " |",
            "| --- | " + " | ".join("---" for _ in matrix["predicted"]) + " |"]
    for name, counts in zip(matrix["real"], matrix["counts"]):
        if sum(counts):
            rows.append(f"| {name} | " + " | ".join(str(c) for c in counts) + " |")
    return rows


def markdown(report: dict[str, Any]) -> str:
    """The whole report: what was measured, the headline figures, reward by rung, confusion, plots, notes."""
    arms = report["arms"]
    lines = [f"# World-model fidelity: {report['backend']}", "",
             f"Cases: {report['cases']} from {', '.join(report['case_files'])}"
             + (f" ({report['excluded']} shown as few-shot examples left out)" if report.get("excluded") else "")
             + f". World model: `{report['world_model_text']}`.", ""]
    lines += headline_rows(arms)
    lines += ["", "status@k: the real status among the top k predictions, over the graded cases; reward error = "
              "predicted - real reward (top prediction); exception match: real runtime errors whose exception class "
              "the top prediction names; ungraded: no usable answer (parse failures, HTTP errors; the backend's "
              "counters below); gated: decided by the compile gate without a model call; latency: per case, the "
              "compile gate's cases apart.", "", "## Reward error by real rung", ""]
    lines += rung_rows(arms)
    for arm in arms:
        lines += ["", f"## Confusion matrix: {arm['name']}", ""]
        lines += confusion_rows(arm)
        if arm.get("stats"):
            lines += ["", "Backend counters: " + ", ".join(f"{k} {v}" for k, v in sorted(arm["stats"].items()))]
    lines += ["", "## Plots", ""]
    for name, path in report.get("plots", {}).items():
        lines.append(f"![{name}]({path})")
    if report.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {note}" for note in report["notes"]]
    return "\n".join(lines) + "\n"
