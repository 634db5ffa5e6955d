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
    # dictsort.
    ("{{ d | dictsort }}|{{ d | dictsort(true) }}|{{ d | dictsort(by='value',"
     " reverse=true) }}", {"d": {"b": 1, "A": 2, "a": 3}}),
    ("{% for k, v in d | dictsort(false, 'value') %}{{ k }}={{ v }};"
     "{% endfor %}{{ {} | dictsort }}", {"d": {"x": "B", "y": "a", "z": "c"}}),
    ("{{ d | dictsort(by='x') }}", {"d": {"a": 1}}),
    ("{{ n | dictsort }}", {"n": None}),
    ("{{ u | dictsort }}", {}),
    ("{{ d | dictsort(by='value') }}", {"d": {"a": 1, "b": "x"}}),
    # Filters transformers' environment lacks (from_json): an error when
    # compiled, except inside {% if %} and inline ifs, where only running
    # them fails.
    ("{% if s is string %}{{ s | from_json }}{% endif %}ok", {"s": 1}),
    ("{% if s is string %}{{ s | from_json }}{% endif %}ok", {"s": "[1]"}),
    ("{{ s | from_json }}", {"s": "[1]"}),
    ("{% if s %}{% for x in s %}{{ x | from_json }}{% endfor %}{% endif %}",
     {"s": []}),
    ("{{ (s | from_json) if s is mapping else s }}", {"s": "k"}),
    ("{% if false %}{% set y = x | from_json %}{{ x is hugetest }}"
     "{% endif %}ok", {}),
    # Python string formatting: str.format, % and the format filter.
    ("{{ '{} and {}'.format(1, 'x') }}|{{ '{1}{0}{1}'.format('a', 'b') }}|"
     "{{ '{name}!'.format(name='n') }}|{{ '{0[k]} {1[1]} {0.k}'.format(d, xs)"
     " }}", {"d": {"k": "v"}, "xs": [1, 2]}),
    ("{{ '{:d}|{:.2f}|{:>5}|{:<5}|{:^5}|{:05d}|{:+d}|{:,}|{:x}|{:#x}|{:e}|"
     "{:g}|{:%}|{:.1%}'.format(42, 3.14159, 'ab', 'ab', 'ab', 42, 3, 1234567,"
     " 255, 255, 12345.678, 0.00001, 0.25, 0.5) }}", {}),
    ("{{ '{0!r} {0!s} {{x}} {0:*^7}'.format('hi') }}|{{ '{}'.format(1.0) }}|"
     "{{ '{}'.format(none) }}|{{ '{}'.format([1, 'a']) }}|"
     "{{ '{:.3}'.format(3.14159) }}|{{ '{:.3}'.format(3.0) }}|"
     "{{ '{:10.3f}|'.format(-2.5) }}{{ '{:>8.2%}'.format(0.5) }}|"
     "{{ '{:.2}'.format('abc') }}|{{ '{:5}|{:5}'.format(1, true) }}|"
     "{{ '{:,.2f}'.format(1234567.891) }}|{{ '{:=+6d}'.format(7) }}", {}),
    ("{{ '{}'.format() }}", {}),
    ("{{ '{0} {}'.format(1, 2) }}", {}),
    ("{{ '{:d}'.format('a') }}", {}),
    ("{{ '{:s}'.format(1.5) }}", {}),
    ("{{ '{x}'.format(y=1) }}", {}),
    ("{{ '{'.format(1) }}", {}),
    ("{{ '{}'.format(u.v) }}", {}),
    ("{{ '%s|%d|%.2f|%r|%5s|%-5s|%x|%05.1f|%%|%i|%e|%g|%+d|%.1s' % ('a', 42,"
     " 3.14159, 'b', 'c', 'd', 255, 2.25, 7, 12345.678, 0.5, 3, 'xyz') }}", {}),
    ("{{ '%s!' % 'x' }}|{{ '%s' % [1, 2] }}|{{ '%s' % ((1, 2),) }}|"
     "{{ '%d' % 3.9 }}|{{ '%s' % none }}|{{ '%(a)s-%(b)d' % {'a': 'x', 'b': 2}"
     " }}|{{ '%s' % {'a': 1} }}|{{ 'abc' % () }}|{{ 'abc' % {} }}|"
     "{{ '%c%o%X%5.2s|%.0f|%.0f' % (65, 8, 255, 'abc', 0.5, 1.5) }}|"
     "{{ 'n=%s' % u }}", {}),
    ("{{ '%s %s' % 'x' }}", {}),
    ("{{ '%s' % (1, 2) }}", {}),
    ("{{ '%d' % 'x' }}", {}),
    ("{{ '%s' % () }}", {}),
    ("{{ 'abc' % 1 }}", {}),
    ("{{ '%(a)s' % 1 }}", {}),
    ("{{ '%q' % 1 }}", {}),
    ("{{ 5 % 'a' }}", {}),
    ("{{ '%s and %s' | format('a', 'b') }}|{{ '%(x)s' | format(x=1) }}|"
     "{{ '%.1f' | format(2.25) }}|{{ 'plain' | format }}|"
     "{{ '%s' | format([1]) }}", {}),
    ("{{ '%s' | format }}", {}),
    ("{{ '%s %s' | format('a', x=1) }}", {}),
    # Tuples.
    ("{{ (1, 2) }}{{ (1,) }}{{ () }}{{ (1, 2) == [1, 2] }}{{ (1, 2) == (1, 2)"
     " }}{{ (1, 2) + (3,) }}{{ (1, 2) * 2 }}{{ ('a', 'b')[1] }}{{ (1, 2, 3)[1:]"
     " }}{{ 2 in (1, 2) }}{{ (1, 2) | length }}", {}),
    ("{% for a, b in [(1, 'x'), (2, 'y')] %}{{ a }}{{ b }}{% endfor %}"
     "{% for x in ('p', 'q') %}{{ x }}{% endfor %}{% set t = 1, 'z' %}{{ t }}"
     "{% set a, b = t %}{{ b }}{{ d.items() | list }}{{ d | items | list }}"
     "{{ (1, 2) | list }}{{ (3, 1) | sort }}{{ ((1, 2), 'x') | tojson }}",
     {"d": {"k": 1}}),
    ("{{ (1, 2) + [3] }}", {}),
    ("{{ [3] + (1, 2) }}", {}),
    ("{% for a, b in [(1, 2, 3)] %}{% endfor %}", {}),
    # Call blocks and filter blocks.
    ("{% macro w(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}"
     "{% call w('b') %}hi {{ d.b }}{% endcall %}", {"d": {"b": 1}}),
    ("{% macro rows(items) %}{% for i in items %}[{{ caller(i, loop.index) }}]"
     "{% endfor %}{% endmacro %}{% set k = 10 %}{% call(x, n) rows([1, 2]) %}"
     "{{ n }}:{{ x * k }}{% endcall %}", {}),
    ("{% macro m() %}{{ caller(3) }}|{{ caller() }}{% endmacro %}"
     "{% call(x='d') m() %}{{ x }}{% endcall %}", {}),
    ("{% macro m() %}{{ caller is defined }}{% endmacro %}{{ m() }}", {}),
    ("{% macro m() %}plain{% endmacro %}{% call m() %}body{% endcall %}", {}),
    ("{% macro m() %}{{ caller() }}{% endmacro %}{{ m() }}", {}),
    ("{% call(x) m2() %}{% endcall %}", {}),
    ("{% filter upper %}hello {{ d.b }}{% endfilter %}", {"d": {"b": 1}}),
    ("{% filter indent(2, true) | upper %}a\nb{% endfilter %}|"
     "{% filter replace('x', 'y') %}{% for i in range(2) %}x{{ i }}"
     "{% endfor %}{% endfilter %}|{% filter trim %}  {% set q = 1 %}"
     "{{ q }}  {% endfilter %}{{ q }}", {}),
    ("{% filter hugefilter %}x{% endfilter %}", {}),
    # Recursive loops.
    ("{% for x in t recursive %}{{ loop.depth }}{{ loop.depth0 }}{{ x.n }}"
     "{% if x.c %}({{ loop(x.c) }}){% endif %}{% endfor %}",
     {"t": [{"n": "a", "c": [{"n": "b", "c": [{"n": "c"}]}]}, {"n": "d"}]}),
    ("{% for x in [[1, [2]], 3] recursive %}{% if x is iterable %}"
     "{{ loop(x) }}{% else %}{{ x }}@{{ loop.depth }}/{{ loop.index }};"
     "{% endif %}{% endfor %}", {}),
    ("{% for x in [[], 1, [5, 6]] if x != 5 recursive %}{% if x is iterable %}"
     "<{{ loop(x) }}>{% else %}{{ x }}{% endif %}{% else %}E{% endfor %}", {}),
    ("{% for x in [1] %}{{ loop(x) }}{% endfor %}", {}),
    # Chained comparisons.
    ("{{ 1 < 2 < 3 }}{{ 1 < 3 < 2 }}{{ 1 == 1 == 1 }}{{ 2 > 1 == 1 }}"
     "{{ 1 < 2 <= 2 != 3 }}{{ 'a' in 'abc' in ['abc'] }}{{ 0 < x < 10 }}"
     "{{ not 1 < 2 < 0 }}", {"x": 5}),
    ("{{ 3 < 1 < 'a' }}", {}),
    ("{{ 1 < 'a' < 3 }}", {}),
    # select / reject / map over undefined, none, empty and falsy operands.
    ("{{ n | selectattr('a') | list }}{{ n | rejectattr('a', 'none') | list }}"
     "{{ n | map(attribute='a') | list }}{{ n | select | list }}"
     "{{ n | reject | list }}", {"n": None}),
    ("{{ u | selectattr('a') | list }}{{ u | map(attribute='a') | list }}"
     "{{ u | select | list }}{{ u | reject('none') | list }}"
     "{{ '' | select | list }}{{ 0 | map('upper') | list }}", {}),
    ("{{ xs | selectattr('a') | list }}{{ xs | map(attribute='a') | list }}"
     "{{ xs | map(attribute='a', default=5) | list }}"
     "{{ xs | rejectattr('a') | map(attribute='b') | join(',') }}",
     {"xs": [{"a": 1}, {"a": 0}, {"b": 2}]}),
    ("{{ 5 | select | list }}", {}),
    ("{{ d.x | selectattr('a') | list }}", {}),
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
    # Generators: map, select, reject, selectattr and rejectattr return
    # them; true even when empty, no length, not JSON serializable.
    ("{{ xs | map(attribute='a') | tojson }}", {"xs": [{"a": 1}]}),
    ("{{ xs | map(attribute='a') | list | tojson }}", {"xs": [{"a": 1}]}),
    ("{% if xs | select('none') %}yes{% else %}no{% endif %}", {"xs": [1, 2]}),
    ("{% if xs | select('none') | list %}yes{% else %}no{% endif %}", {"xs": [1, 2]}),
    ("{{ xs | select('odd') | length }}", {"xs": [1, 2, 3]}),
    ("{{ xs | select('odd') | join(',') }}", {"xs": [1, 2, 3]}),
    ("{{ xs | select('odd') | last }}", {"xs": [1, 2, 3]}),
    ("{{ xs | select('odd') | first }}", {"xs": [1, 2, 3]}),
    ("[{{ (xs | select('odd'))[0] }}]", {"xs": [1, 2, 3]}),
    # Markup: safe and escape make it; + with a plain string escapes that.
    ("{{ 'a<b'|safe + '<c>' }}", {}),
    ("{{ '<c>' + 'a&b'|safe }}", {}),
    ("{{ 'x'|safe ~ '<y>' }}", {}),
    ("{{ ('<i>'|e) + '\"q\"' }}", {}),
    ("{{ \"it's\"|safe + \"<it's>\" }}", {}),
    # Dict keys that are not strings: None, booleans, ints and floats, equal
    # as Python hashes them (1 == 1.0 == True: the first key stays, the last
    # value wins); tojson writes them as json.dumps does.
    ("{% set d = {1: 'a', 2: 'b'} %}{{ d[1] }}{{ d.get(2) }}[{{ d['1'] }}]"
     "{{ d | length }}{{ d.get(3, 'none') }}", {}),
    ("{{ {1: 'a', true: 'b', 1.0: 'c', none: 'n', 2.5: 'f', 'x': 0} }}", {}),
    ("{{ {0: 'zero', false: 'f', 0.0: 'z'} }}{{ {none: 1}[none] }}", {}),
    ("{% for k, v in {2: 'x', 1: 'y', 'a': 'z'}.items() %}{{ k }}={{ v }}:"
     "{{ k is string }};{% endfor %}", {}),
    ("{% for k in {1: 'a', 2: 'b'} %}{{ k + 1 }}{% endfor %}"
     "{{ {3: 'c', 1: 'a'}.keys() | list }}{{ {3: 'c'} | items | list }}", {}),
    ("{{ {3: 'c', 1: 'a', 2: 'b'} | dictsort }}"
     "{{ {3: 'c', 1: 'a', 2: 'b'} | dictsort(reverse=true) }}", {}),
    ("{{ {1: 'a', 'b': 2} | dictsort }}", {}),
    ("{{ {1: 'a', none: 'b', true: 'c', 2.5: 'd', false: 'e'} | tojson }}",
     {}),
    ("{{ {10: 'a', 2: 'b', -1: 'c'} | tojson(sort_keys=true) }}", {}),
    ("{{ 1 in {1: 'a'} }}{{ '1' in {1: 'a'} }}{{ 1.0 in {1: 'a'} }}"
     "{{ true in {1: 'a'} }}{{ none in {none: 0} }}", {}),
    ("{{ {1: 'a'} == {1.0: 'a'} }}{{ {1: 'a'} == {'1': 'a'} }}", {}),
    ("{% set m = {'user': 1, 'assistant': 2} %}{% set r = {1: 'U', 2: 'A'} %}"
     "{{ r[m['assistant']] }}{{ r[m.user] }}", {}),
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
