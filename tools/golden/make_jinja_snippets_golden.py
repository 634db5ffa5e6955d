#!/usr/bin/env python3
"""Golden outputs of small Jinja snippets, rendered as transformers renders
chat templates.

What it produces
----------------
``tests/fixtures/golden/chat_templates/snippets.jsonl`` (or ``--out``): one
line per snippet, ``{"template": ..., "variables": {...}, "output": ...}``,
or ``"error": <str(exception)>`` when rendering or parsing raises.

Why
---
loraplex's C++ Jinja subset must behave as jinja2 does for the constructs
chat templates use: whitespace control with trim_blocks / lstrip_blocks,
scoping, loop variables, filters, tests, string methods, Python's str() and
json.dumps output, and errors. The chat-template goldens cover whole
templates; these snippets pin single constructs, corner cases included.

How to regenerate
-----------------
From the repository root::

    python3 -m venv v && v/bin/pip install transformers==5.24.0 \\
        jinja2==3.1.6 && v/bin/python tools/golden/make_jinja_snippets_golden.py

The environment is transformers' own (``_compile_jinja_template``), so
``tojson``, ``raise_exception`` and the loop controls are exactly its.
"""
import argparse
import json
import os

from transformers.utils import chat_template_utils as ctu

SNIPPETS = [
    # Whitespace control.
    ("  {% if true %}\n  x\n  {% endif %}\n  y", {}),
    ("a {% if true %}b{% endif %}\nc", {}),
    ("a\n  {%- if true %} b {% endif -%}  \n\n c", {}),
    ("{{ 'a' }}\n{{- 'b' -}}\n  {{ 'c' }}", {}),
    ("x {# note #}\ny\n  {#- trimmed -#}  z", {}),
    ("line\n{%+ if true %}kept{% endif %}\n", {}),
    ("{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\n", {}),
    ("end\n", {}),
    # Scoping.
    ("{% set c = 0 %}{% for i in range(3) %}{{ c }}{% set c = c + 1 %}{{ c }},"
     "{% endfor %}{{ c }}", {}),
    ("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n"
     " + i %}{% endfor %}{{ ns.n }}", {}),
    ("{% if true %}{% set y = 3 %}{% endif %}{{ y }}", {}),
    ("{% set a, b = [1, 2] %}{{ b }}{{ a }}", {}),
    ("{% set block %}in {{ 1 + 1 }}{% endset %}[{{ block }}]", {}),
    ("{% macro greet(name, p='!') %}hi {{ name }}{{ p }}{% endmacro %}"
     "{{ greet('a') }} {{ greet('b', p='?') }}", {}),
    # Loops.
    ("{% for x in 'abc' %}{{ loop.index }}{{ loop.revindex0 }}{{ x }}"
     "{{ '|' if not loop.last }}{% endfor %}", {}),
    ("{% for x in xs if x > 1 %}{{ loop.index0 }}/{{ loop.length }}:{{ x }} "
     "{% else %}none{% endfor %}", {"xs": [1, 2, 3]}),
    ("{% for x in [] %}a{% else %}empty{% endfor %}", {}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
     {"d": {"b": 1, "a": [1, "x"]}}),
    ("{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "y": 2}}),
    ("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}"
     "{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("{% for i in range(3) %}{{ loop.cycle('a', 'b') }}{% endfor %}", {}),
    ("{% for m in ms %}{{ loop.previtem is defined }}{% endfor %}",
     {"ms": [1, 2]}),
    # Printing values as Python's str().
    ("{{ none }}|{{ true }}|{{ 1.0 }}|{{ 10 / 4 }}|{{ 7 // 2 }}|{{ -7 % 3 }}|"
     "{{ 2 ** 10 }}|{{ 'ab' * 2 }}|{{ 1e20 }}|{{ 0.0001 }}|{{ 1.5e-7 }}", {}),
    ("{{ [1, 'x', none, true, 1.5] }}{{ {'k': \"it's\"} }}", {}),
    ("{{ x }}|{{ d.missing }}|{{ [1][5] }}", {"d": {}}),
    # Operators.
    ("{{ 1 if a else 2 }}{{ 'y' if b }}{{ a and 'z' }}{{ b or 'w' }}",
     {"a": True, "b": False}),
    ("{{ 'ell' in 'hello' }}{{ 3 not in [1, 2] }}{{ 'a' in {'a': 1} }}", {}),
    ("{{ 'a' ~ 1 ~ none }}{{ [1] + [2] }}{{ 1 < 2.5 }}{{ 'b' > 'a' }}", {}),
    ("{{ -x|abs }}{{ (1, 2) | length }}", {"x": 3}),
    # Filters.
    ("{{ '  pad  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ [3, 1, 2] | sort "
     "| join(',') }}|{{ 'Hello World' | lower }}|{{ 'ab' | upper }}", {}),
    ("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='c') "
     "| join('+') }}|{{ ms | rejectattr('role', 'eq', 'user') | list | "
     "length }}|{{ ms | map(attribute='role') | unique | list }}",
     {"ms": [{"role": "user", "c": "a"}, {"role": "bot", "c": "b"},
             {"role": "user", "c": "c"}]}),
    ("{{ x | default('d') }}|{{ '' | default('e', true) }}|{{ none | "
     "default('f') }}", {}),
    ("{{ xs | first }}{{ xs | last }}{{ xs | reverse | list }}{{ xs | sum }}"
     "{{ xs | max }}{{ xs | min }}", {"xs": [4, 9, 2]}),
    ("{{ ['A', 'a', 1, 'b'] | unique | list }}|{{ ['A', 'a', 'B'] | "
     "unique(true) | list }}|{{ ms | unique(attribute='r') | map(attribute='c')"
     " | list }}", {"ms": [{"r": "x", "c": 1}, {"r": "X", "c": 2},
                          {"r": "y", "c": 3}]}),
    ("{{ 'a\nb\n\nc' | indent(2) }}|{{ 'x\ny' | indent(3, true) }}", {}),
    ("{{ '3.7' | float + 1 }}|{{ '12' | int * 2 }}|{{ 'q' | int }}|"
     "{{ 3.14159 | round(2) }}|{{ 'a&<b>' | e }}|{{ 'hi there' | title }}|"
     "{{ 'hELLO' | capitalize }}|{{ 'aXbX' | replace('X', '-') }}", {}),
    ("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ 'é\"\\n' | tojson }}|"
     "{{ [1.0, 2.5e-8, none, false] | tojson }}|{{ {} | tojson }}",
     {"d": {"b": [1, {"c": None}], "a": "ü"}}),
    ("{{ d | tojson(sort_keys=true) }}|{{ d | tojson(separators=(',', ':')) }}",
     {"d": {"b": 1, "a": 2}}),
    ("{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}",
     {"d": {"k": 1, "j": 2}}),
    # Tests.
    ("{{ x is defined }}{{ y is undefined }}{{ n is none }}{{ s is string }}"
     "{{ 3 is number }}{{ 3 is integer }}{{ 3.0 is float }}{{ d is mapping }}"
     "{{ xs is iterable }}{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}"
     "{{ f is false }}{{ 'A' is upper }}{{ xs is sequence }}",
     {"x": 1, "n": None, "s": "a", "d": {}, "xs": [1], "f": False}),
    ("{{ x is not none }}{{ x is sameas none }}{{ 2 is in [1, 2] }}"
     "{{ 3 is gt 2 }}{{ 'a' is eq 'a' }}", {"x": 1}),
    # String methods.
    ("{{ ' a b '.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}"
     "{{ 'a,b,c'.rsplit(',', 1) }}{{ 'x'.split('x') }}", {}),
    ("{{ '\\n\\nhi\\n'.strip() }}|{{ 'xxhix'.lstrip('x') }}|{{ 'hi\\n\\n'"
     ".rstrip('\\n') }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', "
     "'c')) }}|{{ 'aXa'.replace('a', 'b') }}|{{ 'abc'.upper() }}|"
     "{{ 'hello'.find('l') }}|{{ ','.join(['a', 'b']) }}|{{ 'a b'.title() }}",
     {}),
    ("{{ s[1:] }}|{{ s[::-1] }}|{{ s[-2:] }}|{{ s[:1] }}|{{ xs[1:] }}|"
     "{{ xs[::-1] }}|{{ xs[-1] }}|{{ s[0] }}|{{ s | length }}",
     {"s": "héllo", "xs": [1, 2, 3]}),
    ("{{ m.content.split('</think>')[-1].lstrip('\\n') }}",
     {"m": {"content": "<think>x</think>\n\nanswer"}}),
    ("{% for t in d.get('tools', []) %}{{ t }}{% endfor %}{{ d.get('x') }}"
     "{{ d.keys() | list }}{{ d.values() | list }}", {"d": {"a": 1}}),
    # Errors.
    ("{{ raise_exception('Roles must alternate') }}", {}),
    ("{{ x.y }}", {}),
    ("{{ d.missing + 'a' }}", {"d": {}}),
    ("{{ 1 + 'a' }}", {}),
    ("{% extends 'base.html' %}", {}),
    ("{% for x in xs %}", {"xs": []}),
    ("{{ x is hugetest }}", {"x": 1}),
    ("{% set n.a = 1 %}", {"n": 1}),
    ("{{ 1 / 0 }}", {}),
]


def render(source, variables):
    try:
        template = ctu._compile_jinja_template(source)
        return {"output": template.render(**variables)}
    except Exception as e:  # noqa: BLE001 - the message is the golden.
        return {"error": str(e), "error_type": type(e).__name__}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out",
        default=os.path.join(os.path.dirname(__file__), "..", "..", "tests",
                             "fixtures", "golden", "chat_templates",
                             "snippets.jsonl"))
    args = parser.parse_args()
    with open(args.out, "w", encoding="utf-8") as out:
        for source, variables in SNIPPETS:
            # Key order is kept: templates show it (tojson, items()).
            line = {"template": source, "variables": variables}
            line.update(render(source, variables))
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
    print(f"wrote {len(SNIPPETS)} snippets to {args.out}")


if __name__ == "__main__":
    main()
