"""``index.html`` from a report's data: one self-contained page, no script, no fetched resource.

At the top the run's summary, each requirement's state and each page's counts; below, every
page of specs/ with its clauses coloured by state (proved green, broken red, unproven amber,
not run grey) and each clause's tests with their outcomes. The filter buttons are radio
inputs styled by CSS, so the page works with JavaScript off.
"""

from __future__ import annotations

import re
from html import escape
from typing import Any

STATES = ("proved", "broken", "unproven", "not_run")
LABEL = {"proved": "proved", "broken": "broken", "unproven": "unproven", "not_run": "not run",
         "passed": "passed", "failed": "failed", "skipped": "skipped", "xfailed": "xfailed",
         "xpassed": "xpassed"}
KIND = {"seed": "seed requirement", "context": "context", "own": "our own", "decision": "decision"}
CODE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
REFERENCE_DEFINITION = re.compile(r"^\[[^\]]+\]:\s.*$\n?", re.M)
CITED = re.compile(r"\[([A-Z][A-Z0-9-]*(?:\.\d+)?)\]")

CSS = """
:root { --proved:#1a7f37; --broken:#cf222e; --unproven:#b35900; --not_run:#6e7781;
  --proved-bg:#dafbe1; --broken-bg:#ffebe9; --unproven-bg:#fff1d6; --not_run-bg:#eef1f4; }
* { box-sizing:border-box; }
body { font:15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin:0; color:#1f2328; }
header, main { max-width:1180px; margin:0 auto; padding:0 20px; }
header { padding-top:18px; }
h1 { font-size:24px; margin:0 0 6px; }
h2 { font-size:19px; margin:28px 0 8px; border-bottom:1px solid #d0d7de; padding-bottom:4px; }
h3 { font-size:16px; margin:18px 0 6px; }
code, pre { font:12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; }
a { color:#0550ae; text-decoration:none; } a:hover { text-decoration:underline; }
.line { font-size:16px; font-weight:600; margin:8px 0; }
.muted { color:#59636e; font-size:13px; }
.bar { display:flex; height:12px; border-radius:6px; overflow:hidden; margin:8px 0 14px; background:#eef1f4; }
.bar span { display:block; }
.bar .proved, .dot.proved { background:var(--proved); } .bar .broken, .dot.broken { background:var(--broken); }
.bar .unproven, .dot.unproven { background:var(--unproven); } .bar .not_run, .dot.not_run { background:var(--not_run); }
.dot { display:inline-block; width:11px; height:11px; border-radius:50%; vertical-align:-1px; margin-right:4px; }
.badge { display:inline-block; font-size:12px; font-weight:600; padding:0 7px; border-radius:10px;
  color:#fff; white-space:nowrap; }
.badge.proved, .badge.passed { background:var(--proved); } .badge.broken, .badge.failed { background:var(--broken); }
.badge.unproven, .badge.skipped, .badge.xfailed, .badge.xpassed { background:var(--unproven); }
.badge.not_run { background:var(--not_run); }
table { border-collapse:collapse; width:100%; font-size:14px; }
th, td { text-align:left; padding:4px 8px; border-bottom:1px solid #eaeef2; vertical-align:top; }
th { font-size:12px; text-transform:uppercase; color:#59636e; }
td.n { text-align:right; font-variant-numeric:tabular-nums; width:64px; }
td.n.zero { color:#c4cad1; }
tr.kind td { background:#f6f8fa; font-weight:600; font-size:13px; }
a.proved { color:var(--proved); } a.broken { color:var(--broken); } a.unproven { color:var(--unproven); }
a.not_run { color:var(--not_run); }
.filters { position:sticky; top:0; background:#fff; padding:8px 0; border-bottom:1px solid #d0d7de; z-index:1; }
.filters label { cursor:pointer; border:1px solid #d0d7de; border-radius:14px; padding:2px 10px; margin-right:4px;
  font-size:13px; display:inline-block; }
input.filter { position:absolute; opacity:0; pointer-events:none; }
#f-all:checked ~ header label[for=f-all], #f-proved:checked ~ header label[for=f-proved],
#f-broken:checked ~ header label[for=f-broken], #f-unproven:checked ~ header label[for=f-unproven],
#f-not_run:checked ~ header label[for=f-not_run] { background:#1f2328; color:#fff; border-color:#1f2328; }
#f-proved:checked ~ main .clause:not(.proved), #f-broken:checked ~ main .clause:not(.broken),
#f-unproven:checked ~ main .clause:not(.unproven), #f-not_run:checked ~ main .clause:not(.not_run) { display:none; }
#f-proved:checked ~ main .group:not(:has(.clause.proved)), #f-broken:checked ~ main .group:not(:has(.clause.broken)),
#f-unproven:checked ~ main .group:not(:has(.clause.unproven)),
#f-not_run:checked ~ main .group:not(:has(.clause.not_run)) { display:none; }
.clause { border-left:5px solid var(--not_run); background:var(--not_run-bg); padding:6px 10px; margin:6px 0;
  border-radius:0 4px 4px 0; }
.clause.proved { border-color:var(--proved); background:var(--proved-bg); }
.clause.broken { border-color:var(--broken); background:var(--broken-bg); }
.clause.unproven { border-color:var(--unproven); background:var(--unproven-bg); }
.clause .head { font-weight:600; } .clause .head a.id { color:#1f2328; margin-right:6px; }
.clause ul { margin:4px 0 0; padding-left:18px; } .clause li { margin:2px 0; }
.tests code { word-break:break-all; }
pre.failure { background:#fff; border:1px solid #ffcecb; padding:6px 8px; margin:4px 0; white-space:pre-wrap;
  max-height:220px; overflow:auto; }
.opening { background:#f6f8fa; padding:6px 10px; border-radius:4px; margin:4px 0 8px; }
"""


def inline(text: str) -> str:
    """Markdown's inline code and links as HTML (the rest of the words as they are)."""
    return CODE.sub(r"<code>\1</code>", escape(LINK.sub(r"\1", text), quote=False))


def opening(text: str, ids: set[str]) -> str:
    """A group's opening: its prose, its cited clauses (``[DEC-6]``) linked within the page,
    and its reference definitions (the links for a Markdown reader) dropped."""
    html = inline(REFERENCE_DEFINITION.sub("", text).strip())
    return CITED.sub(lambda m: f'<a href="#{m[1]}">{m[1]}</a>' if m[1] in ids else m[0], html)


def _anchor(key: str) -> str:
    return "g-" + re.sub(r"[^A-Za-z0-9]+", "-", key).strip("-").lower()


def _bar(tally: dict[str, int]) -> str:
    total = sum(tally.values()) or 1
    spans = "".join(f'<span class="{state}" style="width:{100 * tally[state] / total:.2f}%" '
                    f'title="{tally[state]} {LABEL[state]}"></span>' for state in STATES if tally[state])
    return f'<div class="bar">{spans}</div>'


def _counts(tally: dict[str, int]) -> str:
    return "".join(f'<td class="n{" zero" if not tally[state] else ""}">{tally[state]}</td>' for state in STATES)


def _decision_links(ids: list[str]) -> str:
    return ", ".join(f'<a href="#{escape(cid)}">{escape(cid)}</a>' for cid in ids)


def _test(test: dict[str, Any]) -> str:
    runs = test["runs"]
    outcome = test["outcome"]
    parts = [f'<span class="badge {outcome}">{LABEL[outcome]}</span> <code>{escape(test["nodeid"])}</code>']
    if runs:
        parts.append(f' <span class="muted">{test["duration_seconds"]:.2f} s</span>')
    if not test["listed"]:
        parts.append(' <span class="muted">(marked, not listed on its page)</span>')
    if outcome == "not_run":
        parts.append(' <span class="muted">not run in this selection</span>')
    body = []
    shown = runs if len(runs) > 1 else []
    for run in shown:
        body.append(f'<li><span class="badge {run["outcome"]}">{LABEL[run["outcome"]]}</span> '
                    f'<code>{escape(run["nodeid"].removeprefix(test["nodeid"]))}</code> '
                    f'<span class="muted">{run["duration_seconds"]:.2f} s</span>{_detail(run)}</li>')
    detail = _detail(runs[0]) if len(runs) == 1 else ""
    nested = f"<ul>{''.join(body)}</ul>" if body else ""
    return f"<li>{''.join(parts)}{detail}{nested}</li>"


def _detail(run: dict[str, Any]) -> str:
    if run["reason"]:
        return f' <span class="muted">— {escape(run["reason"])}</span>'
    failure = run["failure"]
    if failure:
        where = f"{failure['phase']} · {failure['location']}\n" if failure["location"] else f"{failure['phase']}\n"
        return f'<pre class="failure">{escape(where + chr(10).join(failure["lines"]))}</pre>'
    return ""


def _clause(clause: dict[str, Any]) -> str:
    state = clause["state"]
    decisions = (f' <span class="muted">· decisions: {_decision_links(clause["decisions"])}</span>'
                 if clause["decisions"] else "")
    tests = "".join(_test(test) for test in clause["tests"])
    return (f'<div class="clause {state}" id="{escape(clause["id"])}">'
            f'<div class="head"><a class="id" href="#{escape(clause["id"])}">{escape(clause["id"])}</a>'
            f'<span class="badge {state}">{LABEL[state]}</span> {inline(clause["words"])}</div>'
            f'<div class="muted">{KIND[clause["kind"]]} · {escape(clause["page"])}:{clause["line"]}{decisions}</div>'
            f'<ul class="tests">{tests}</ul></div>')


def render(report: dict[str, Any]) -> str:
    """The whole page for one report (``report.json``'s content)."""
    summary = report["summary"]
    run = report["run"]
    clauses = {clause["id"]: clause for clause in report["clauses"]}
    tally = {state: summary[state] for state in STATES}
    out = ['<!doctype html><html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>Specification: {escape(summary['line'])}</title><style>{CSS}</style></head><body>"]
    out += [f'<input class="filter" type="radio" name="f" id="f-{state}"{" checked" if state == "all" else ""}>'
            for state in ("all", *STATES)]
    out.append("<header><h1>The specification, clause by clause</h1>")
    out.append(f'<div class="line">{escape(summary["line"])}</div>{_bar(tally)}')
    args = " ".join(run.get("args", [])) or "(no arguments)"
    out.append(f'<div class="muted">generated {escape(report["generated_at"])} · pytest {escape(args)} · '
               f'{run.get("tests_run", 0)} test runs in {run.get("duration_seconds", 0):.1f} s · exit status '
               f'{run.get("exit_status", "?")}</div>')
    out.append('<div class="filters">show: <label for="f-all">all</label>'
               + "".join(f'<label for="f-{state}"><span class="dot {state}"></span>{LABEL[state]} '
                         f"({tally[state]})</label>" for state in STATES) + "</div></header><main>")
    if report["problems"]:
        items = "".join(f"<li>{escape(problem)}</li>" for problem in report["problems"])
        out.append(f'<h2>Problems in the map</h2><ul class="muted">{items}</ul>')
    out.append('<h2>Requirements</h2><table><tr><th>requirement</th><th>page</th><th>decisions</th>'
               + "".join(f"<th>{LABEL[state]}</th>" for state in STATES) + "</tr>")
    kind = None
    for requirement in report["requirements"]:
        if requirement["kind"] != kind:
            kind = requirement["kind"]
            out.append(f'<tr class="kind"><td colspan="7">{KIND[kind]}</td></tr>')
        state = requirement["state"]
        out.append(f'<tr><td><span class="dot {state}" title="{LABEL[state]}"></span>'
                   f'<a class="{state}" href="#{_anchor(requirement["key"])}">{inline(requirement["title"])}</a></td>'
                   f'<td>{escape(requirement["page"])}</td><td>{_decision_links(requirement["decisions"])}</td>'
                   f'{_counts(requirement["counts"])}</tr>')
    out.append("</table><h2>Pages</h2><table><tr><th>page</th>"
               + "".join(f"<th>{LABEL[state]}</th>" for state in STATES) + "</tr>")
    for page in report["pages"]:
        state = page["state"]
        out.append(f'<tr><td><span class="dot {state}"></span><a class="{state}" href="#{_anchor(page["page"])}">'
                   f'{escape(page["page"])}</a> <span class="muted">{inline(page["title"])}</span></td>'
                   f'{_counts(page["counts"])}</tr>')
    out.append("</table>")
    for page in report["pages"]:
        out.append(f'<h2 id="{_anchor(page["page"])}"><span class="dot {page["state"]}"></span>'
                   f'{escape(page["page"])} — {inline(page["title"])}</h2>')
        for requirement in (r for r in report["requirements"] if r["page"] == page["page"]):
            anchor = _anchor(requirement["key"])
            named = f'<a id="{escape(requirement["id"])}"></a>' if requirement["id"] else ""
            out.append(f'<section class="group"><h3 id="{anchor}">{named}<span class="dot {requirement["state"]}">'
                       f'</span>{inline(requirement["title"])}</h3>')
            if requirement["id"] and requirement["opening"]:
                out.append(f'<div class="opening">{opening(requirement["opening"], set(clauses))}</div>')
            out += [_clause(clauses[cid]) for cid in requirement["clauses"]]
            out.append("</section>")
    out.append("</main></body></html>\n")
    return "".join(out)
